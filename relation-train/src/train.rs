//! The training loop: data, model, AdamW with accumulation and global-norm clipping under a
//! warmup-stable-decay schedule, periodic evaluation and atomic checkpoints, resumable to the
//! bit, with live progress and a metrics log.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use relation_kernels::device::parse_device;
use relation_model::{RelationLm, Sampling};

use crate::checkpoint::{self, CheckpointState, fingerprint};
use crate::config::{RunConfig, TrainSpec};
use crate::data::{self, Batcher, DataPosition};
use crate::error::io;
use crate::evaluate::{EvalResult, evaluate};
use crate::fs::{RunLock, write_atomic};
use crate::metrics::{Metrics, Row};
use crate::optim::{adamw, clip_global_norm, squared_grad_norm, token_nll, wsd_lr};
use crate::run_dir::{Start, open_run, record_changes};
use crate::{Result, TrainError};

/// Test hook: a step number, or several separated by commas, whose loss is replaced by NaN (to
/// exercise the divergence handling without waiting for a real divergence).
pub const POISON_STEP_ENV: &str = "RELATION_TEST_POISON_STEP";

/// What a step whose loss or gradient norm is not finite does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnNan {
    /// Stop the run with an error naming the last good checkpoint (the default).
    #[default]
    Stop,
    /// Skip that step's update (its data is consumed, the weights and optimizer state are
    /// left as they were) and go on, up to [`TrainOptions::max_skipped_steps`] times a run.
    Skip,
}

/// How to run `train` beyond the configuration.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Continue the run in `run_dir`: from its latest checkpoint that verifies, or from step 0
    /// if its first start stopped before writing one.
    pub resume: bool,
    /// Resume from this checkpoint (`step-N` or `N`) instead of the latest; the later ones are
    /// moved aside, not deleted. Requires `resume`.
    pub from_checkpoint: Option<String>,
    /// Discard the run in `run_dir` (its files, not the folder's other contents) and start
    /// afresh.
    pub overwrite: bool,
    /// End this invocation after this step (with a checkpoint).
    pub stop_at: Option<u64>,
    /// No progress bar (log lines only).
    pub no_progress: bool,
    /// What a non-finite loss or gradient norm does.
    pub on_nan: OnNan,
    /// With [`OnNan::Skip`], the most steps a run may skip before it stops.
    pub max_skipped_steps: u64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            run_dir: PathBuf::new(),
            resume: false,
            from_checkpoint: None,
            overwrite: false,
            stop_at: None,
            no_progress: false,
            on_nan: OnNan::Stop,
            max_skipped_steps: 10,
        }
    }
}

/// What a finished (or stopped) invocation did.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Step the run is at.
    pub step: u64,
    /// Whether the configured number of steps is done.
    pub finished: bool,
    /// Training tokens consumed so far (whole run).
    pub tokens_seen: u64,
    /// Training tokens per second over this invocation.
    pub tokens_per_s: f64,
    /// Last validation result.
    pub validation: Option<EvalResult>,
    /// The sample drawn at the end (prompt and continuation).
    pub sample: Option<(String, String)>,
    /// The last checkpoint written.
    pub checkpoint: PathBuf,
    /// Trainable parameters.
    pub params: usize,
}

/// Upper bound of a bits-per-byte figure worth beating on the shipped corpus.
pub const XZ_BITS_PER_BYTE_MOBY: f64 = 2.65;

/// Trains according to `config` in `opts.run_dir`, printing progress to stderr and a log to
/// stdout. A directory becomes a run with its first checkpoint: a start that fails before one
/// can be rerun (or resumed from step 0); one that has a checkpoint is continued with
/// `opts.resume` or discarded with `opts.overwrite`. The directory is locked for the whole
/// call, so a second writer gets an error instead of overwriting this one's work.
///
/// # Errors
/// Bad settings, data or device; a run that exists without `resume` or `overwrite`; a run
/// directory in use; on resume, a changed setting that defines the run, or no checkpoint that
/// verifies; a non-finite loss or gradient norm ([`TrainError::NonFinite`], or
/// [`TrainError::SkipLimit`] with [`OnNan::Skip`]).
pub fn train(config: RunConfig, opts: &TrainOptions) -> Result<TrainSummary> {
    let run = &opts.run_dir;
    config.validate()?;
    if let Some(stop) = opts.stop_at
        && stop == 0
    {
        return Err(TrainError::Invalid {
            name: "--stop-at",
            value: "0".into(),
            rule: "must be >= 1".into(),
        });
    }
    if let (Some(name), false) = (&opts.from_checkpoint, opts.resume) {
        return Err(TrainError::Invalid {
            name: "--from-checkpoint",
            value: name.clone(),
            rule: "only resumes (it needs --resume)".into(),
        });
    }
    let device_names = config.device_names();
    let replicas = device_names
        .iter()
        .map(|name| Ok(parse_device(name)?.autodiff()))
        .collect::<Result<Vec<Device>>>()?;
    let t = config.train.clone();
    let _lock = RunLock::acquire(run)?;
    let start = open_run(&config, opts)?;
    let resume = matches!(start, Start::Resume(_));

    let mut log = |line: String| println!("{line}");
    let corpus = data::prepare(&config.data, &mut log)?;
    let model_config = config.model.resolve(corpus.meta.vocab_size)?;
    let model_json = serde_json::to_string_pretty(&model_config).expect("config serializes");

    // The corpus's identity: the tokenized corpus's cache key (a hash of every unit's text,
    // its side of the split and the tokenizer settings) and its sizes, so a resume notices
    // changed data even when the tokenizer is given rather than trained on it.
    let data_json = serde_json::to_string_pretty(&serde_json::json!({
        "corpus": corpus.cache.file_name().map(|n| n.to_string_lossy().into_owned()),
        "train_tokens": corpus.meta.train_tokens,
        "val_tokens": corpus.meta.val_tokens,
    }))
    .expect("json serializes");

    // The run directory's identity: written once, compared on resume.
    if resume {
        for (name, now) in [
            ("model.json", &model_json),
            ("tokenizer.json", &corpus.tokenizer_json),
            ("data.json", &data_json),
        ] {
            let path = run.join(name);
            if name == "data.json" && !path.exists() {
                continue; // a run started before data.json existed
            }
            let saved = fs::read_to_string(&path).map_err(io(&path))?;
            if &saved != now {
                return Err(TrainError::RunDir {
                    path: run.clone(),
                    reason: format!(
                        "{name} differs from what this configuration and data produce now (data or settings changed since the run started); resume refused"
                    ),
                });
            }
        }
    } else {
        let config_json = serde_json::to_string_pretty(&config).expect("config serializes");
        write_atomic(&run.join("config.json"), config_json.as_bytes())?;
        write_atomic(&run.join("model.json"), model_json.as_bytes())?;
        write_atomic(&run.join("data.json"), data_json.as_bytes())?;
        write_atomic(
            &run.join("tokenizer.json"),
            corpus.tokenizer_json.as_bytes(),
        )?;
    }
    let tokenizer = corpus
        .tokenizer_json
        .parse::<tokenizers::Tokenizer>()
        .map_err(|e| TrainError::Tokenizer(e.to_string()))?;

    // Model and optimizer: the seed fixes the initial weights.
    let train_device = replicas[0].clone();
    train_device.seed(t.seed);
    let mut model = model_config.init(&train_device)?;
    let mut step = 0u64;
    let mut tokens_seen = 0u64;
    let mut position = DataPosition { epoch: 0, index: 0 };
    let mut elapsed_before = 0.0f64;
    let mut last_checkpoint = String::from("none (no checkpoint written yet)");
    let mut checkpoint_dir = PathBuf::new();
    let mut skipped = 0u64;
    if let Start::Resume(changes) = &start {
        let (dir, state) = checkpoint::resume_point(
            run,
            opts.from_checkpoint.as_deref(),
            &model_json,
            &corpus.tokenizer_json,
            &mut log,
        )?;
        if state.seed != t.seed {
            return Err(TrainError::Checkpoint {
                path: dir,
                reason: format!("seed {} differs from the run's seed {}", state.seed, t.seed),
            });
        }
        model = checkpoint::load_model(&dir, model)?;
        step = state.step;
        tokens_seen = state.tokens_seen;
        position = state.position;
        elapsed_before = state.elapsed_s;
        skipped = state.skipped_steps;
        last_checkpoint = dir.display().to_string();
        checkpoint_dir = dir;
        println!("resume: {} (step {step})", checkpoint_dir.display());
        if !changes.is_empty() {
            record_changes(run, step, changes, &config)?;
        }
    }
    // Built after any resume: the loaded weights carry the saved parameter ids, which the
    // weight-decay groups and the optimizer state are keyed by.
    let mut optim = adamw(&model, &t);
    if resume {
        optim = checkpoint::load_optim(&checkpoint_dir, optim)?;
    }
    let params = model.num_params();
    let accumulation = t.accumulation();
    let per_step = t.effective_tokens_per_step() as u64;
    // The Relation switches that differ from the paper's defaults (ablations), if any.
    let mut switches = Vec::new();
    if model_config.tau != relation_core::DEFAULT_TAU {
        switches.push(format!("tau {}", model_config.tau));
    }
    if model_config.lambda_init != relation_core::DEFAULT_LAMBDA || !model_config.lambda_trainable {
        let how = if model_config.lambda_trainable {
            "init"
        } else {
            "frozen at"
        };
        switches.push(format!("lambda {how} {}", model_config.lambda_init));
    }
    if !model_config.givens {
        switches.push("no Givens".into());
    }
    let switches = if switches.is_empty() {
        String::new()
    } else {
        format!(" ({})", switches.join(", "))
    };
    println!(
        "model: {} layers `{}`{switches}, d = {}, {} heads, {:.2}M parameters, vocab {} | device {} ({} CPU threads) | {} x {} tokens x {} micro-batches = {} tokens per step, {} steps",
        model_config.n_layers,
        model_config.pattern,
        model_config.d_model,
        model_config.n_heads,
        params as f64 / 1e6,
        model_config.vocab_size,
        device_names.join(" + "),
        relation_kernels::cpu_threads(),
        t.batch_size,
        t.seq_len,
        accumulation,
        per_step,
        t.steps
    );

    let mut batcher = Batcher::new(corpus.train.len(), t.seq_len, t.seed, position)?;
    let val_bytes_per_token = corpus.meta.val_bytes as f64 / corpus.meta.val_tokens as f64;
    let mut metrics = Metrics::open(run, resume.then_some(step))?;
    let poison_steps: Vec<u64> = std::env::var(POISON_STEP_ENV)
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_default();

    let end = opts.stop_at.map_or(t.steps, |s| s.min(t.steps));
    let bar = if opts.no_progress {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(t.steps), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps [{elapsed_precise} < {eta_precise}] {msg}",
        )
        .expect("valid template"),
    );
    bar.set_position(step);
    let say = |line: String| bar.suspend(|| println!("{line}"));

    let started = Instant::now();
    let tokens_at_start = tokens_seen;
    let mut validation = metrics.rows.iter().rev().find_map(|r| {
        r.val_loss.map(|loss| EvalResult {
            tokens: 0,
            loss,
            perplexity: r.val_ppl.unwrap_or(loss.exp()),
            bits_per_byte: r.val_bpb.unwrap_or(f64::NAN),
        })
    });
    while step < end {
        step += 1;
        let step_start = Instant::now();
        let lr = wsd_lr(step, &t);
        let mut accumulator = GradientsAccumulator::<RelationLm>::new();
        let mut losses = Vec::with_capacity(accumulation);
        let batches: Vec<Batch> = (0..accumulation)
            .map(|_| batcher.next_batch(&corpus.train, t.batch_size))
            .collect();
        // Accumulated in micro-batch order whatever device computed them, so the sum (and the
        // run) is the same as on one device.
        for result in micro_steps(&model, &replicas, batches, &t, accumulation)? {
            let (loss, grads) = result;
            losses.push(loss);
            accumulator.accumulate(&model, grads);
        }
        let mut grads = accumulator.grads();
        // One read-back per step: the step's loss and the squared gradient norm together.
        let loss_sum = Tensor::cat(losses, 0).sum(); // [1]
        let norm_sq = squared_grad_norm(&model, &grads).unwrap_or_else(|| loss_sum.zeros_like());
        let read: Vec<f32> = Tensor::cat(vec![loss_sum, norm_sq], 0)
            .into_data()
            .iter::<f32>()
            .collect(); // [loss, |g|^2]
        let mut loss = read[0] as f64;
        if poison_steps.contains(&step) {
            loss = f64::NAN;
        }
        let grad_norm = (read[1] as f64).sqrt();
        let not_finite = [("loss", loss), ("gradient norm", grad_norm)]
            .into_iter()
            .find(|(_, v)| !v.is_finite());
        if let Some((what, value)) = not_finite {
            if opts.on_nan == OnNan::Stop {
                bar.abandon();
                return Err(TrainError::NonFinite {
                    step,
                    what,
                    value,
                    last_good: last_checkpoint,
                });
            }
            if skipped >= opts.max_skipped_steps {
                bar.abandon();
                return Err(TrainError::SkipLimit {
                    step,
                    limit: opts.max_skipped_steps,
                    last_good: last_checkpoint,
                });
            }
            // The step's data is consumed and its row logged (loss NaN), but the weights and
            // the optimizer state stay as they were.
            skipped += 1;
            say(format!(
                "step {step:>6} | {what} is {value}: update skipped ({skipped} of at most {} skips)",
                opts.max_skipped_steps
            ));
        } else {
            clip_global_norm(&model, &mut grads, grad_norm, t.grad_clip);
            model = optim.step(lr, model, grads);
        }
        tokens_seen += per_step;
        let step_time = step_start.elapsed().as_secs_f64();

        let mut row = Row {
            step,
            tokens: tokens_seen,
            lr,
            loss,
            grad_norm,
            tokens_per_s: per_step as f64 / step_time,
            elapsed_s: elapsed_before + started.elapsed().as_secs_f64(),
            val_loss: None,
            val_ppl: None,
            val_bpb: None,
        };
        if step.is_multiple_of(t.eval_every) || step == t.steps {
            let result = evaluate(
                &model.valid(),
                &corpus.val,
                t.seq_len,
                t.batch_size,
                t.eval_tokens,
                val_bytes_per_token,
            )?;
            row.val_loss = Some(result.loss);
            row.val_ppl = Some(result.perplexity);
            row.val_bpb = Some(result.bits_per_byte);
            say(format!(
                "step {step:>6} | validation loss {:.4} | ppl {:.2} | {:.3} bits/byte ({} tokens)",
                result.loss, result.perplexity, result.bits_per_byte, result.tokens
            ));
            validation = Some(result);
        }
        if step.is_multiple_of(t.log_every) || step == end {
            say(format!(
                "step {step:>6} | loss {loss:.4} | lr {lr:.2e} | grad norm {grad_norm:.3} | {:.0} tok/s | {} tokens",
                row.tokens_per_s, tokens_seen
            ));
        }
        bar.set_message(format!(
            "loss {loss:.3} | lr {lr:.1e} | {:.0} tok/s",
            row.tokens_per_s
        ));
        bar.set_position(step);
        metrics.push(row)?;

        if step.is_multiple_of(t.checkpoint_every) || step == end {
            let state = CheckpointState {
                format: checkpoint::FORMAT,
                step,
                tokens_seen,
                position: batcher.position(),
                seed: t.seed,
                model_fingerprint: fingerprint(&model_json),
                tokenizer_fingerprint: fingerprint(&corpus.tokenizer_json),
                elapsed_s: elapsed_before + started.elapsed().as_secs_f64(),
                files: Default::default(),
                skipped_steps: skipped,
            };
            checkpoint_dir = checkpoint::save(run, &model, &optim, state, t.keep_checkpoints)?;
            last_checkpoint = checkpoint_dir.display().to_string();
            if let Err(why) = metrics.plot(&format!(
                "{} on {}",
                model_config.pattern,
                device_names.join(" + ")
            )) {
                say(format!("loss curve not drawn: {why}"));
            }
        }
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    let tokens_per_s = (tokens_seen - tokens_at_start) as f64 / secs.max(1e-9);

    let finished = step >= t.steps;
    let sample = if finished && t.sample_tokens > 0 {
        Some(sample_after_training(
            &model.valid(),
            &tokenizer,
            &corpus.val,
            t.sample_tokens,
            t.seed,
        )?)
    } else {
        None
    };
    Ok(TrainSummary {
        run_dir: run.clone(),
        step,
        finished,
        tokens_seen,
        tokens_per_s,
        validation,
        sample,
        checkpoint: checkpoint_dir,
        params,
    })
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
) -> Result<(Tensor<1>, GradientsParams)> {
    let x = Tensor::<2, Int>::from_data(TensorData::new(x, [t.batch_size, t.seq_len]), device);
    let y = Tensor::<2, Int>::from_data(TensorData::new(y, [t.batch_size, t.seq_len]), device);
    let logits = model.forward(x)?; // [B, T, V]
    // Mean over this micro-batch, divided by the number of micro-batches: the accumulated
    // gradient is the gradient of the step's mean loss.
    let loss = token_nll(logits, y)?.mean().div_scalar(accumulation as f64); // [1]
    let value = loss.clone().detach();
    let grads = GradientsParams::from_grads(loss.backward(), model);
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
) -> Result<Vec<(Tensor<1>, GradientsParams)>> {
    let primary = &replicas[0];
    let n = replicas.len().min(batches.len());
    if n <= 1 {
        return batches
            .into_iter()
            .map(|b| micro_step(model, primary, primary, b, t, accumulation))
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
                        .map(|(i, b)| (i, micro_step(copy, device, primary, b, t, accumulation)))
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
