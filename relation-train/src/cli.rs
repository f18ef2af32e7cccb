//! The `relation` command line: `train`, `eval`, `generate`, `report`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use relation_kernels::device::parse_device;

use crate::config::RunConfig;
use crate::data::{self, DEFAULT_CORPUS_NAME};
use crate::error::io;
use crate::evaluate::{evaluate, load_run};
use crate::train::{OnNan, TrainOptions, XZ_BITS_PER_BYTE_MOBY, train};
use crate::{Result, TrainError, checkpoint};

/// Train, evaluate and sample from Relation language models on any Burn backend.
#[derive(Debug, Parser)]
#[command(name = "relation", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model in a run directory (new, or continued with --resume).
    Train(Box<TrainArgs>),
    /// Validation loss, perplexity and bits per byte of a run's checkpoint, on its validation
    /// split or on any text.
    Eval(EvalArgs),
    /// Sample text from a run's checkpoint, with the model's incremental-decoding cache.
    Generate(GenerateArgs),
    /// The results table and plots of a folder of runs named `<variant>-s<seed>`
    /// (scripts/experiments/small.sh makes them).
    Report(ReportArgs),
    /// Write a run's checkpoint as a standalone model: the weights as safetensors, with the
    /// model configuration and the tokenizer beside them.
    Export(ExportArgs),
}

/// Formats `relation export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// `safetensors` (tensor names are module paths, e.g. `blocks.0.mixer.w1.weight`).
    Safetensors,
}

/// `relation export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// What to write.
    #[arg(long, value_enum, default_value_t = ExportFormat::Safetensors)]
    pub format: ExportFormat,
    /// The weights file (default: <run-dir>/export/model.safetensors); model.json and
    /// tokenizer.json are written into the same folder.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// How `--resume` finds where to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResumeMode {
    /// The run must exist: continue from its latest checkpoint that verifies.
    Latest,
    /// Continue the run if the directory holds one, start it otherwise.
    Auto,
}

/// `relation report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Folder holding the runs (`<variant>-s<seed>/`).
    #[arg(value_name = "DIR")]
    pub runs: PathBuf,
    /// Where `table.md`, `val.png` and `gap.png` go (created).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The variant the others are compared with.
    #[arg(long, default_value = "A")]
    pub baseline: String,
}

/// `relation train`.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// Run directory: config.json, model.json, tokenizer.json, checkpoints/, metrics.csv,
    /// metrics.jsonl, loss.png, lock. Default: runs/<preset>-<unix seconds>. It becomes a run
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
    /// End this invocation after this step (writing a checkpoint), as if stopped; the schedule
    /// still spans --steps, and --resume continues exactly where it stopped.
    #[arg(long, value_name = "STEP")]
    pub stop_at: Option<u64>,
    /// Hide the progress bar (log lines only).
    #[arg(long)]
    pub no_progress: bool,
    /// Device: flex (pure-Rust CPU), wgpu[:N], vulkan[:N], metal, cuda[:N], rocm[:N], cpu,
    /// ndarray — those compiled in (cargo features). Default: flex.
    #[arg(long)]
    pub device: Option<String>,
    /// Data parallel over several devices, comma-separated (e.g. cuda:0,cuda:1): each step's
    /// micro-batches are spread over them (give --tokens-per-step of at least one micro-batch
    /// per device); gradients are summed on the first, which holds the optimizer.
    #[arg(long, value_delimiter = ',', value_name = "DEVICE,DEVICE,…")]
    pub devices: Vec<String>,

    // Model.
    /// Model preset: cpu (default; minutes on 2 CPU cores), tiny, small, 10m, 30m, 100m,
    /// hybrid-32m; append -mha for the attention baseline (e.g. cpu-mha, 10m-mha).
    #[arg(long, help_heading = "Model")]
    pub preset: Option<String>,
    /// Layer pattern, repeated over the layers: F Full Relation, L Linear Relation, A attention,
    /// R RealFormer, N retention, K Kimi Delta Attention (LLLF = the paper's Hybrid).
    #[arg(long, help_heading = "Model")]
    pub pattern: Option<String>,
    /// Model width.
    #[arg(long, help_heading = "Model")]
    pub d_model: Option<usize>,
    /// Number of layers.
    #[arg(long, help_heading = "Model")]
    pub n_layers: Option<usize>,
    /// Number of heads (even, unless --no-givens).
    #[arg(long, help_heading = "Model")]
    pub n_heads: Option<usize>,
    /// FFN width.
    #[arg(long, help_heading = "Model")]
    pub d_ff: Option<usize>,
    /// Self temperature tau_S of the Relation layers (default 2).
    #[arg(long, help_heading = "Model")]
    pub tau: Option<f64>,
    /// Initial count calibration lambda of the Full Relation layers (default 0.5).
    #[arg(long, help_heading = "Model")]
    pub lambda_init: Option<f64>,
    /// Keep lambda fixed at --lambda-init (ablation: --lambda-init 0 --freeze-lambda is Relation
    /// without count calibration).
    #[arg(long, help_heading = "Model")]
    pub freeze_lambda: bool,
    /// Turn Givens head mixing off (ablation); also allows an odd head count, e.g. --n-heads 1
    /// for the single-head Relation.
    #[arg(long, help_heading = "Model")]
    pub no_givens: bool,

    // Data.
    /// Training text: files, folders (.txt, .md, .jsonl inside) or JSON Lines with a `text`
    /// field; repeat for several. Default: the shipped corpus (Moby Dick).
    #[arg(long = "data", value_name = "PATH", help_heading = "Data")]
    pub data: Vec<PathBuf>,
    /// Share of the text held out for validation (default 0.05).
    #[arg(long, help_heading = "Data")]
    pub val_fraction: Option<f64>,
    /// How the text is split: hash (default; by a hash of each document or paragraph group) or
    /// contiguous (first 1 - 2 v of the bytes train, the next v validate, the last v is unread).
    #[arg(long, value_enum, help_heading = "Data")]
    pub split: Option<crate::config::SplitMode>,
    /// Vocabulary of the BPE tokenizer trained on the training split (default 4096).
    #[arg(long, help_heading = "Data")]
    pub vocab_size: Option<usize>,
    /// Use this tokenizer.json instead of training one.
    #[arg(long, value_name = "FILE", help_heading = "Data")]
    pub tokenizer: Option<PathBuf>,
    /// Cache for tokenizers and tokenized corpora (default ~/.cache/relation).
    #[arg(long, value_name = "DIR", help_heading = "Data")]
    pub cache_dir: Option<PathBuf>,

    // Optimisation.
    /// Optimizer steps in the whole run (default 250).
    #[arg(long, help_heading = "Training")]
    pub steps: Option<u64>,
    /// Context length in tokens (default 128).
    #[arg(long, help_heading = "Training")]
    pub seq_len: Option<usize>,
    /// Sequences per forward/backward pass (default 16).
    #[arg(long, help_heading = "Training")]
    pub batch_size: Option<usize>,
    /// Tokens per optimizer step; micro-batches are accumulated to reach it (default 2048).
    #[arg(long, help_heading = "Training")]
    pub tokens_per_step: Option<usize>,
    /// Peak learning rate (default 3e-3).
    #[arg(long, help_heading = "Training")]
    pub lr: Option<f64>,
    /// Final learning rate as a fraction of the peak (default 0).
    #[arg(long, help_heading = "Training")]
    pub min_lr_ratio: Option<f64>,
    /// Linear warm-up steps (default: 10% of --steps).
    #[arg(long, help_heading = "Training")]
    pub warmup_steps: Option<u64>,
    /// Share of the steps in the final decay (default 0.2: WSD80).
    #[arg(long, help_heading = "Training")]
    pub decay_fraction: Option<f64>,
    /// AdamW weight decay on matrices (default 0.1).
    #[arg(long, help_heading = "Training")]
    pub weight_decay: Option<f64>,
    /// Global gradient-norm clip, 0 = off (default 1.0).
    #[arg(long, help_heading = "Training")]
    pub grad_clip: Option<f64>,
    /// Seed of the weights and the data order (default 42).
    #[arg(long, help_heading = "Training")]
    pub seed: Option<u64>,
    /// Evaluate every N steps and at the end (default 50).
    #[arg(long, help_heading = "Training")]
    pub eval_every: Option<u64>,
    /// Validation tokens per evaluation, 0 = all (default 16384).
    #[arg(long, help_heading = "Training")]
    pub eval_tokens: Option<usize>,
    /// Checkpoint every N steps and at the end (default 50).
    #[arg(long, help_heading = "Training")]
    pub checkpoint_every: Option<u64>,
    /// Checkpoints kept (default 2).
    #[arg(long, help_heading = "Training")]
    pub keep_checkpoints: Option<usize>,
    /// Log line every N steps (default 10).
    #[arg(long, help_heading = "Training")]
    pub log_every: Option<u64>,
    /// Tokens to sample at the end, 0 = none (default 120).
    #[arg(long, help_heading = "Training")]
    pub sample_tokens: Option<usize>,
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
    /// Applies the flags to `cfg` (on resume, `train` then checks what they changed).
    fn apply(&self, cfg: &mut RunConfig) {
        set!(
            "--preset": self.preset => cfg.model.preset,
            "--pattern": self.pattern.clone().map(Some) => cfg.model.pattern,
            "--d-model": self.d_model.map(Some) => cfg.model.d_model,
            "--n-layers": self.n_layers.map(Some) => cfg.model.n_layers,
            "--n-heads": self.n_heads.map(Some) => cfg.model.n_heads,
            "--d-ff": self.d_ff.map(Some) => cfg.model.d_ff,
            "--tau": self.tau.map(Some) => cfg.model.tau,
            "--lambda-init": self.lambda_init.map(Some) => cfg.model.lambda_init,
            "--freeze-lambda": self.freeze_lambda.then_some(Some(false)) => cfg.model.lambda_trainable,
            "--no-givens": self.no_givens.then_some(Some(false)) => cfg.model.givens,
            "--val-fraction": self.val_fraction => cfg.data.val_fraction,
            "--split": self.split => cfg.data.split,
            "--vocab-size": self.vocab_size => cfg.data.vocab_size,
            "--tokenizer": self.tokenizer.clone().map(Some) => cfg.data.tokenizer,
            "--seq-len": self.seq_len => cfg.train.seq_len,
            "--batch-size": self.batch_size => cfg.train.batch_size,
            "--tokens-per-step": self.tokens_per_step => cfg.train.tokens_per_step,
            "--lr": self.lr => cfg.train.lr,
            "--min-lr-ratio": self.min_lr_ratio => cfg.train.min_lr_ratio,
            "--warmup-steps": self.warmup_steps.map(Some) => cfg.train.warmup_steps,
            "--decay-fraction": self.decay_fraction => cfg.train.decay_fraction,
            "--weight-decay": self.weight_decay => cfg.train.weight_decay,
            "--grad-clip": self.grad_clip => cfg.train.grad_clip,
            "--seed": self.seed => cfg.train.seed,
        );
        if !self.data.is_empty() {
            cfg.data.sources = self.data.clone();
        }
        if !self.devices.is_empty() {
            cfg.devices = self.devices.clone();
        } else if self.device.is_some() {
            cfg.devices.clear();
        }
        set!(
            "--device": self.device => cfg.device,
            "--cache-dir": self.cache_dir.clone().map(Some) => cfg.data.cache_dir,
            "--steps": self.steps => cfg.train.steps,
            "--eval-every": self.eval_every => cfg.train.eval_every,
            "--eval-tokens": self.eval_tokens => cfg.train.eval_tokens,
            "--checkpoint-every": self.checkpoint_every => cfg.train.checkpoint_every,
            "--keep-checkpoints": self.keep_checkpoints => cfg.train.keep_checkpoints,
            "--log-every": self.log_every => cfg.train.log_every,
            "--sample-tokens": self.sample_tokens => cfg.train.sample_tokens,
        );
    }
}

/// `relation eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// Text to evaluate on (files, folders, JSON Lines; all of it). Default: the run's
    /// validation split.
    #[arg(long = "data", value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// Tokens to evaluate, 0 = all (default 0).
    #[arg(long, default_value_t = 0)]
    pub eval_tokens: usize,
    /// Device (default: the run's).
    #[arg(long)]
    pub device: Option<String>,
}

/// `relation generate`.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct GenerateArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
    /// The text to continue; `-` reads it from standard input.
    #[arg(long, default_value = "Call me", conflicts_with = "prompt_file")]
    pub prompt: String,
    /// Read the text to continue from this file.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// End the continuation where this text appears (repeatable; the text itself is not
    /// printed). Generation always ends at the end-of-text token.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// A prompt longer than the run's context (train.seq_len tokens) is refused unless this
    /// is given; then only its last seq_len tokens are used.
    #[arg(long)]
    pub truncate_prompt: bool,
    /// Tokens to generate.
    #[arg(long, default_value_t = 200)]
    pub max_new_tokens: usize,
    /// Softmax temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens with this much probability (1 = all).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f64,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of samples.
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Device (default: the run's).
    #[arg(long)]
    pub device: Option<String>,
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs a parsed command line.
///
/// # Errors
/// Whatever the subcommand reports.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => run_train(&args),
        Command::Eval(args) => run_eval(&args),
        Command::Generate(args) => crate::sample::run_generate(&args),
        Command::Report(args) => run_report(&args),
        Command::Export(args) => crate::sample::run_export(&args),
    }
}

/// A new default run directory `runs/<preset>-<unix seconds>[-n]`, claimed by creating it, so
/// two runs started in the same second get two directories.
fn new_run_dir(preset: &str) -> Result<PathBuf> {
    let root = PathBuf::from("runs");
    std::fs::create_dir_all(&root).map_err(io(&root))?;
    let stem = format!("{preset}-{}", unix_seconds());
    for n in 1u32.. {
        let dir = if n == 1 {
            root.join(&stem)
        } else {
            root.join(format!("{stem}-{n}"))
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(&dir)(e)),
        }
    }
    unreachable!("u32 suffixes run out")
}

fn run_report(args: &ReportArgs) -> Result<()> {
    let runs = crate::report::read_runs(&args.runs)?;
    if runs.is_empty() {
        return Err(TrainError::RunDir {
            path: args.runs.clone(),
            reason: "holds no `<variant>-s<seed>` run with a metrics.csv".into(),
        });
    }
    std::fs::create_dir_all(&args.out).map_err(crate::error::io(&args.out))?;
    let table = crate::report::table(&runs, &args.baseline);
    let path = args.out.join("table.md");
    std::fs::write(&path, &table).map_err(crate::error::io(&path))?;
    println!("{table}");
    for r in runs.iter().filter(|r| !r.finished()) {
        println!(
            "unfinished (not in the table): {}-s{} at step {}/{}",
            r.variant, r.seed, r.last_step, r.steps
        );
    }
    if let Err(e) = crate::report::plots(&runs, &args.baseline, &args.out) {
        eprintln!("warning: no plots ({e})");
    }
    println!("wrote {}, val.png, gap.png", path.display());
    Ok(())
}

fn run_train(args: &TrainArgs) -> Result<()> {
    // Resume when asked, when --from-checkpoint names where, or (auto) when there is a run.
    let resume = match (args.resume, &args.run_dir) {
        (Some(ResumeMode::Auto), Some(dir)) => checkpoint::any(dir),
        (Some(_), _) => true,
        (None, _) => args.from_checkpoint.is_some(),
    };
    let base = if resume {
        let dir = args.run_dir.as_ref().expect("clap requires --run-dir");
        let path = dir.join("config.json");
        if !path.exists() {
            return Err(TrainError::RunDir {
                path: dir.clone(),
                reason: "has no config.json, so there is no run to resume".into(),
            });
        }
        RunConfig::load(&path)?
    } else {
        RunConfig::default()
    };
    let mut config = match &args.config {
        Some(path) => RunConfig::load_onto(&base, path)?,
        None => base,
    };
    args.apply(&mut config);
    let run_dir = match &args.run_dir {
        Some(dir) => dir.clone(),
        None => new_run_dir(&config.model.preset)?,
    };
    let corpus_name = if config.data.sources.is_empty() {
        DEFAULT_CORPUS_NAME.to_string()
    } else {
        config
            .data
            .sources
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("run: {} | data: {corpus_name}", run_dir.display());
    let summary = train(
        config.clone(),
        &TrainOptions {
            run_dir,
            resume,
            from_checkpoint: args.from_checkpoint.clone(),
            overwrite: args.overwrite,
            stop_at: args.stop_at,
            no_progress: args.no_progress,
            on_nan: args.on_nan,
            max_skipped_steps: args.max_skipped_steps,
        },
    )?;
    println!();
    println!(
        "{} at step {}/{}: {} tokens seen, {:.0} tokens/s on {} this session, {:.2}M parameters",
        if summary.finished {
            "finished"
        } else {
            "stopped"
        },
        summary.step,
        config.train.steps,
        summary.tokens_seen,
        summary.tokens_per_s,
        config.device_names().join(" + "),
        summary.params as f64 / 1e6
    );
    if let Some(v) = summary.validation {
        let reference = if config.data.sources.is_empty() {
            format!(" (xz -9e: {XZ_BITS_PER_BYTE_MOBY} bits/byte)")
        } else {
            String::new()
        };
        println!(
            "validation: loss {:.4} nats/token | perplexity {:.2} | {:.3} bits/byte{reference}",
            v.loss, v.perplexity, v.bits_per_byte
        );
    }
    if let Some((prompt, continuation)) = summary.sample {
        println!("sample (temperature 0.8, top-k 40, top-p 0.95):");
        println!("  {prompt}⟨{continuation}⟩");
    }
    println!(
        "checkpoint: {} | metrics: {}/metrics.csv | curve: {}/loss.png",
        summary.checkpoint.display(),
        summary.run_dir.display(),
        summary.run_dir.display()
    );
    if !summary.finished {
        println!(
            "continue with: relation train --resume --run-dir {}",
            summary.run_dir.display()
        );
    }
    Ok(())
}

pub(crate) fn device_for(
    run_dir: &std::path::Path,
    flag: &Option<String>,
) -> Result<burn::tensor::Device> {
    let name = match flag {
        Some(name) => name.clone(),
        None => RunConfig::load(&run_dir.join("config.json"))
            .map(|c| c.device_names().remove(0))
            .unwrap_or_else(|_| "flex".into()),
    };
    Ok(parse_device(&name)?)
}

fn run_eval(args: &EvalArgs) -> Result<()> {
    let device = device_for(&args.run_dir, &args.device)?;
    let run = load_run(&args.run_dir, args.checkpoint.as_deref(), &device)?;
    let t = &run.config.train;
    let (stream, bytes, what) = if args.data.is_empty() {
        let corpus = data::prepare(&run.config.data, &mut |line| println!("{line}"))?;
        // The split is rebuilt from the run's sources: refuse it if they no longer give the
        // tokenizer the run was trained with (the validation tokens would not be the run's).
        let saved = args.run_dir.join("tokenizer.json");
        if std::fs::read_to_string(&saved).map_err(io(&saved))? != corpus.tokenizer_json {
            return Err(TrainError::RunDir {
                path: args.run_dir.clone(),
                reason: "its data no longer gives the tokenizer it was trained with (tokenizer.json differs: the corpus changed since the run started); evaluate on explicit text with --data instead".into(),
            });
        }
        let bytes_per_token = corpus.meta.val_bytes as f64 / corpus.meta.val_tokens as f64;
        (
            corpus.val,
            bytes_per_token,
            "the run's validation split".to_string(),
        )
    } else {
        let docs = data::read_documents(&args.data)?;
        let texts: Vec<&str> = docs.iter().map(|d| d.text.as_str()).collect();
        let stream = data::encode_units(&run.tokenizer, &texts)?;
        let bytes: usize = texts.iter().map(|t| t.len()).sum();
        (
            stream.clone(),
            bytes as f64 / stream.len() as f64,
            format!("{} documents", docs.len()),
        )
    };
    let result = evaluate(
        &run.model,
        &stream,
        t.seq_len,
        t.batch_size,
        args.eval_tokens,
        bytes,
    )?;
    println!(
        "{} (step {}) on {what}: {} tokens | loss {:.4} nats/token | perplexity {:.2} | {:.3} bits/byte",
        run.checkpoint.display(),
        run.step,
        result.tokens,
        result.loss,
        result.perplexity,
        result.bits_per_byte
    );
    Ok(())
}
