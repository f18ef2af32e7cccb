//! The `relation` command line: `train`, `eval`, `generate`, `export`, `import`, `report`.
//!
//! This file holds the commands and the small subcommands; `train_args.rs` holds `train`'s
//! many flags and how they override a configuration, `progress.rs` how `train` shows a run
//! as it goes, `generate.rs` the `generate` command and `export.rs` the `export` and `import`
//! commands.

mod export;
mod generate;
mod progress;
mod train_args;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
pub use export::{ExportArgs, ExportFormat, ImportArgs, ImportFormat};
pub use generate::GenerateArgs;
use relation_kernels::device::parse_device;
pub use train_args::{DataFlags, ModelFlags, TrainArgs, TrainingFlags};

use crate::config::{Packing, RunConfig};
use crate::data::{self, DEFAULT_CORPUS_NAME};
use crate::error::io;
use crate::evaluate::{EvalOptions, LoadedRun, ScoredWindow, evaluate, evaluate_each, load_run};
use crate::ranks::Ranks;
use crate::train::{TrainOptions, XZ_BITS_PER_BYTE_MOBY, train_with};
use crate::{Result, TrainError, checkpoint};
use progress::Console;

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
    /// Read a model written elsewhere (a Hugging Face folder) into a new run directory.
    Import(ImportArgs),
    /// Serve a run's checkpoint over HTTP: the OpenAI-compatible completions API, requests
    /// decoded together (continuous batching).
    Serve(crate::serve::ServeArgs),
}

/// The run (and checkpoint) that `eval`, `generate`, `export` and `serve` read.
#[derive(Debug, Args)]
pub struct RunSource {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// A checkpoint directory (default: the run's latest).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: Option<PathBuf>,
}

impl RunSource {
    /// The checkpoint, loaded on the `--device` given, else on the run's own first device
    /// (`flex` if its configuration is unreadable).
    ///
    /// # Errors
    /// A device that cannot be used; a run or checkpoint that cannot be loaded.
    pub(crate) fn load(&self, device: &Option<String>) -> Result<LoadedRun> {
        let name = match device {
            Some(name) => name.clone(),
            None => RunConfig::load(&self.run_dir.join("config.json"))
                .map(|c| c.device_names().remove(0))
                .unwrap_or_else(|_| "flex".into()),
        };
        let device = parse_device(&name)?;
        load_run(&self.run_dir, self.checkpoint.as_deref(), &device)
    }
}

/// The dtype a decoder keeps its per-token caches in (`--cache-dtype`): the Relation Cache of
/// the Full layers and the K/V cache of attention layers. Recurrent states stay in the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CacheDtype {
    /// The model's compute dtype.
    #[default]
    Model,
    /// f16: half the memory and half the bytes a decoding step reads (11-bit mantissa).
    F16,
    /// bf16: as f16, with f32's range and an 8-bit mantissa.
    Bf16,
    /// f32.
    F32,
}

impl CacheDtype {
    /// The storage dtype, `None` for the model's.
    pub fn dtype(self) -> Option<burn::tensor::DType> {
        use burn::tensor::DType;
        match self {
            Self::Model => None,
            Self::F16 => Some(DType::F16),
            Self::Bf16 => Some(DType::BF16),
            Self::F32 => Some(DType::F32),
        }
    }
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
    #[arg(value_name = "DIR", required_unless_present_any = ["long_context", "budgets"])]
    pub runs: Option<PathBuf>,
    /// Instead of runs: plot the CSV of `scripts/bench/long-context.sh` (tokens/s and peak
    /// memory against the sequence length) into `long-context.png`.
    #[arg(long, value_name = "CSV", conflicts_with = "runs")]
    pub long_context: Option<PathBuf>,
    /// Instead of one folder of runs: several budgets of the same grid, `NAME=DIR` each
    /// (e.g. `--budget 2m=docs/results/budget/2m/runs --budget 8m=...`). Writes `budget.md`
    /// (every variant's difference to the baseline at every budget, paired by seed) and
    /// `budget.png` (that difference against the training tokens).
    #[arg(long = "budget", value_name = "NAME=DIR", conflicts_with_all = ["runs", "long_context"])]
    pub budgets: Vec<String>,
    /// Where `table.md`, `seeds.md`, `val.png` and `gap.png` (or `long-context.png`, or
    /// `budget.md` and `budget.png`) go (created).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The variant the others are compared with.
    #[arg(long, default_value = "A")]
    pub baseline: String,
    /// The steps of `seeds.md`'s mean validation curve, comma separated (default: every step
    /// some run evaluated).
    #[arg(long, value_delimiter = ',', value_name = "STEPS")]
    pub curve_steps: Vec<u64>,
}

/// `relation eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The run, and which of its checkpoints.
    #[command(flatten)]
    pub source: RunSource,
    /// Text to evaluate on (files, folders, JSON Lines; all of it). Default: the run's
    /// validation split.
    #[arg(long = "data", value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// Tokens to evaluate, 0 = all (default 0).
    #[arg(long, default_value_t = 0)]
    pub eval_tokens: usize,
    /// Row layout: documents (each document scored alone) or windows (one causal sequence per
    /// window); default (or auto): the run's own, which its logged validation losses used.
    #[arg(long, value_enum)]
    pub packing: Option<crate::config::Packing>,
    /// Device (default: the run's).
    #[arg(long)]
    pub device: Option<String>,
    /// Also write every predicted token's log-likelihood to FILE, JSON Lines, one line per
    /// window: `{"tokens": [n + 1 ids], "logprobs": [n values], "packing": ...}` with
    /// `logprobs[k] = log p(tokens[k+1] | tokens[..=k])` in nats.
    #[arg(long, value_name = "FILE")]
    pub per_token: Option<PathBuf>,
}

/// Seconds since the Unix epoch (0 before it).
pub(crate) fn unix_seconds() -> u64 {
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
        Command::Generate(args) => generate::run_generate(&args),
        Command::Report(args) => run_report(&args),
        Command::Export(args) => export::run_export(&args),
        Command::Import(args) => export::run_import(&args),
        Command::Serve(args) => crate::serve::run_serve(&args),
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
    std::fs::create_dir_all(&args.out).map_err(crate::error::io(&args.out))?;
    if !args.budgets.is_empty() {
        let mut budgets = Vec::new();
        for spec in &args.budgets {
            let Some((name, dir)) = spec.split_once('=') else {
                return Err(TrainError::Invalid {
                    name: "--budget",
                    value: spec.clone(),
                    rule: "expected NAME=DIR, e.g. 2m=docs/results/budget/2m/runs".into(),
                });
            };
            let runs = crate::report::read_runs(std::path::Path::new(dir))?;
            budgets.push(crate::report::Budget {
                name: name.to_string(),
                runs,
            });
        }
        let table =
            crate::report::budget_report(&budgets, &args.baseline, &args.out).map_err(|rule| {
                TrainError::Invalid {
                    name: "--budget",
                    value: args.budgets.join(" "),
                    rule,
                }
            })?;
        let path = args.out.join("budget.md");
        std::fs::write(&path, &table).map_err(crate::error::io(&path))?;
        println!("{table}");
        println!("wrote {} and budget.png", path.display());
        return Ok(());
    }
    let Some(dir) = &args.runs else {
        let csv = args
            .long_context
            .as_ref()
            .expect("clap: runs or --long-context");
        let path = crate::report::long_context_plot(csv, &args.out)?;
        println!("wrote {}", path.display());
        return Ok(());
    };
    let runs = crate::report::read_runs(dir)?;
    if runs.is_empty() {
        return Err(TrainError::RunDir {
            path: dir.clone(),
            reason: "holds no `<variant>-s<seed>` run with a metrics.csv".into(),
        });
    }
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
    let steps = (!args.curve_steps.is_empty()).then_some(args.curve_steps.as_slice());
    let seeds = crate::report::seed_tables(&runs, &args.baseline, steps);
    let seeds_path = args.out.join("seeds.md");
    std::fs::write(&seeds_path, &seeds).map_err(crate::error::io(&seeds_path))?;
    if let Err(e) = crate::report::plots(&runs, &args.baseline, &args.out) {
        eprintln!("warning: no plots ({e})");
    }
    println!("wrote {}, seeds.md, val.png, gap.png", path.display());
    Ok(())
}

fn run_train(args: &TrainArgs) -> Result<()> {
    // One process, or one rank of several started by an MPI launcher (the `mpi` feature; a
    // build without it refuses to be one of several).
    let (ranks, session) = Ranks::from_launcher()?;
    let ranks = std::sync::Arc::new(ranks);
    if ranks.size() == 1 {
        return train_command(args, ranks);
    }
    ranks.abort_on_panic();
    let (rank, size) = (ranks.rank(), ranks.size());
    match train_command(args, ranks.clone()) {
        Ok(()) => Ok(()),
        // Every rank stopped after the same step; rank 0 wrote the checkpoint and says so, before
        // MPI is finalized (a rank that exits non-zero makes the launcher end the others).
        Err(e @ TrainError::Stopped { .. }) => {
            if rank == 0 {
                eprintln!("error: {e}");
            }
            drop(session);
            std::process::exit(1);
        }
        // A rank that failed ends them all, rather than leaving them waiting for it.
        Err(e) => {
            eprintln!("error (rank {rank} of {size}): {e}");
            ranks.abort(1)
        }
    }
}

/// `relation train` in this process: the whole run, or this rank's part of it.
fn train_command(args: &TrainArgs, ranks: std::sync::Arc<Ranks>) -> Result<()> {
    if !ranks.is_root() {
        return follow_train(args, ranks);
    }
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
    let mut console = Console::new(!args.no_progress);
    let summary = train_with(
        config.clone(),
        &TrainOptions {
            run_dir,
            resume,
            from_checkpoint: args.from_checkpoint.clone(),
            overwrite: args.overwrite,
            stop_at: args.stop_at,
            on_nan: args.on_nan,
            max_skipped_steps: args.max_skipped_steps,
            stop: Some(stop_on_signals()?),
            ranks: ranks.clone(),
            #[cfg(feature = "testing")]
            faults: args.faults(),
        },
        &mut |event| console.show(event),
    );
    console.close(summary.is_ok());
    let summary = summary?;
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
    println!(
        "model FLOP/s: {:.1} GFLOP/s ({:.1} MFLOP per training token)",
        summary.tokens_per_s * summary.flops_per_token / 1e9,
        summary.flops_per_token / 1e6
    );
    if ranks.size() > 1 {
        println!(
            "MPI: {} ranks; rank 0 spent {:.1} % of its step time exchanging losses and gradients ({:.2} s of {:.2} s)",
            ranks.size(),
            100.0 * summary.comm_seconds / summary.step_seconds.max(1e-9),
            summary.comm_seconds,
            summary.step_seconds
        );
    }
    if let Some(mib) = summary.peak_rss_mib {
        println!("peak resident memory: {mib:.0} MiB");
    }
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

fn run_eval(args: &EvalArgs) -> Result<()> {
    let run = args.source.load(&args.device)?;
    let (stream, bytes, what) = if args.data.is_empty() {
        let corpus = data::prepare(&run.config.data, &mut |line| println!("{line}"))?;
        // The split is rebuilt from the run's sources: refuse it if they no longer give the
        // tokenizer the run was trained with (the validation tokens would not be the run's).
        let saved = args.source.run_dir.join("tokenizer.json");
        if std::fs::read_to_string(&saved).map_err(io(&saved))? != corpus.tokenizer_json {
            return Err(TrainError::RunDir {
                path: args.source.run_dir.clone(),
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
    // The run's own layout (packed documents or windows), so the loss compares with the
    // validation losses it logged.
    let packing = match args.packing {
        None | Some(Packing::Auto) => run.config.data.packing,
        Some(chosen) => chosen,
    };
    let eot = run.tokenizer.token_to_id(data::EOT);
    let opts = EvalOptions::for_run(&run.config, packing, args.eval_tokens, bytes, eot);
    let result = match &args.per_token {
        None => evaluate(&run.model, &stream, &opts)?,
        Some(path) => {
            let mut lines = String::new();
            let mut write = |window: ScoredWindow<'_>| -> Result<()> {
                let line = serde_json::json!({
                    "tokens": window.tokens,
                    "logprobs": window.logprobs,
                    "packing": packing.name(),
                });
                lines.push_str(&line.to_string());
                lines.push('\n');
                Ok(())
            };
            let result = evaluate_each(&run.model, &stream, &opts, Some(&mut write))?;
            crate::fs::write_atomic(path, lines.as_bytes())?;
            result
        }
    };
    println!(
        "{} (step {}) on {what} ({} rows): {} tokens | loss {:.4} nats/token | perplexity {:.2} | {:.3} bits/byte",
        run.checkpoint.display(),
        run.step,
        packing.name(),
        result.tokens,
        result.loss,
        result.perplexity,
        result.bits_per_byte
    );
    Ok(())
}

/// A flag that SIGTERM or SIGINT sets (on Unix), so that a run stops cleanly after its current
/// step with a checkpoint ([`TrainOptions::stop`]): schedulers send SIGTERM at a time limit or
/// on preemption, people press Ctrl-C. A second signal while the first is pending ends the
/// process at once (exit code 1), for a run that must not wait for its step.
fn stop_on_signals() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    #[cfg(unix)]
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // The shutdown is registered first: it sees the flag as the previous signal left it.
        signal_hook::flag::register_conditional_shutdown(signal, 1, flag.clone())
            .and_then(|_| signal_hook::flag::register(signal, flag.clone()))
            .map_err(|e| TrainError::Data(format!("installing the signal handlers: {e}")))?;
    }
    Ok(flag)
}

/// A rank other than 0 of a multi-process run: trains its share of every step with rank 0's
/// configuration and data (its own flags only open the MPI world), prints nothing and writes
/// nothing; rank 0 reports for the run.
fn follow_train(args: &TrainArgs, ranks: std::sync::Arc<Ranks>) -> Result<()> {
    let mut config = RunConfig::default();
    args.apply(&mut config);
    train_with(
        config,
        &TrainOptions {
            run_dir: args.run_dir.clone().unwrap_or_default(),
            stop: Some(stop_on_signals()?),
            ranks,
            #[cfg(feature = "testing")]
            faults: args.faults(),
            ..TrainOptions::default()
        },
        &mut |_| {},
    )?;
    Ok(())
}
