//! `relation export`: a run's checkpoint as a standalone model (the writing itself is
//! [`crate::sample::export_safetensors`] and [`crate::hf::export_hf`]), and `relation import`:
//! a Hugging Face folder back into a run directory ([`crate::hf::import_hf`]).

use std::path::PathBuf;

use clap::Args;

use super::RunSource;
use crate::hf::{HfDtype, export_hf, import_hf};
use crate::sample::export_safetensors;
use crate::{Result, TrainError};

/// Formats `relation export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// `safetensors` (tensor names are module paths, e.g. `blocks.0.mixer.projection.w1.weight`).
    Safetensors,
    /// A Hugging Face transformers folder (`config.json`, `model.safetensors` in PyTorch's
    /// names and layouts, the tokenizer, and the PyTorch model code), which
    /// `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` loads.
    Hf,
}

/// `relation export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The run, and which of its checkpoints.
    #[command(flatten)]
    pub source: RunSource,
    /// What to write.
    #[arg(long, value_enum, default_value_t = ExportFormat::Safetensors)]
    pub format: ExportFormat,
    /// `safetensors`: the weights file (default: RUN_DIR/export/model.safetensors), with
    /// model.json and tokenizer.json written beside it. `hf`: the folder (default:
    /// RUN_DIR/export/hf), created; an earlier export there is replaced, other files refused.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Element type of the weights of an `hf` folder: f32 (exact), bf16 or f16.
    #[arg(long, value_enum)]
    pub dtype: Option<HfDtype>,
}

/// Formats `relation import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFormat {
    /// A Hugging Face folder as `relation export --format hf` writes it (or as PyTorch's
    /// `save_pretrained` writes it back after fine-tuning).
    Hf,
}

/// `relation import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// What the folder is.
    #[arg(long = "from", value_enum)]
    pub from: ImportFormat,
    /// The folder to read.
    #[arg(value_name = "DIR")]
    pub folder: PathBuf,
    /// The run directory to write (new or empty): config.json, model.json, tokenizer.json and
    /// a step-0 checkpoint, which `relation eval`, `generate` and `export` read.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
}

/// Runs `relation import`.
///
/// # Errors
/// A folder that is not a Relation model or does not fit its configuration; an output that
/// is not empty; file-system failures.
pub(super) fn run_import(args: &ImportArgs) -> Result<()> {
    let summary = match args.from {
        ImportFormat::Hf => import_hf(&args.folder, &args.run_dir)?,
    };
    println!(
        "imported {} ({} layers `{}`, {} parameters, {}) into {}; checkpoint {}",
        args.folder.display(),
        summary.layers,
        summary.pattern,
        summary.parameters,
        summary.dtype,
        summary.run_dir.display(),
        summary.checkpoint.display()
    );
    Ok(())
}

/// Runs `relation export`.
///
/// # Errors
/// A run or checkpoint that cannot be loaded; unwritable output.
pub(super) fn run_export(args: &ExportArgs) -> Result<()> {
    // The run's own device (any backend can write safetensors).
    let run = args.source.load(&None)?;
    let run_dir = &args.source.run_dir;
    match args.format {
        ExportFormat::Safetensors => {
            if let Some(dtype) = args.dtype {
                return Err(TrainError::Invalid {
                    name: "--dtype",
                    value: format!("{dtype:?}").to_lowercase(),
                    rule: "applies to --format hf; --format safetensors writes the weights as the model holds them".into(),
                });
            }
            let out = (args.out.clone())
                .unwrap_or_else(|| run_dir.join("export").join("model.safetensors"));
            export_safetensors(&run, run_dir, &out)?;
            println!(
                "exported {} (step {}) to {} with model.json and tokenizer.json beside it; load with RelationLmConfig from model.json, then RelationLm::import_safetensors",
                run.checkpoint.display(),
                run.step,
                out.display()
            );
        }
        ExportFormat::Hf => {
            let out = (args.out.clone()).unwrap_or_else(|| run_dir.join("export").join("hf"));
            export_hf(&run, run_dir, &out, args.dtype.unwrap_or_default())?;
            println!(
                "exported {} (step {}) to {} as a Hugging Face folder; in Python: AutoModelForCausalLM.from_pretrained(\"{}\", trust_remote_code=True)",
                run.checkpoint.display(),
                run.step,
                out.display(),
                out.display()
            );
        }
    }
    Ok(())
}
