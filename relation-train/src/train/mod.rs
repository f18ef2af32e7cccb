//! The training loop: data, model, AdamW with accumulation and global-norm clipping under a
//! warmup-stable-decay schedule, periodic evaluation and atomic checkpoints, resumable to the
//! bit, with live progress and a metrics log.
//!
//! [`train`] runs the phases in order, one file each: `setup.rs` (checks, devices, the locked
//! run directory, data, the run's identity files, the initial model), `resume.rs` (the
//! checkpoint to continue from and the optimizer), `step.rs` (one optimisation step over
//! accumulated, possibly data-parallel micro-batches, whose gradients `collective.rs` sums
//! across devices), `evaluate.rs` (the step's metrics row, validation and log lines),
//! `save.rs` (checkpoints and the loss curve) and `finish.rs` (the closing sample and
//! summary). The phases share a `Trainer`; their order, and so every
//! random draw, is the one a bit-exact resume depends on. `run_dir.rs` decides how an
//! invocation starts in its run directory; `events.rs` is what the run reports as it goes
//! (the library prints nothing: the caller shows the events).

mod collective;
mod events;
mod exchange;
mod finish;
mod resume;
mod run_dir;
mod save;
mod setup;
mod share;
mod step;
mod validation;

use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::optim::ModuleOptimizer;

use crate::config::RunConfig;
use crate::data::{Batcher, DataPosition};
use crate::evaluate::EvalResult;
use crate::metrics::Metrics;
use crate::precision::{LossScale, Precision};
use crate::ranks::Ranks;
use crate::{Result, TrainError};
use run_dir::Start;
use setup::Run;

pub use collective::collective_support;
pub use events::TrainEvent;
// Defined with the crate's errors (the reason of `TrainError::Collective`); re-exported here
// beside `collective_support`, which returns it.
pub use crate::error::NoCollective;

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
    /// What a non-finite loss or gradient norm does.
    pub on_nan: OnNan,
    /// With [`OnNan::Skip`], the most steps a run may skip before it stops.
    pub max_skipped_steps: u64,
    /// Set (by a signal handler, say: `relation train` sets it on SIGTERM and SIGINT) to stop
    /// the run cleanly: it finishes the optimizer step it is in, writes a checkpoint of it and
    /// returns [`TrainError::Stopped`]; `resume` continues exactly.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The processes of the run ([`Ranks::single`] unless an MPI launcher started several):
    /// each takes its share of every step's micro-batches, rank 0 alone reads and writes the run
    /// directory (see [`crate::ranks`]).
    pub ranks: std::sync::Arc<Ranks>,
    /// Faults to inject (the trainer's tests).
    #[cfg(feature = "testing")]
    pub faults: crate::faults::Faults,
}

impl TrainOptions {
    /// The faults this run injects: none without the `testing` feature.
    pub(crate) fn faults(&self) -> &crate::faults::Faults {
        #[cfg(feature = "testing")]
        {
            &self.faults
        }
        #[cfg(not(feature = "testing"))]
        {
            static NONE: crate::faults::Faults = crate::faults::Faults::NONE;
            &NONE
        }
    }
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            run_dir: PathBuf::new(),
            resume: false,
            from_checkpoint: None,
            overwrite: false,
            stop_at: None,
            on_nan: OnNan::Stop,
            max_skipped_steps: 10,
            stop: None,
            ranks: std::sync::Arc::new(Ranks::single()),
            #[cfg(feature = "testing")]
            faults: crate::faults::Faults::NONE,
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
    /// Model FLOPs per training token (forward and backward, at the run's `seq_len`; see
    /// `relation_model::flops`).
    pub flops_per_token: f64,
    /// The process's peak resident memory, MiB (`None` where the system does not report it).
    pub peak_rss_mib: Option<f64>,
    /// Seconds of this invocation's steps spent exchanging losses and gradients with the other
    /// ranks (0 in one process).
    pub comm_seconds: f64,
    /// Seconds of this invocation's steps, all of them.
    pub step_seconds: f64,
}

/// Upper bound of a bits-per-byte figure worth beating on the shipped corpus.
pub const XZ_BITS_PER_BYTE_MOBY: f64 = 2.65;

/// Trains according to `config` in `opts.run_dir`, reporting as it goes through `tracing`
/// (each log line an `info` event; see [`train_with`] to show them instead). A directory
/// becomes a run with its first checkpoint: a start that fails before one can be rerun (or
/// resumed from step 0); one that has a checkpoint is continued with `opts.resume` or
/// discarded with `opts.overwrite`. The directory is locked for the whole call, so a second
/// writer gets an error instead of overwriting this one's work.
///
/// # Errors
/// Bad settings, data or device; a run that exists without `resume` or `overwrite`; a run
/// directory in use; on resume, a changed setting that defines the run, or no checkpoint that
/// verifies; a non-finite loss or gradient norm
/// ([`TrainError::NonFinite`], or
/// [`TrainError::SkipLimit`] with [`OnNan::Skip`]).
pub fn train(config: RunConfig, opts: &TrainOptions) -> Result<TrainSummary> {
    train_with(config, opts, &mut events::trace_event)
}

/// [`train`], handing each [`TrainEvent`] (the run's log lines and its progress) to
/// `on_event` as it happens, for the caller to show; nothing is printed.
///
/// # Errors
/// As [`train`].
pub fn train_with(
    config: RunConfig,
    opts: &TrainOptions,
    on_event: &mut dyn FnMut(TrainEvent<'_>),
) -> Result<TrainSummary> {
    let mut log = |line: String| on_event(TrainEvent::Log(&line));
    let (run, start) = Run::setup(config, opts, &mut log)?;
    let mut model = run.init_model()?;
    let mut progress = Progress::fresh(run.t.precision);
    if run.t.precision == Precision::F16
        && let Some(scale) = opts.faults().loss_scale
    {
        progress.loss_scale.scale = scale;
    }
    if let Start::Resume(changes) = &start {
        (model, progress) = run.resume(model, changes, &mut log)?;
    }
    let optim = run.optimizer(&model, &progress)?;
    run.announce(&model, &mut log);
    let size = ModelSize {
        params: model.num_params(),
        flops_per_token: model.training_flops_per_token(run.t.seq_len),
    };
    let root = opts.ranks.is_root();
    let mut trainer = Trainer::new(run, progress, optim, size, on_event)?;
    while trainer.progress.step < trainer.end {
        let (updated, done) = trainer.step(model)?;
        model = updated;
        trainer.step_seconds += done.seconds;
        // Rank 0 alone logs, validates and writes checkpoints.
        let saved = root && trainer.checkpoint_due();
        if root {
            trainer.record(&model, &done)?;
            if saved {
                trainer.checkpoint(&model)?;
            }
        }
        let asked = opts
            .stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst));
        // Every rank stops after the same step when any of them was asked to.
        let stop = opts.ranks.any(asked);
        if stop && trainer.progress.step < trainer.end {
            if root && !saved {
                trainer.checkpoint(&model)?;
            }
            return Err(TrainError::Stopped {
                step: trainer.progress.step,
                checkpoint: trainer.progress.last_checkpoint.clone(),
                run_dir: opts.run_dir.display().to_string(),
            });
        }
    }
    if !root {
        return Ok(trainer.follower_summary());
    }
    trainer.finish(&model)
}

/// Where a run is: what a checkpoint records besides the tensors, and what a resume restores.
struct Progress {
    /// Optimizer steps done.
    step: u64,
    /// Training tokens consumed (whole run).
    tokens_seen: u64,
    /// Where the data order continues.
    position: DataPosition,
    /// Training seconds before this invocation.
    elapsed_before: f64,
    /// Steps skipped for non-finite values (whole run).
    skipped: u64,
    /// The loss scale (1 unless `--precision f16`).
    loss_scale: LossScale,
    /// The last checkpoint, as errors name it.
    last_checkpoint: String,
    /// The last checkpoint's directory (empty before the first).
    checkpoint_dir: PathBuf,
    /// On a rank other than 0 that resumes: rank 0's checkpoint, received into a folder of its
    /// own (`checkpoint_dir`), removed when the run ends (the loaded tensors may read their
    /// bytes from its files lazily).
    _received: Option<share::TempCheckpoint>,
}

impl Progress {
    /// A run at step 0.
    fn fresh(precision: Precision) -> Self {
        Self {
            step: 0,
            tokens_seen: 0,
            position: DataPosition { epoch: 0, index: 0 },
            elapsed_before: 0.0,
            skipped: 0,
            loss_scale: precision.initial_scale(),
            last_checkpoint: String::from("none (no checkpoint written yet)"),
            checkpoint_dir: PathBuf::new(),
            _received: None,
        }
    }
}

/// A run being trained: its setup, optimizer, data order, metrics, where it is, and where its
/// events go. The model itself is passed through the phases by value, because the optimizer
/// consumes it on every update.
/// What the summary and the throughput figures need of the model.
#[derive(Debug, Clone, Copy)]
struct ModelSize {
    /// Trainable parameters.
    params: usize,
    /// Model FLOPs of one training token at the run's `seq_len`
    /// (`RelationLm::training_flops_per_token`).
    flops_per_token: f64,
}

struct Trainer<'a> {
    run: Run<'a>,
    progress: Progress,
    optim: ModuleOptimizer,
    batcher: Batcher,
    metrics: Metrics,
    /// The caller's [`TrainEvent`] handler.
    on_event: &'a mut dyn FnMut(TrainEvent<'_>),
    /// Trainable parameters and model FLOPs per training token.
    size: ModelSize,
    /// Bytes of validation text per validation token (bits per byte).
    val_bytes_per_token: f64,
    /// the steps of [`Faults::poison_steps`](crate::faults::Faults::poison_steps).
    poison_steps: Vec<u64>,
    /// The step this invocation stops after (`--stop-at`, else the run's last).
    end: u64,
    /// When this invocation's steps began.
    started: Instant,
    /// `tokens_seen` when they began (the invocation's throughput).
    tokens_at_start: u64,
    /// The latest validation result, logged in this invocation or an earlier one.
    validation: Option<EvalResult>,
    /// Seconds this invocation's steps spent in the exchange between ranks.
    comm_seconds: f64,
    /// Seconds of this invocation's steps.
    step_seconds: f64,
}

impl<'a> Trainer<'a> {
    /// The data order at the run's position and the metrics log (cut back to the resumed
    /// step); reports where the run starts, and the clock starts here.
    ///
    /// # Errors
    /// A training split shorter than one window, an unreadable metrics log.
    fn new(
        run: Run<'a>,
        progress: Progress,
        optim: ModuleOptimizer,
        size: ModelSize,
        on_event: &'a mut dyn FnMut(TrainEvent<'_>),
    ) -> Result<Self> {
        let t = &run.t;
        let batcher = Batcher::new(run.corpus.train.len(), t.seq_len, t.seed, progress.position)?;
        let meta = &run.corpus.meta;
        let val_bytes_per_token = meta.val_bytes as f64 / meta.val_tokens as f64;
        let metrics = if run.opts.ranks.is_root() {
            Metrics::open(&run.opts.run_dir, run.resume.then_some(progress.step))?
        } else {
            Metrics::unwritten()
        };
        let poison_steps = run.opts.faults().poison_steps.clone();

        let end = run.stop_at.map_or(t.steps, |s| s.min(t.steps));
        on_event(TrainEvent::Progress {
            step: progress.step,
            steps: t.steps,
            status: "",
        });

        let started = Instant::now();
        let tokens_at_start = progress.tokens_seen;
        let validation = metrics.rows.iter().rev().find_map(|r| {
            r.val_loss.map(|loss| EvalResult {
                tokens: 0,
                loss,
                perplexity: r.val_ppl.unwrap_or(loss.exp()),
                bits_per_byte: r.val_bpb.unwrap_or(f64::NAN),
            })
        });
        Ok(Self {
            run,
            progress,
            optim,
            batcher,
            metrics,
            on_event,
            size,
            val_bytes_per_token,
            poison_steps,
            end,
            started,
            tokens_at_start,
            validation,
            comm_seconds: 0.0,
            step_seconds: 0.0,
        })
    }

    /// Reports a line of the run's log.
    fn say(&mut self, line: &str) {
        (self.on_event)(TrainEvent::Log(line));
    }
}
