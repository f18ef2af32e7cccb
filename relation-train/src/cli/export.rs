//! `relation export`: a run's checkpoint as a standalone model (the writing itself is
//! [`crate::sample::export_safetensors`]).

use std::path::PathBuf;

use clap::Args;

use super::RunSource;
use crate::Result;
use crate::sample::export_safetensors;

/// Formats `relation export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// `safetensors` (tensor names are module paths, e.g. `blocks.0.mixer.projection.w1.weight`).
    Safetensors,
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
    /// The weights file (default: RUN_DIR/export/model.safetensors); model.json and
    /// tokenizer.json are written into the same folder.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Runs `relation export`.
///
/// # Errors
/// A run or checkpoint that cannot be loaded; unwritable output.
pub(super) fn run_export(args: &ExportArgs) -> Result<()> {
    // The run's own device (any backend can write safetensors).
    let run = args.source.load(&None)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.source.run_dir.join("export").join("model.safetensors"));
    match args.format {
        ExportFormat::Safetensors => export_safetensors(&run, &args.source.run_dir, &out)?,
    }
    println!(
        "exported {} (step {}) to {} with model.json and tokenizer.json beside it; load with RelationLmConfig from model.json, then RelationLm::import_safetensors",
        run.checkpoint.display(),
        run.step,
        out.display()
    );
    Ok(())
}
