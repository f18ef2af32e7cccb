//! After each step: its metrics row, the validation at the evaluation cadence, the log line at
//! the log cadence, and the progress event.

use burn::module::Module;
use relation_model::RelationLm;

use super::step::StepDone;
use super::{TrainEvent, Trainer};
use crate::Result;
use crate::evaluate::{EvalOptions, evaluate};
use crate::metrics::Row;

impl Trainer<'_> {
    /// Records the step just done: evaluates `model` when due, reports the log line when due
    /// and the progress, and appends the metrics row.
    ///
    /// # Errors
    /// A model error while evaluating; a metrics log that cannot be written.
    pub(super) fn record(&mut self, model: &RelationLm, done: &StepDone) -> Result<()> {
        let (step, tokens_seen) = (self.progress.step, self.progress.tokens_seen);
        let t = &self.run.t;
        let StepDone {
            lr,
            loss,
            grad_norm,
            seconds,
        } = *done;
        let mut row = Row {
            step,
            tokens: tokens_seen,
            lr,
            loss,
            grad_norm,
            tokens_per_s: t.effective_tokens_per_step() as f64 / seconds,
            elapsed_s: self.progress.elapsed_before + self.started.elapsed().as_secs_f64(),
            val_loss: None,
            val_ppl: None,
            val_bpb: None,
            peak_rss_mib: None,
            model_gflop_per_s: None,
        };
        let rate = row.tokens_per_s * self.size.flops_per_token / 1e9;
        row.model_gflop_per_s = Some(rate);
        if step.is_multiple_of(t.eval_every) || step == t.steps {
            self.evaluate(model, &mut row)?;
        }
        // After the evaluation, so that its activations count too.
        row.peak_rss_mib = crate::metrics::peak_rss_mib();
        if step.is_multiple_of(self.run.t.log_every) || step == self.end {
            self.say(&format!(
                "step {step:>6} | loss {loss:.4} | lr {lr:.2e} | grad norm {grad_norm:.3} | {:.0} tok/s | {rate:.1} GFLOP/s | {} tokens",
                row.tokens_per_s, tokens_seen
            ));
        }
        let status = format!(
            "loss {loss:.3} | lr {lr:.1e} | {:.0} tok/s",
            row.tokens_per_s
        );
        (self.on_event)(TrainEvent::Progress {
            step,
            steps: self.run.t.steps,
            status: &status,
        });
        self.metrics.push(row)
    }

    /// Validation loss, perplexity and bits per byte of `model` on the validation split (up
    /// to `eval_tokens`), into `row` and the log.
    ///
    /// # Errors
    /// A model error.
    fn evaluate(&mut self, model: &RelationLm, row: &mut Row) -> Result<()> {
        let t = &self.run.t;
        let opts = EvalOptions {
            seq_len: t.seq_len,
            batch_size: t.batch_size,
            max_tokens: t.eval_tokens,
            bytes_per_token: self.val_bytes_per_token,
            document_marker: self.run.document_marker,
        };
        let result = evaluate(&model.valid(), &self.run.corpus.val, &opts)?;
        row.val_loss = Some(result.loss);
        row.val_ppl = Some(result.perplexity);
        row.val_bpb = Some(result.bits_per_byte);
        self.say(&format!(
            "step {:>6} | validation loss {:.4} | ppl {:.2} | {:.3} bits/byte ({} tokens)",
            self.progress.step, result.loss, result.perplexity, result.bits_per_byte, result.tokens
        ));
        self.validation = Some(result);
        Ok(())
    }
}
