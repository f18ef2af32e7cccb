//! Checkpoints at the checkpoint cadence (and at the invocation's last step), each followed by
//! a fresh loss curve.

use relation_model::RelationLm;

use super::Trainer;
use crate::Result;
use crate::checkpoint::{self, CheckpointState, fingerprint};
use crate::precision::Precision;

impl Trainer<'_> {
    /// Whether the step just done ends with a checkpoint: every `checkpoint_every` steps and at
    /// the last step of this invocation, so a stopped run resumes exactly where it stopped.
    pub(super) fn checkpoint_due(&self) -> bool {
        let step = self.progress.step;
        step.is_multiple_of(self.run.t.checkpoint_every) || step == self.end
    }

    /// Saves `model`, the optimizer and the run's position as a checkpoint (atomic and
    /// verified, see [`checkpoint::save`]), then redraws `loss.png`; a curve that cannot be
    /// drawn is reported, not fatal.
    ///
    /// # Errors
    /// The checkpoint could not be written (the previous one stays the latest).
    pub(super) fn checkpoint(&mut self, model: &RelationLm) -> Result<()> {
        let run = &self.run;
        let state = CheckpointState {
            format: checkpoint::FORMAT,
            step: self.progress.step,
            tokens_seen: self.progress.tokens_seen,
            position: self.batcher.position(),
            seed: run.t.seed,
            model_fingerprint: fingerprint(&run.model_json),
            tokenizer_fingerprint: fingerprint(&run.corpus.tokenizer_json),
            elapsed_s: self.progress.elapsed_before + self.started.elapsed().as_secs_f64(),
            files: Default::default(),
            skipped_steps: self.progress.skipped,
            loss_scale: (run.t.precision == Precision::F16).then_some(self.progress.loss_scale),
        };
        let dir = checkpoint::save_or_crash(
            &run.opts.run_dir,
            model,
            &self.optim,
            state,
            run.t.keep_checkpoints,
            run.opts.faults().crash_during_save,
        )?;
        self.progress.last_checkpoint = dir.display().to_string();
        self.progress.checkpoint_dir = dir;
        let title = format!(
            "{} on {}",
            run.model_config.pattern,
            run.device_names.join(" + ")
        );
        if let Err(why) = self.metrics.plot(&title) {
            self.say(&format!("loss curve not drawn: {why}"));
        }
        Ok(())
    }
}
