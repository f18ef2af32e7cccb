//! The end of an invocation: the closing sample of a finished run, and the summary.

use burn::module::Module;
use relation_model::{RelationLm, Sampling};

use super::{TrainSummary, Trainer};
use crate::Result;
use crate::data;

impl Trainer<'_> {
    /// Ends this invocation: draws the closing sample if the run is finished and returns what
    /// the invocation did.
    ///
    /// # Errors
    /// A model or tokenizer error while sampling.
    pub(super) fn finish(self, model: &RelationLm) -> Result<TrainSummary> {
        // The invocation's throughput leaves the closing sample out.
        let secs = self.started.elapsed().as_secs_f64();
        let t = &self.run.t;
        let sample = if self.progress.step >= t.steps && t.sample_tokens > 0 {
            Some(sample_after_training(
                &model.valid(),
                &self.run.tokenizer,
                &self.run.corpus.val,
                t.sample_tokens,
                t.seed,
            )?)
        } else {
            None
        };
        let validation = self.validation;
        Ok(self.summary(secs, validation, sample))
    }

    /// What a rank other than 0 did (it draws no sample and validates nothing).
    pub(super) fn follower_summary(self) -> TrainSummary {
        let secs = self.started.elapsed().as_secs_f64();
        self.summary(secs, None, None)
    }

    /// What this invocation did in `secs` of training, with its last validation result and
    /// closing sample.
    fn summary(
        self,
        secs: f64,
        validation: Option<crate::evaluate::EvalResult>,
        sample: Option<(String, String)>,
    ) -> TrainSummary {
        let p = self.progress;
        TrainSummary {
            run_dir: self.run.opts.run_dir.clone(),
            step: p.step,
            finished: p.step >= self.run.t.steps,
            tokens_seen: p.tokens_seen,
            tokens_per_s: (p.tokens_seen - self.tokens_at_start) as f64 / secs.max(1e-9),
            validation,
            sample,
            checkpoint: p.checkpoint_dir,
            params: self.size.params,
            flops_per_token: self.size.flops_per_token,
            peak_rss_mib: crate::metrics::peak_rss_mib(),
            comm_seconds: self.comm_seconds,
            step_seconds: self.step_seconds,
        }
    }
}

/// A short continuation of the first words of the validation text.
fn sample_after_training(
    model: &RelationLm,
    tokenizer: &tokenizers::Tokenizer,
    val: &[u32],
    tokens: usize,
    seed: u64,
) -> Result<(String, String)> {
    let prompt: Vec<u32> = val.iter().copied().take(12).collect();
    let sampling = Sampling {
        max_new_tokens: tokens,
        temperature: 0.8,
        top_k: Some(40),
        top_p: Some(0.95),
        seed,
        stop_tokens: tokenizer.token_to_id(data::EOT).into_iter().collect(),
    };
    let out = model.generate(std::slice::from_ref(&prompt), &sampling)?;
    Ok((
        data::decode(tokenizer, &prompt)?,
        data::decode(tokenizer, &out[0])?,
    ))
}
