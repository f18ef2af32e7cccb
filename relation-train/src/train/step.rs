//! One optimisation step: the step's micro-batches (spread over the devices when there are
//! several), their gradients accumulated in order, one read-back of the loss and gradient norm,
//! and the update, or the handling of a non-finite step.

use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};
use relation_model::RelationLm;

use super::{OnNan, Trainer};
use crate::config::TrainSpec;
use crate::optim::{clip_global_norm, scale_grads, squared_grad_norm, token_nll, wsd_lr};
use crate::precision::Precision;
use crate::{Result, TrainError};

/// What one step did, for its metrics row and log lines.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepDone {
    /// The learning rate it used.
    pub(super) lr: f64,
    /// Its mean training loss (NaN for a poisoned or skipped step).
    pub(super) loss: f64,
    /// The global gradient norm before clipping.
    pub(super) grad_norm: f64,
    /// Its wall time, seconds.
    pub(super) seconds: f64,
}

impl Trainer<'_> {
    /// Runs step `progress.step + 1` on `model` and returns the updated model (unchanged if
    /// the step was skipped).
    ///
    /// # Errors
    /// A model error, or a non-finite loss or gradient norm ([`TrainError::NonFinite`], or
    /// [`TrainError::SkipLimit`] with [`OnNan::Skip`]).
    pub(super) fn step(&mut self, mut model: RelationLm) -> Result<(RelationLm, StepDone)> {
        self.progress.step += 1;
        let step = self.progress.step;
        let t = &self.run.t;
        let accumulation = t.accumulation();
        let per_step = t.effective_tokens_per_step() as u64;
        let grad_clip = t.grad_clip;
        let precision = t.precision;
        // With f16, the loss is scaled before the backward pass and the gradients unscaled after.
        let scale = self.progress.loss_scale.scale;
        let step_start = Instant::now();
        let lr = wsd_lr(step, t);
        let mut accumulator = GradientsAccumulator::<RelationLm>::new();
        let mut losses = Vec::with_capacity(accumulation);
        let batches: Vec<Batch> = (0..accumulation)
            .map(|_| {
                self.batcher
                    .next_batch(&self.run.corpus.train, t.batch_size)
            })
            .collect();
        // Accumulated in micro-batch order whatever device computed them, so the sum (and the
        // run) is the same as on one device.
        for result in micro_steps(&model, &self.run.replicas, batches, t, accumulation, scale)? {
            let (loss, grads) = result;
            losses.push(loss);
            accumulator.accumulate(&model, grads);
        }
        let mut grads = accumulator.grads();
        if scale != 1.0 {
            scale_grads(&model, &mut grads, 1.0 / scale);
        }
        // One read-back per step: the step's loss and the squared gradient norm together.
        let loss_sum = Tensor::cat(losses, 0).sum(); // [1]
        let norm_sq = squared_grad_norm(&model, &grads).unwrap_or_else(|| loss_sum.zeros_like());
        let read: Vec<f32> = Tensor::cat(vec![loss_sum, norm_sq], 0)
            .into_data()
            .iter::<f32>()
            .collect(); // [loss, |g|^2]
        let mut loss = read[0] as f64;
        if self.poison_steps.contains(&step) {
            loss = f64::NAN;
        }
        let grad_norm = (read[1] as f64).sqrt();
        let not_finite = [("loss", loss), ("gradient norm", grad_norm)]
            .into_iter()
            .find(|(_, v)| !v.is_finite());
        let overflow = matches!(not_finite, Some(("gradient norm", _)));
        let rescaled = if overflow {
            self.progress.loss_scale.after_overflow(precision)
        } else {
            None
        };
        if let Some(new_scale) = rescaled {
            // f16 gradients overflowed at this loss scale: not a divergence. The update is
            // skipped, and the step's data consumed, as with every skipped step.
            tracing::info!(
                step,
                scale = new_scale,
                "f16 gradients overflowed; loss scale halved"
            );
            self.say(format!(
                "step {step:>6} | f16 gradients overflowed: update skipped, loss scale {scale} -> {new_scale}"
            ));
        } else if let Some((what, value)) = not_finite {
            self.skip(what, value)?;
        } else {
            clip_global_norm(&model, &mut grads, grad_norm, grad_clip);
            model = self.optim.step(lr, model, grads);
            if let Some(new_scale) = self.progress.loss_scale.after_finite(precision) {
                tracing::info!(step, scale = new_scale, "loss scale doubled");
            }
        }
        self.progress.tokens_seen += per_step;
        let seconds = step_start.elapsed().as_secs_f64();
        Ok((
            model,
            StepDone {
                lr,
                loss,
                grad_norm,
                seconds,
            },
        ))
    }

    /// A step whose `what` is `value`, not finite: stops the run, or (with [`OnNan::Skip`],
    /// under the limit) counts it as skipped — its data is consumed and its row logged (loss
    /// NaN), but the weights and the optimizer state stay as they were.
    ///
    /// # Errors
    /// [`TrainError::NonFinite`], or [`TrainError::SkipLimit`] past the limit.
    fn skip(&mut self, what: &'static str, value: f64) -> Result<()> {
        let step = self.progress.step;
        let opts = self.run.opts;
        if opts.on_nan == OnNan::Stop {
            self.bar.abandon();
            return Err(TrainError::NonFinite {
                step,
                what,
                value,
                last_good: self.progress.last_checkpoint.clone(),
            });
        }
        if self.progress.skipped >= opts.max_skipped_steps {
            self.bar.abandon();
            return Err(TrainError::SkipLimit {
                step,
                limit: opts.max_skipped_steps,
                last_good: self.progress.last_checkpoint.clone(),
            });
        }
        self.progress.skipped += 1;
        tracing::warn!(step, what, value, "non-finite step skipped");
        self.say(format!(
            "step {step:>6} | {what} is {value}: update skipped ({} of at most {} skips)",
            self.progress.skipped, opts.max_skipped_steps
        ));
        Ok(())
    }
}

/// One micro-batch: inputs and targets, `[B, T]` row-major.
type Batch = (Vec<i64>, Vec<i64>);

/// Forward and backward of one micro-batch on `model`'s device; the loss (detached) and the
/// gradients are returned on `primary`.
fn micro_step(
    model: &RelationLm,
    device: &Device,
    primary: &Device,
    (x, y): Batch,
    t: &TrainSpec,
    accumulation: usize,
    scale: f64,
) -> Result<(Tensor<1>, GradientsParams)> {
    let x = Tensor::<2, Int>::from_data(TensorData::new(x, [t.batch_size, t.seq_len]), device);
    let y = Tensor::<2, Int>::from_data(TensorData::new(y, [t.batch_size, t.seq_len]), device);
    let logits = match t.precision {
        Precision::F32 => model.forward(x)?, // [B, T, V]
        // Mixed precision: the forward and backward in the half-precision copy, the loss in
        // f32; the gradients flow back through the casts onto the f32 masters.
        half => model
            .cast_params(half.dtype())
            .forward(x)?
            .cast(FloatDType::F32), // [B, T, V]
    };
    // Mean over this micro-batch, divided by the number of micro-batches: the accumulated
    // gradient is the gradient of the step's mean loss.
    let loss = token_nll(logits, y)?.mean().div_scalar(accumulation as f64); // [1]
    let value = loss.clone().detach();
    let scaled = if scale != 1.0 {
        loss.mul_scalar(scale)
    } else {
        loss
    };
    let grads = GradientsParams::from_grads(scaled.backward(), model);
    if device == primary {
        Ok((value, grads))
    } else {
        Ok((value.to_device(primary), grads.to_device(primary, model)))
    }
}

/// The micro-batches of one optimizer step, in order. With several devices (data parallel),
/// micro-batch `i` runs on replica `i mod n` — a copy of the model forked onto that device —
/// all replicas at once on their own threads; gradients come back to the first device.
fn micro_steps(
    model: &RelationLm,
    replicas: &[Device],
    batches: Vec<Batch>,
    t: &TrainSpec,
    accumulation: usize,
    scale: f64,
) -> Result<Vec<(Tensor<1>, GradientsParams)>> {
    let primary = &replicas[0];
    let n = replicas.len().min(batches.len());
    if n <= 1 {
        return batches
            .into_iter()
            .map(|b| micro_step(model, primary, primary, b, t, accumulation, scale))
            .collect();
    }
    let copies: Vec<RelationLm> = (0..n)
        .map(|r| {
            if r == 0 {
                model.clone()
            } else {
                model.clone().fork(&replicas[r])
            }
        })
        .collect();
    let mut assigned: Vec<Vec<(usize, Batch)>> = vec![Vec::new(); n];
    for (i, b) in batches.into_iter().enumerate() {
        assigned[i % n].push((i, b));
    }
    let mut done: Vec<(usize, Result<(Tensor<1>, GradientsParams)>)> = std::thread::scope(|s| {
        let workers: Vec<_> = copies
            .iter()
            .zip(replicas)
            .zip(assigned)
            .map(|((copy, device), mine)| {
                s.spawn(move || {
                    mine.into_iter()
                        .map(|(i, b)| {
                            let done = micro_step(copy, device, primary, b, t, accumulation, scale);
                            (i, done)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a data-parallel worker panicked"))
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}
