//! Resume: the checkpoint a run continues from, the weights and position it restores, and the
//! optimizer (whose state a resume restores too).

use burn::optim::ModuleOptimizer;
use relation_model::RelationLm;

use super::Progress;
use super::run_dir::record_changes;
use super::setup::Run;
use super::share;
use crate::checkpoint;
use crate::config::Change;
use crate::optim::adamw;
use crate::precision::Precision;
use crate::{Result, TrainError};

impl Run<'_> {
    /// Continues from the checkpoint [`checkpoint::resume_point`] chooses (the latest that
    /// verifies, or `--from-checkpoint`): loads its weights into `model` and returns where the
    /// run is; records the configuration `changes` the resume brings. Says through `log` which
    /// checkpoint it continues from (and any it skipped or set aside) and each change.
    ///
    /// # Errors
    /// No checkpoint that verifies, one made with another seed, weights that do not decode.
    pub(super) fn resume(
        &self,
        model: RelationLm,
        changes: &[Change],
        log: &mut dyn FnMut(String),
    ) -> Result<(RelationLm, Progress)> {
        let run = &self.opts.run_dir;
        let ranks = &*self.opts.ranks;
        // Rank 0 picks the checkpoint and sends it to the other ranks, which verify their copy.
        let mut received = None;
        let (dir, state) = if ranks.is_root() {
            let (dir, state) = checkpoint::resume_point(
                run,
                self.opts.from_checkpoint.as_deref(),
                &self.model_json,
                &self.corpus.tokenizer_json,
                log,
            )?;
            if ranks.size() > 1 {
                share::send_checkpoint(ranks, &dir)?;
            }
            (dir, state)
        } else {
            let copy = share::receive_checkpoint(ranks)?;
            let dir = copy.0.clone();
            received = Some(copy);
            let state = checkpoint::verify(&dir, &self.model_json, &self.corpus.tokenizer_json)?;
            (dir, state)
        };
        if state.seed != self.t.seed {
            return Err(TrainError::Checkpoint {
                path: dir,
                reason: format!(
                    "seed {} differs from the run's seed {}",
                    state.seed, self.t.seed
                ),
            });
        }
        let model = checkpoint::load_model(&dir, model)?;
        let progress = Progress {
            step: state.step,
            tokens_seen: state.tokens_seen,
            position: state.position,
            elapsed_before: state.elapsed_s,
            skipped: state.skipped_steps,
            // The saved f16 scale, unless this resume changed the precision.
            loss_scale: state
                .loss_scale
                .filter(|_| self.t.precision == Precision::F16)
                .unwrap_or_else(|| self.t.precision.initial_scale()),
            last_checkpoint: dir.display().to_string(),
            checkpoint_dir: dir,
            _received: received,
        };
        let step = progress.step;
        log(format!(
            "resume: {} (step {step})",
            progress.checkpoint_dir.display()
        ));
        tracing::info!(
            checkpoint = %progress.checkpoint_dir.display(),
            step,
            tokens_seen = progress.tokens_seen,
            epoch = progress.position.epoch,
            window = progress.position.index,
            changed_settings = changes.len(),
            "resuming"
        );
        if !changes.is_empty() && ranks.is_root() {
            record_changes(run, step, changes, &self.config, log)?;
        }
        Ok((model, progress))
    }

    /// AdamW for `model`, with the checkpoint's state on resume.
    ///
    /// # Errors
    /// An optimizer state that does not decode.
    pub(super) fn optimizer(
        &self,
        model: &RelationLm,
        progress: &Progress,
    ) -> Result<ModuleOptimizer> {
        // Built after any resume: the loaded weights carry the saved parameter ids, which the
        // weight-decay groups and the optimizer state are keyed by.
        let optim = adamw(model, &self.t)?;
        if self.resume {
            return checkpoint::load_optim(&progress.checkpoint_dir, optim);
        }
        Ok(optim)
    }
}
