//! One optimisation step: the step's micro-batches (spread over the devices when there are
//! several), their gradients summed (in order, or by Burn's collective across devices), one
//! read-back of the loss and gradient norm, and the update, or the handling of a non-finite
//! step.

use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};
use relation_core::Segments;
use relation_model::{CheckpointedStep, RelationLm};

use super::collective::{Meeting, Reduction, all_reduce_grads};
use super::exchange::{all_losses, sum_across_ranks};
use super::{OnNan, Trainer};
use crate::config::TrainSpec;
use crate::data::document_segments;
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
        let faults = self.run.opts.faults();
        if faults.panic_at == Some((self.run.opts.ranks.rank(), step)) {
            panic!(
                "injected fault: rank {} panics at step {step}",
                self.run.opts.ranks.rank()
            );
        }
        let t = &self.run.t;
        let accumulation = t.accumulation();
        let per_step = t.effective_tokens_per_step() as u64;
        let grad_clip = t.grad_clip;
        let precision = t.precision;
        // With f16, the loss is scaled before the backward pass and the gradients unscaled after.
        let scale = self.progress.loss_scale.scale;
        let step_start = Instant::now();
        let lr = wsd_lr(step, t);
        let marker = self.run.document_marker;
        let ranks = &*self.run.opts.ranks;
        // Every rank draws the step's micro-batches in the same order and keeps its share.
        let batches: Vec<(usize, Batch)> = (0..accumulation)
            .map(|_| {
                let (inputs, targets) = self
                    .batcher
                    .next_batch(&self.run.corpus.train, t.batch_size);
                let documents = marker.map(|eot| document_segments(&inputs, t.seq_len, eot));
                Batch {
                    inputs,
                    targets,
                    documents,
                }
            })
            .enumerate()
            .filter(|(i, _)| ranks.owns(*i))
            .collect();
        let (losses, mut grads) = micro_steps(
            &model,
            &self.run.replicas,
            &self.run.reduction,
            batches,
            t,
            scale,
        )?;
        let loss_sum = if ranks.size() > 1 {
            // The ranks' losses and gradient sums, added across ranks (host-staged).
            let exchange = Instant::now();
            let losses = all_losses(ranks, losses, accumulation, &self.run.replicas[0]);
            sum_across_ranks(ranks, &model, &mut grads)?;
            self.comm_seconds += exchange.elapsed().as_secs_f64();
            losses
        } else {
            Tensor::cat(losses, 0)
        }
        .sum(); // [1]
        if scale != 1.0 {
            scale_grads(&model, &mut grads, 1.0 / scale);
        }
        // One read-back per step: the step's loss and the squared gradient norm together.
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
            self.say(&format!(
                "step {step:>6} | f16 gradients overflowed: update skipped, loss scale {scale} -> {new_scale}"
            ));
        } else if let Some((what, value)) = not_finite {
            self.skip(what, value)?;
        } else {
            let update = std::time::Instant::now();
            clip_global_norm(&model, &mut grads, grad_norm, grad_clip);
            model = self.optim.step(lr, model, grads);
            tracing::debug!(
                step,
                update_ms = update.elapsed().as_secs_f64() * 1e3,
                "clip and optimizer"
            );
            if let Some(new_scale) = self.progress.loss_scale.after_finite(precision) {
                tracing::info!(step, scale = new_scale, "loss scale doubled");
            }
        }
        self.progress.tokens_seen += per_step;
        if faults.step_delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(faults.step_delay_ms));
        }
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
            return Err(TrainError::NonFinite {
                step,
                what,
                value,
                last_good: self.progress.last_checkpoint.clone(),
            });
        }
        if self.progress.skipped >= opts.max_skipped_steps {
            return Err(TrainError::SkipLimit {
                step,
                limit: opts.max_skipped_steps,
                last_good: self.progress.last_checkpoint.clone(),
            });
        }
        self.progress.skipped += 1;
        tracing::warn!(step, what, value, "non-finite step skipped");
        self.say(&format!(
            "step {step:>6} | {what} is {value}: update skipped ({} of at most {} skips)",
            self.progress.skipped, opts.max_skipped_steps
        ));
        Ok(())
    }
}

/// One micro-batch.
#[derive(Clone)]
struct Batch {
    /// Input tokens, `[B, T]` row-major.
    inputs: Vec<i64>,
    /// Target tokens (the inputs shifted by one), `[B, T]` row-major.
    targets: Vec<i64>,
    /// Under `--packing documents`: the `cu_seqlens` of the `B` rows laid back to back as one
    /// packed row of `B · T` tokens (row starts and document starts).
    documents: Option<Vec<usize>>,
}

/// Forward and backward of one micro-batch on `model`, on `device` (the model's), the loss
/// multiplied by `scale` for the backward pass (f16 loss scaling; 1 otherwise); the loss
/// (unscaled, detached, `[1]`) and the (scaled) gradients stay there.
fn micro_step(
    model: &RelationLm,
    device: &Device,
    batch: Batch,
    t: &TrainSpec,
    accumulation: usize,
    scale: f64,
) -> Result<(Tensor<1>, GradientsParams)> {
    let start = std::time::Instant::now();
    // Packed documents: the B rows back to back as one row of B·T tokens, cut at the row and
    // document starts; windows: B rows of T.
    let segments = match &batch.documents {
        Some(offsets) => Some(Segments::new(offsets, batch.inputs.len()).map_err(|e| {
            TrainError::Data(format!("a packed micro-batch's document offsets: {e}"))
        })?),
        None => None,
    };
    let shape = match segments {
        Some(_) => [1, t.batch_size * t.seq_len],
        None => [t.batch_size, t.seq_len],
    };
    let x = Tensor::<2, Int>::from_data(TensorData::new(batch.inputs, shape), device);
    let y = Tensor::<2, Int>::from_data(TensorData::new(batch.targets, shape), device);
    if t.activation_checkpointing {
        // Only the blocks' inputs kept, one block recomputed at a time in the backward pass,
        // the head and the loss over chunks of tokens (see relation_model::activation_checkpointing).
        let (loss, grads) = model.checkpointed_step(
            x,
            y,
            CheckpointedStep {
                segments: segments.as_ref(),
                loss_factor: scale / accumulation as f64,
                compute_dtype: match t.precision {
                    Precision::F32 => None,
                    half => Some(half.dtype()),
                },
                ..CheckpointedStep::default()
            },
        )?;
        tracing::debug!(
            ms = start.elapsed().as_secs_f64() * 1e3,
            "micro-batch (checkpointed)"
        );
        return Ok((loss.div_scalar(accumulation as f64).autodiff(), grads));
    }
    let forward = |model: &RelationLm| match &segments {
        Some(segments) => model.forward_packed(x.clone(), segments),
        None => model.forward(x.clone()),
    };
    let logits = match t.precision {
        Precision::F32 => forward(model)?, // [B, T, V] or [1, B·T, V]
        // Mixed precision: the forward and backward in the half-precision copy, the loss in
        // f32; the gradients flow back through the casts onto the f32 masters.
        half => forward(&model.cast_params(half.dtype()))?.cast(FloatDType::F32),
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
    let forward = start.elapsed();
    let grads = GradientsParams::from_grads(scaled.backward(), model);
    // Wall-clock on the host: exact on Flex (synchronous), the time to enqueue on GPU backends.
    tracing::debug!(
        forward_ms = forward.as_secs_f64() * 1e3,
        backward_ms = (start.elapsed() - forward).as_secs_f64() * 1e3,
        "micro-batch"
    );
    Ok((value, grads))
}

/// A replica's micro-batch losses, each with its index in the step.
type Losses = Vec<(usize, Tensor<1>)>;

/// What one member of a collective step returns: its losses and all-reduced gradients; its
/// own error (`Some`); or `None` when it stopped because another member failed.
type Member = std::result::Result<(Losses, GradientsParams), Option<TrainError>>;

/// The micro-batches of one optimizer step (this rank's share, each with its index in the
/// step): their losses in micro-batch order on the first device, and their gradients' sum there.
///
/// With several devices (data parallel), the `k`-th of these micro-batches runs on replica `k mod n` — a copy of
/// the model forked onto that device — all replicas at once on their own threads, and
/// `reduction` sums the gradients: in micro-batch order on the first device
/// ([`Reduction::Ordered`]: the sum one device computes), or each replica its own in order,
/// then an all-reduce of the replicas' sums ([`Reduction::Collective`]).
fn micro_steps(
    model: &RelationLm,
    replicas: &[Device],
    reduction: &Reduction,
    batches: Vec<(usize, Batch)>,
    t: &TrainSpec,
    scale: f64,
) -> Result<(Vec<Tensor<1>>, GradientsParams)> {
    let primary = &replicas[0];
    let n = replicas.len().min(batches.len());
    if n <= 1 {
        let (losses, grads) = replica_sum(model, primary, batches.into_iter(), t, scale)?;
        return Ok((in_order(losses, primary), grads.unwrap_or_default()));
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
    // Every replica gets at least one micro-batch (n <= the number of micro-batches).
    let mut assigned: Vec<Vec<(usize, Batch)>> = vec![Vec::new(); n];
    for (k, batch) in batches.into_iter().enumerate() {
        assigned[k % n].push(batch);
    }
    match reduction {
        Reduction::Ordered => ordered(model, &copies, replicas, assigned, t, scale),
        Reduction::Collective(collective) => {
            let group = collective.group(n);
            let meeting = Meeting::new(n);
            let members = on_replicas(&copies, replicas, assigned, |copy, device, mine| {
                // Caught so that a member that panics still comes to the meeting (the others
                // must not wait for it in the all-reduce), and panics on afterwards.
                let summed = panic::catch_unwind(AssertUnwindSafe(|| {
                    replica_sum(copy, device, mine.into_iter(), t, scale)
                }));
                let all_ready = meeting.all_ready(matches!(summed, Ok(Ok((_, Some(_))))));
                let (losses, grads) = match summed {
                    Err(payload) => panic::resume_unwind(payload),
                    Ok(Err(e)) => return Err(Some(e)),
                    Ok(Ok(done)) => done,
                };
                let Some(mut grads) = grads.filter(|_| all_ready) else {
                    return Err(None);
                };
                all_reduce_grads(copy, &mut grads, group);
                Ok((losses, grads))
            });
            first_replica(members, primary)
        }
        Reduction::HostAllReduce => {
            let sums = on_replicas(&copies, replicas, assigned, |copy, device, mine| {
                replica_sum(copy, device, mine.into_iter(), t, scale)
            });
            // The replicas' sums added in rank order on the first device: an all-reduce `Sum`
            // of two replicas, done by the host.
            let mut all_losses = Vec::new();
            let mut sum = GradientsAccumulator::<RelationLm>::new();
            for (r, result) in sums.into_iter().enumerate() {
                let (losses, grads) = result?;
                all_losses.extend(losses);
                let Some(grads) = grads else { continue };
                let grads = if r == 0 {
                    grads
                } else {
                    grads.to_device(primary, model)
                };
                sum.accumulate(model, grads);
            }
            Ok((in_order(all_losses, primary), sum.grads()))
        }
    }
}

/// Runs `micro_batches` on `model` (on `device`) in order and sums their gradients there, in
/// that order; `None` for no micro-batch.
fn replica_sum(
    model: &RelationLm,
    device: &Device,
    micro_batches: impl Iterator<Item = (usize, Batch)>,
    t: &TrainSpec,
    scale: f64,
) -> Result<(Losses, Option<GradientsParams>)> {
    let accumulation = t.accumulation();
    let mut sum = GradientsAccumulator::<RelationLm>::new();
    let mut losses = Vec::new();
    for (i, b) in micro_batches {
        let (loss, grads) = micro_step(model, device, b, t, accumulation, scale)?;
        losses.push((i, loss));
        sum.accumulate(model, grads);
    }
    let any = !losses.is_empty();
    Ok((losses, any.then(|| sum.grads())))
}

/// [`Reduction::Ordered`]: every micro-batch's loss and gradient come back to the first device,
/// where the gradients are added in micro-batch order — the sum one device computes.
fn ordered(
    model: &RelationLm,
    copies: &[RelationLm],
    replicas: &[Device],
    assigned: Vec<Vec<(usize, Batch)>>,
    t: &TrainSpec,
    scale: f64,
) -> Result<(Vec<Tensor<1>>, GradientsParams)> {
    let primary = &replicas[0];
    let accumulation = t.accumulation();
    let done = on_replicas(copies, replicas, assigned, |copy, device, mine| {
        mine.into_iter()
            .map(|(i, b)| {
                let (loss, grads) = micro_step(copy, device, b, t, accumulation, scale)?;
                if device == primary {
                    Ok((i, loss, grads))
                } else {
                    Ok((i, loss.to_device(primary), grads.to_device(primary, copy)))
                }
            })
            .collect::<Result<Vec<_>>>()
    });
    let mut done: Vec<(usize, Tensor<1>, GradientsParams)> = done
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    done.sort_by_key(|(i, ..)| *i);
    let mut sum = GradientsAccumulator::<RelationLm>::new();
    let mut losses = Vec::with_capacity(done.len());
    for (_, loss, grads) in done {
        losses.push(loss);
        sum.accumulate(model, grads);
    }
    Ok((losses, sum.grads()))
}

/// [`Reduction::Collective`]'s result: every member's losses in micro-batch order on the first
/// device, and the first replica's all-reduced gradient (the step's, already there); or the
/// first error a member reported.
fn first_replica(
    members: Vec<Member>,
    primary: &Device,
) -> Result<(Vec<Tensor<1>>, GradientsParams)> {
    let mut all_losses = Vec::new();
    let mut first = None;
    let mut error = None;
    for member in members {
        match member {
            Ok((losses, grads)) => {
                all_losses.extend(losses);
                first.get_or_insert(grads);
            }
            Err(Some(e)) => {
                error.get_or_insert(e);
            }
            Err(None) => {}
        }
    }
    match (error, first) {
        (Some(e), _) => Err(e),
        (None, Some(grads)) => Ok((in_order(all_losses, primary), grads)),
        (None, None) => {
            unreachable!("a collective step with no failure has its members' gradients")
        }
    }
}

/// Losses tagged with their micro-batch index, in micro-batch order on `primary`.
fn in_order(mut losses: Losses, primary: &Device) -> Vec<Tensor<1>> {
    losses.sort_by_key(|(i, _)| *i);
    losses
        .into_iter()
        .map(|(_, l)| l.to_device(primary))
        .collect()
}

/// Runs `work` for every replica — its model copy, its device and its micro-batches — each on
/// its own thread, and returns their results in replica order.
fn on_replicas<R: Send>(
    copies: &[RelationLm],
    replicas: &[Device],
    assigned: Vec<Vec<(usize, Batch)>>,
    work: impl Fn(&RelationLm, &Device, Vec<(usize, Batch)>) -> R + Sync,
) -> Vec<R> {
    let work = &work;
    std::thread::scope(|s| {
        let workers: Vec<_> = copies
            .iter()
            .zip(replicas)
            .zip(assigned)
            .map(|((copy, device), mine)| s.spawn(move || work(copy, device, mine)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a data-parallel worker panicked"))
            .collect()
    })
}
