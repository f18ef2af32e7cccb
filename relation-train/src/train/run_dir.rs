//! The run directory's life cycle: when a folder is a run, what a fresh start clears, what a
//! resume may change and how the changes are recorded.

use std::fs;
use std::path::Path;

use super::TrainOptions;
use crate::checkpoint;
use crate::config::{Change, RunConfig};
use crate::error::io;
use crate::fs::write_atomic;
use crate::{Result, TrainError};

/// The files that make a run (all `train` writes besides the lock); what `--overwrite` and a
/// restart after a failed first start remove. Nothing else in the folder is touched.
const RUN_FILES: &[&str] = &[
    "config.json",
    "model.json",
    "tokenizer.json",
    "data.json",
    "metrics.jsonl",
    "metrics.csv",
    "loss.png",
    "changes.jsonl",
];

fn clear_run(run: &Path) -> Result<()> {
    for name in RUN_FILES {
        let path = run.join(name);
        if path.exists() {
            fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    let checkpoints = run.join("checkpoints");
    if checkpoints.exists() {
        fs::remove_dir_all(&checkpoints).map_err(io(&checkpoints))?;
    }
    crate::fs::sync_dir(run)
}

/// How this invocation starts.
pub(super) enum Start {
    /// From step 0: a new run, or one whose earlier start left no checkpoint.
    Fresh,
    /// From a checkpoint, with these recorded changes of the configuration.
    Resume(Vec<Change>),
}

/// Decides how to start in the (locked) run directory, clearing what a fresh start replaces;
/// says through `log` what it decided when that is not the plain fresh start or resume.
pub(super) fn open_run(
    config: &RunConfig,
    opts: &TrainOptions,
    log: &mut dyn FnMut(String),
) -> Result<Start> {
    let run = &opts.run_dir;
    let has_checkpoint = checkpoint::any(run);
    let refuse = |reason: String| TrainError::RunDir {
        path: run.clone(),
        reason,
    };
    if opts.resume {
        let path = run.join("config.json");
        if !path.exists() {
            return Err(refuse(
                "has no config.json, so there is no run to resume".into(),
            ));
        }
        let saved = RunConfig::load(&path).map_err(|e| {
            refuse(format!(
                "its config.json cannot be read, so the run cannot be resumed ({e}); repair the file (the checkpoints are untouched)"
            ))
        })?;
        let changes = config.changes_since(&saved)?;
        if has_checkpoint {
            return Ok(Start::Resume(changes));
        }
        if let Some(name) = &opts.from_checkpoint {
            return Err(TrainError::Invalid {
                name: "--from-checkpoint",
                value: name.clone(),
                rule: "the run has no checkpoint yet".into(),
            });
        }
        log(
            "resume: the run has no checkpoint yet (its first start stopped before one); starting from step 0 with its configuration".into(),
        );
    } else if has_checkpoint {
        if !opts.overwrite {
            let at = checkpoint::latest(run)
                .ok()
                .flatten()
                .map_or_else(String::new, |d| {
                    format!(" (latest checkpoint: {})", d.display())
                });
            return Err(refuse(format!(
                "already holds a run; pass --resume to continue it, --overwrite to discard it, or choose another --run-dir{at}"
            )));
        }
        log(format!(
            "overwrite: discarding the run in {}",
            run.display()
        ));
    } else if run.join("config.json").exists() {
        log(
            "run directory: an earlier start left no checkpoint; starting afresh with this configuration".into(),
        );
    }
    clear_run(run)?;
    Ok(Start::Fresh)
}

/// Appends the changes to the run's `changes.jsonl` and saves the configuration they make;
/// names each change through `log`.
pub(super) fn record_changes(
    run: &Path,
    step: u64,
    changes: &[Change],
    config: &RunConfig,
    log: &mut dyn FnMut(String),
) -> Result<()> {
    let path = run.join("changes.jsonl");
    let mut lines = if path.exists() {
        fs::read_to_string(&path).map_err(io(&path))?
    } else {
        String::new()
    };
    for c in changes {
        let line = serde_json::json!({ "step": step, "key": c.key, "from": c.from, "to": c.to });
        lines.push_str(&line.to_string());
        lines.push('\n');
        log(format!(
            "resume: {} changes from {} to {} at step {step}; recorded in changes.jsonl (the run is no longer reproducible from its first configuration alone)",
            c.key, c.from, c.to
        ));
    }
    write_atomic(&path, lines.as_bytes())?;
    let json = serde_json::to_string_pretty(config).expect("config serializes");
    write_atomic(&run.join("config.json"), json.as_bytes())
}
