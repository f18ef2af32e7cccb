//! `relation train`'s flags, grouped as `--help` shows them (run, model, data, training), and
//! how they override a configuration.

use std::path::PathBuf;

use clap::Args;
use relation_model::LinearRelationMode;

use super::ResumeMode;
use crate::config::{DataSpec, ModelSpec, Reduce, RunConfig, TrainSpec};
use crate::precision::Precision;
use crate::train::OnNan;

/// `relation train`.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// Run directory: config.json, model.json, tokenizer.json, checkpoints/, metrics.csv,
    /// metrics.jsonl, loss.png, lock. Default: runs/PRESET-UNIX_SECONDS. It becomes a run
    /// with its first checkpoint; a run is continued with --resume or discarded with
    /// --overwrite, never overwritten silently.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// JSON configuration (any subset of the keys of a run's config.json, merged over the
    /// defaults, or over the run's configuration when resuming); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Continue the run in --run-dir with its saved configuration: `--resume` from its latest
    /// checkpoint that verifies (falling back to an older one if the latest is damaged; from
    /// step 0 if its first start stopped before any); `--resume auto` resumes if the directory
    /// holds a run and starts one otherwise (a job restarted with the same command line). Flags
    /// may repeat the run's settings; a changed --steps, --lr, --min-lr-ratio,
    /// --warmup-steps, --decay-fraction, --weight-decay or --grad-clip is recorded in
    /// changes.jsonl (the run stops being bit-exact); other changes are refused.
    #[arg(long, requires = "run_dir", num_args = 0..=1, default_missing_value = "latest",
        value_enum, value_name = "auto")]
    pub resume: Option<ResumeMode>,
    /// Resume from this checkpoint (step-N or N) instead of the latest, e.g. from before a
    /// divergence with a lower --lr; the later checkpoints are moved aside, not deleted.
    #[arg(long, requires = "run_dir", value_name = "STEP")]
    pub from_checkpoint: Option<String>,
    /// Discard the run in --run-dir (its own files only) and start afresh.
    #[arg(long, conflicts_with_all = ["resume", "from_checkpoint"])]
    pub overwrite: bool,
    /// A step whose loss or gradient norm is not finite: stop the run (naming the last good
    /// checkpoint), or skip its update and go on.
    #[arg(long, value_enum, default_value_t = OnNan::Stop, value_name = "stop|skip")]
    pub on_nan: OnNan,
    /// With --on-nan skip: the most steps a run may skip before it stops as diverged.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub max_skipped_steps: u64,
    /// Faults to inject, for the trainer's tests (`testing` builds only): poison-steps=N[,N…],
    /// loss-scale=X, crash-during-save, host-all-reduce.
    #[cfg(feature = "testing")]
    #[arg(long = "fault", value_name = "FAULT", hide = true)]
    pub fault: Vec<crate::faults::Fault>,
    /// End this invocation after this step (writing a checkpoint), as if stopped; the schedule
    /// still spans --steps, and --resume continues exactly where it stopped.
    #[arg(long, value_name = "STEP")]
    pub stop_at: Option<u64>,
    /// Hide the progress bar (log lines only).
    #[arg(long)]
    pub no_progress: bool,
    /// Device: flex (pure-Rust CPU), wgpu, vulkan, metal, cuda, rocm, cpu, ndarray — those
    /// compiled in (cargo features); a GPU index follows a colon (wgpu:1, cuda:0). Default: flex.
    #[arg(long)]
    pub device: Option<String>,
    /// Data parallel over several devices, comma-separated (e.g. cuda:0,cuda:1): each step's
    /// micro-batches are spread over them (give --tokens-per-step of at least one micro-batch
    /// per device); the first holds the optimizer. --reduce says how their gradients are summed.
    #[arg(long, value_delimiter = ',', value_name = "DEVICE,DEVICE,…")]
    pub devices: Vec<String>,
    /// How --devices sum their gradients: collective (Burn's all-reduce over the replicas'
    /// sums, device to device; CUDA with NCCL in Burn 0.22), ordered (every micro-batch's
    /// gradient added on the first device in micro-batch order: bit for bit one device, any
    /// devices), or auto (default: collective where the devices support it, else ordered).
    #[arg(long, value_enum, value_name = "auto|collective|ordered")]
    pub reduce: Option<Reduce>,

    /// The model's shape and Relation switches.
    #[command(flatten)]
    pub model: ModelFlags,
    /// The text and its tokenizer.
    #[command(flatten)]
    pub data: DataFlags,
    /// Optimisation and cadence.
    #[command(flatten)]
    pub training: TrainingFlags,
}

/// `relation train`'s model flags.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelFlags {
    /// Model preset: cpu (default; minutes on 2 CPU cores), tiny, small, 10m, 30m, 100m,
    /// hybrid-32m; append -mha for the attention baseline (e.g. cpu-mha, 10m-mha).
    #[arg(long)]
    pub preset: Option<String>,
    /// Layer pattern, repeated over the layers: F Full Relation, L Linear Relation, A attention,
    /// R RealFormer, N retention, K Kimi Delta Attention (LLLF = the paper's Hybrid).
    #[arg(long)]
    pub pattern: Option<String>,
    /// Model width.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Number of layers.
    #[arg(long)]
    pub n_layers: Option<usize>,
    /// Number of heads (even, unless --no-givens).
    #[arg(long)]
    pub n_heads: Option<usize>,
    /// FFN width.
    #[arg(long)]
    pub d_ff: Option<usize>,
    /// Self temperature tau_S of the Relation layers (default 2).
    #[arg(long)]
    pub tau: Option<f64>,
    /// Initial count calibration lambda of the Full Relation layers (default 0.5).
    #[arg(long)]
    pub lambda_init: Option<f64>,
    /// Keep lambda fixed at --lambda-init (ablation: --lambda-init 0 --freeze-lambda is Relation
    /// without count calibration).
    #[arg(long)]
    pub freeze_lambda: bool,
    /// Turn Givens head mixing off (ablation); also allows an odd head count, e.g. --n-heads 1
    /// for the single-head Relation.
    #[arg(long)]
    pub no_givens: bool,
    /// How the Linear Relation layers run: recurrent (default: fastest on CPUs, measured) or
    /// chunked[:16|32|64] (chunkwise parallel, GLA-style; for GPUs at long context). Same
    /// parameters and function either way.
    #[arg(long, value_name = "MODE")]
    pub linear_mode: Option<LinearRelationMode>,
    /// Ablation: the Full Relation layers transport their input itself (I = X: no W_I).
    #[arg(long)]
    pub info_from_input: bool,
    /// Ablation: Exchange-only transport in the Full Relation layers (no Self term; the first
    /// token keeps its own information).
    #[arg(long)]
    pub exchange_only: bool,
}

/// `relation train`'s data flags.
#[derive(Debug, Args)]
#[command(next_help_heading = "Data")]
pub struct DataFlags {
    /// Training text: files, folders (.txt, .md, .jsonl inside) or JSON Lines with a `text`
    /// field; repeat for several. Default: the shipped corpus (Moby Dick).
    #[arg(long = "data", value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// Share of the text held out for validation (default 0.05).
    #[arg(long)]
    pub val_fraction: Option<f64>,
    /// How the text is split: hash (default; by a hash of each document or paragraph group) or
    /// contiguous (first 1 - 2 v of the bytes train, the next v validate, the last v is unread).
    #[arg(long, value_enum)]
    pub split: Option<crate::config::SplitMode>,
    /// Vocabulary of the BPE tokenizer trained on the training split (default 4096).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Use this tokenizer.json instead of training one.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// Cache for tokenizers and tokenized corpora (default ~/.cache/relation).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Row layout: documents (each row's documents computed apart: positions, count
    /// calibration and recurrent states restart at every <|endoftext|>), windows (each row one
    /// causal sequence across documents), or auto (default: documents for 64 or more
    /// documents, windows for a few long texts).
    #[arg(long, value_enum)]
    pub packing: Option<crate::config::Packing>,
}

/// `relation train`'s optimisation and cadence flags (counts show as `<N>` in `--help`, like
/// `--max-skipped-steps`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Training")]
pub struct TrainingFlags {
    /// Optimizer steps in the whole run (default 250).
    #[arg(long, value_name = "N")]
    pub steps: Option<u64>,
    /// Context length in tokens (default 128).
    #[arg(long, value_name = "N")]
    pub seq_len: Option<usize>,
    /// Sequences per forward/backward pass (default 16).
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Tokens per optimizer step, a multiple of --batch-size x --seq-len: that many
    /// micro-batches are accumulated per step (default 2048).
    #[arg(long, value_name = "N")]
    pub tokens_per_step: Option<usize>,
    /// Peak learning rate (default 3e-3).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Final learning rate as a fraction of the peak (default 0).
    #[arg(long)]
    pub min_lr_ratio: Option<f64>,
    /// Linear warm-up steps (default: 10% of --steps).
    #[arg(long, value_name = "N")]
    pub warmup_steps: Option<u64>,
    /// Share of the steps in the final decay (default 0.2: WSD80).
    #[arg(long)]
    pub decay_fraction: Option<f64>,
    /// AdamW weight decay on matrices (default 0.1).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Global gradient-norm clip, 0 = off (default 1.0).
    #[arg(long)]
    pub grad_clip: Option<f64>,
    /// Seed of the weights and the data order (default 42).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Evaluate every N steps and at the end (default 50).
    #[arg(long, value_name = "N")]
    pub eval_every: Option<u64>,
    /// Validation tokens per evaluation, 0 = all (default 16384).
    #[arg(long, value_name = "N")]
    pub eval_tokens: Option<usize>,
    /// Checkpoint every N steps and at the end (default 50).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,
    /// Checkpoints kept (default 2).
    #[arg(long, value_name = "N")]
    pub keep_checkpoints: Option<usize>,
    /// Log line every N steps (default 10).
    #[arg(long, value_name = "N")]
    pub log_every: Option<u64>,
    /// Tokens to sample at the end, 0 = none (default 120).
    #[arg(long, value_name = "N")]
    pub sample_tokens: Option<usize>,
    /// Forward/backward dtype: f32 (default), f16 (f32 master weights, dynamic loss scaling)
    /// or bf16 (f32 master weights); the device must have the type.
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Keep only each block's input and recompute one block at a time in the backward pass; the
    /// head and the loss over chunks of 4,096 tokens (memory for long sequences; one more
    /// forward pass of the blocks).
    #[arg(long)]
    pub activation_checkpointing: bool,
}

/// Copies each given flag into its config field (the flag names document the mapping).
macro_rules! set {
    ($($flag:literal: $src:expr => $dst:expr),* $(,)?) => {{
        $(if let Some(v) = $src.clone() {
            $dst = v.into();
        })*
    }};
}

impl TrainArgs {
    /// The faults of the `--fault` flags, together.
    #[cfg(feature = "testing")]
    pub fn faults(&self) -> crate::faults::Faults {
        let mut faults = crate::faults::Faults::default();
        for fault in &self.fault {
            faults.add(fault.clone());
        }
        faults
    }

    /// Applies the flags to `cfg` (on resume, `train` then checks what they changed).
    pub(super) fn apply(&self, cfg: &mut RunConfig) {
        self.model.apply(&mut cfg.model);
        self.data.apply(&mut cfg.data);
        self.training.apply(&mut cfg.train);
        if !self.devices.is_empty() {
            cfg.devices = self.devices.clone();
        } else if self.device.is_some() {
            cfg.devices.clear();
        }
        set!(
            "--device": self.device => cfg.device,
            "--reduce": self.reduce => cfg.reduce,
        );
    }
}

impl ModelFlags {
    fn apply(&self, m: &mut ModelSpec) {
        set!(
            "--preset": self.preset => m.preset,
            "--pattern": self.pattern.clone().map(Some) => m.pattern,
            "--d-model": self.d_model.map(Some) => m.d_model,
            "--n-layers": self.n_layers.map(Some) => m.n_layers,
            "--n-heads": self.n_heads.map(Some) => m.n_heads,
            "--d-ff": self.d_ff.map(Some) => m.d_ff,
            "--tau": self.tau.map(Some) => m.tau,
            "--lambda-init": self.lambda_init.map(Some) => m.lambda_init,
            "--freeze-lambda": self.freeze_lambda.then_some(Some(false)) => m.lambda_trainable,
            "--no-givens": self.no_givens.then_some(Some(false)) => m.givens,
            "--linear-mode": self.linear_mode.map(Some) => m.linear_mode,
            "--info-from-input": self.info_from_input.then_some(Some(false)) => m.info_projection,
            "--exchange-only": self.exchange_only.then_some(Some(true)) => m.exchange_only,
        );
    }
}

impl DataFlags {
    fn apply(&self, d: &mut DataSpec) {
        set!(
            "--val-fraction": self.val_fraction => d.val_fraction,
            "--split": self.split => d.split,
            "--vocab-size": self.vocab_size => d.vocab_size,
            "--tokenizer": self.tokenizer.clone().map(Some) => d.tokenizer,
            "--cache-dir": self.cache_dir.clone().map(Some) => d.cache_dir,
            "--packing": self.packing => d.packing,
        );
        if !self.data.is_empty() {
            d.sources = self.data.clone();
        }
    }
}

impl TrainingFlags {
    fn apply(&self, t: &mut TrainSpec) {
        set!(
            "--seq-len": self.seq_len => t.seq_len,
            "--batch-size": self.batch_size => t.batch_size,
            "--tokens-per-step": self.tokens_per_step => t.tokens_per_step,
            "--lr": self.lr => t.lr,
            "--min-lr-ratio": self.min_lr_ratio => t.min_lr_ratio,
            "--warmup-steps": self.warmup_steps.map(Some) => t.warmup_steps,
            "--decay-fraction": self.decay_fraction => t.decay_fraction,
            "--weight-decay": self.weight_decay => t.weight_decay,
            "--grad-clip": self.grad_clip => t.grad_clip,
            "--seed": self.seed => t.seed,
            "--steps": self.steps => t.steps,
            "--eval-every": self.eval_every => t.eval_every,
            "--eval-tokens": self.eval_tokens => t.eval_tokens,
            "--checkpoint-every": self.checkpoint_every => t.checkpoint_every,
            "--keep-checkpoints": self.keep_checkpoints => t.keep_checkpoints,
            "--log-every": self.log_every => t.log_every,
            "--sample-tokens": self.sample_tokens => t.sample_tokens,
            "--precision": self.precision => t.precision,
            "--activation-checkpointing": self.activation_checkpointing.then_some(true) => t.activation_checkpointing,
        );
    }
}
