//! Checkpoints: model weights, optimizer state, step, data position and seed, written so that a
//! crash at any moment leaves the previous checkpoint intact and findable.
//!
//! ```text
//! run/checkpoints/
//!   step-00000200/  model.bpk  optim.bpk  state.json   (sizes + CRC32 of both files)
//!   step-00000300/  …
//!   latest          "step-00000300"
//! ```
//!
//! A save writes everything into `.tmp-step-N/`, renames that directory to `step-N/` (atomic on
//! one file system), then replaces `latest` through a temporary file and a rename. A reader
//! follows `latest`, so it only ever sees complete checkpoints; leftover `.tmp-*` directories
//! from an interrupted save are removed by the next save. On load, the sizes and CRC32s in
//! `state.json` and the fingerprints of the model configuration and the tokenizer are checked,
//! so a truncated, corrupted or foreign checkpoint is refused with a message instead of being
//! loaded or overwritten.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::optim::ModuleOptimizer;
use relation_model::RelationLm;
use serde::{Deserialize, Serialize};

use crate::data::DataPosition;
use crate::error::io;
use crate::fs::{sync_dir, sync_file, write_atomic};
use crate::{Result, TrainError};

/// Version of the `state.json` layout.
pub const FORMAT: u32 = 1;

/// Size and checksum of one checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    /// Bytes.
    pub bytes: u64,
    /// CRC32 (IEEE).
    pub crc32: u32,
}

/// Everything besides the tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointState {
    /// [`FORMAT`].
    pub format: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// Training tokens consumed.
    pub tokens_seen: u64,
    /// Where the data order continues.
    pub position: DataPosition,
    /// Seed of the run (weights and data order).
    pub seed: u64,
    /// Fingerprint of `model.json`.
    pub model_fingerprint: String,
    /// Fingerprint of `tokenizer.json`.
    pub tokenizer_fingerprint: String,
    /// Training time so far, seconds.
    pub elapsed_s: f64,
    /// Sizes and checksums of the tensor files.
    pub files: BTreeMap<String, FileSum>,
    /// Steps whose update was skipped so far because their loss or gradient was not finite
    /// (`--on-nan skip`); absent in checkpoints written before it existed.
    #[serde(default)]
    pub skipped_steps: u64,
    /// The f16 loss scale and its count of finite steps (`--precision f16` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<crate::precision::LossScale>,
}

/// A fingerprint of a text (CRC32 and length), for configuration and tokenizer identity.
pub fn fingerprint(text: &str) -> String {
    format!("{:08x}-{}", crc32fast::hash(text.as_bytes()), text.len())
}

fn sum_file(path: &Path) -> Result<FileSum> {
    let bytes = fs::read(path).map_err(io(path))?;
    Ok(FileSum {
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(&bytes),
    })
}

fn checkpoints_dir(run: &Path) -> PathBuf {
    run.join("checkpoints")
}

fn name_of(step: u64) -> String {
    format!("step-{step:08}")
}

fn bad(path: &Path, reason: impl Into<String>) -> TrainError {
    TrainError::Checkpoint {
        path: path.into(),
        reason: reason.into(),
    }
}

/// Writes a checkpoint of `step` and points `latest` at it; keeps the newest `keep`.
///
/// # Errors
/// Any file-system failure (the previous checkpoint stays the latest).
pub fn save(
    run: &Path,
    model: &RelationLm,
    optim: &ModuleOptimizer,
    state: CheckpointState,
    keep: usize,
) -> Result<PathBuf> {
    save_or_crash(run, model, optim, state, keep, false)
}

/// [`save`], aborting the process after the model file when `crash_after_model` (the fault
/// [`Faults::crash_during_save`](crate::faults::Faults::crash_during_save)).
pub(crate) fn save_or_crash(
    run: &Path,
    model: &RelationLm,
    optim: &ModuleOptimizer,
    mut state: CheckpointState,
    keep: usize,
    crash_after_model: bool,
) -> Result<PathBuf> {
    let root = checkpoints_dir(run);
    fs::create_dir_all(&root).map_err(io(&root))?;
    remove_leftovers(&root)?;
    let name = name_of(state.step);
    let tmp = root.join(format!(".tmp-{name}"));
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;

    let model_path = tmp.join("model.bpk");
    model.save(&model_path)?;
    if crash_after_model {
        tracing::error!("fault crash-during-save: aborting in the middle of a checkpoint write");
        std::process::abort();
    }
    let optim_path = tmp.join("optim.bpk");
    optim
        .save(&optim_path)
        .map_err(|e| bad(&optim_path, format!("writing the optimizer state: {e:?}")))?;
    state.format = FORMAT;
    state.files = BTreeMap::from([
        ("model.bpk".to_string(), sum_file(&model_path)?),
        ("optim.bpk".to_string(), sum_file(&optim_path)?),
    ]);
    let json = serde_json::to_string_pretty(&state).expect("state serializes");
    fs::write(tmp.join("state.json"), &json).map_err(io(tmp.join("state.json")))?;
    // Durable before visible: every file's bytes, then the directory holding their names,
    // are on disk before the rename publishes the checkpoint (see `crate::fs`).
    for file in ["model.bpk", "optim.bpk", "state.json"] {
        sync_file(&tmp.join(file))?;
    }
    sync_dir(&tmp)?;

    let dest = root.join(&name);
    if dest.exists() {
        // Re-saving a step (a resumed run stopped at the same step): move the old one aside
        // first so a crash between the two renames still leaves `latest` valid or pointing
        // at an older complete checkpoint.
        let old = root.join(format!(".tmp-old-{name}"));
        fs::rename(&dest, &old).map_err(io(&dest))?;
        fs::rename(&tmp, &dest).map_err(io(&dest))?;
        fs::remove_dir_all(&old).map_err(io(&old))?;
    } else {
        fs::rename(&tmp, &dest).map_err(io(&dest))?;
    }
    sync_dir(&root)?;
    write_atomic(&root.join("latest"), name.as_bytes())?;
    prune(&root, keep, &name)?;
    let bytes = state.files.values().map(|f| f.bytes).sum::<u64>() + json.len() as u64;
    tracing::info!(path = %dest.display(), step = state.step, bytes, "checkpoint written");
    Ok(dest)
}

fn remove_leftovers(root: &Path) -> Result<()> {
    for entry in fs::read_dir(root).map_err(io(root))?.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(".tmp-") {
            let path = entry.path();
            if path.is_dir() {
                fs::remove_dir_all(&path).map_err(io(&path))?;
            } else {
                fs::remove_file(&path).map_err(io(&path))?;
            }
        }
    }
    Ok(())
}

/// Complete checkpoint directories (`step-N`), oldest first.
pub fn list(run: &Path) -> Result<Vec<PathBuf>> {
    let root = checkpoints_dir(run);
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .map_err(io(&root))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
        })
        .collect();
    dirs.sort();
    Ok(dirs)
}

fn prune(root: &Path, keep: usize, current: &str) -> Result<()> {
    let dirs = list(root.parent().expect("checkpoints has a parent"))?;
    let excess = dirs.len().saturating_sub(keep);
    for dir in dirs.into_iter().take(excess) {
        if dir.file_name().is_some_and(|n| n != current) {
            fs::remove_dir_all(&dir).map_err(io(&dir))?;
            tracing::debug!(path = %dir.display(), keep, "old checkpoint pruned");
        }
    }
    Ok(())
}

/// The checkpoint `latest` points at, or `None` for a run without checkpoints.
///
/// # Errors
/// [`TrainError::Checkpoint`] if `latest` is unreadable or names a missing directory.
pub fn latest(run: &Path) -> Result<Option<PathBuf>> {
    let pointer = checkpoints_dir(run).join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = fs::read_to_string(&pointer).map_err(io(&pointer))?;
    let name = name.trim();
    if !name.starts_with("step-") || name.contains(['/', '\\']) {
        return Err(bad(
            &pointer,
            format!("does not name a checkpoint: {name:?}"),
        ));
    }
    let dir = checkpoints_dir(run).join(name);
    if !dir.is_dir() {
        return Err(bad(
            &pointer,
            format!("points at {name}, which does not exist"),
        ));
    }
    Ok(Some(dir))
}

/// Reads and verifies a checkpoint's state: format, file sizes and checksums, and that it was
/// made for this model configuration and tokenizer.
///
/// # Errors
/// [`TrainError::Checkpoint`] naming what does not match.
pub fn verify(dir: &Path, model_json: &str, tokenizer_json: &str) -> Result<CheckpointState> {
    let state_path = dir.join("state.json");
    let text = fs::read_to_string(&state_path).map_err(|e| bad(&state_path, e.to_string()))?;
    let state: CheckpointState =
        serde_json::from_str(&text).map_err(|e| bad(&state_path, format!("corrupt: {e}")))?;
    if state.format != FORMAT {
        return Err(bad(
            &state_path,
            format!(
                "format {} is not {FORMAT}, the one this build reads",
                state.format
            ),
        ));
    }
    for file in ["model.bpk", "optim.bpk"] {
        let path = dir.join(file);
        let expected = state
            .files
            .get(file)
            .ok_or_else(|| bad(&state_path, format!("lists no {file}")))?;
        let actual = sum_file(&path).map_err(|e| bad(&path, e.to_string()))?;
        if &actual != expected {
            return Err(bad(
                &path,
                format!(
                    "corrupt: {} bytes with CRC32 {:08x}, state.json expects {} bytes with CRC32 {:08x}",
                    actual.bytes, actual.crc32, expected.bytes, expected.crc32
                ),
            ));
        }
    }
    let model_fp = fingerprint(model_json);
    if state.model_fingerprint != model_fp {
        return Err(bad(
            dir,
            format!(
                "made for another model configuration (fingerprint {} vs this run's model.json {model_fp})",
                state.model_fingerprint
            ),
        ));
    }
    let tok_fp = fingerprint(tokenizer_json);
    if state.tokenizer_fingerprint != tok_fp {
        return Err(bad(
            dir,
            format!(
                "made with another tokenizer (fingerprint {} vs this run's tokenizer.json {tok_fp})",
                state.tokenizer_fingerprint
            ),
        ));
    }
    Ok(state)
}

/// Loads verified weights into `model` (built from the same configuration).
///
/// # Errors
/// [`TrainError::Checkpoint`] if the file does not decode.
pub fn load_model(dir: &Path, model: RelationLm) -> Result<RelationLm> {
    let path = dir.join("model.bpk");
    model.load(&path).map_err(|e| bad(&path, e.to_string()))
}

/// Loads verified optimizer state into `optim` (built with the same groups).
///
/// # Errors
/// [`TrainError::Checkpoint`] if the file does not decode.
pub fn load_optim(dir: &Path, optim: ModuleOptimizer) -> Result<ModuleOptimizer> {
    let path = dir.join("optim.bpk");
    optim.load(&path).map_err(|e| bad(&path, format!("{e:?}")))
}

/// Whether `run` holds any checkpoint (complete or not, pointed at or not): what makes a
/// directory a run that a new start must not overwrite. A directory with only `config.json`
/// (a start that failed before its first checkpoint) is not one.
pub fn any(run: &Path) -> bool {
    checkpoints_dir(run).join("latest").exists() || list(run).is_ok_and(|l| !l.is_empty())
}

/// The step a checkpoint directory's name encodes (`step-00000042` → 42).
pub fn step_of(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix("step-")?
        .parse()
        .ok()
}

/// Moves checkpoint directories out of the way (into `checkpoints/<label>-<unix time>/`, where
/// nothing reads, prunes or overwrites them) and returns where they went. Used for the
/// checkpoints after the one a run resumes from, so the continued run's saves and its pruning
/// never mix two histories, while no work is deleted.
///
/// # Errors
/// [`TrainError::Io`] if a move fails.
pub fn set_aside(run: &Path, dirs: &[PathBuf], label: &str) -> Result<PathBuf> {
    let root = checkpoints_dir(run);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = root.join(format!("{label}-{since}"));
    let mut n = 1;
    while aside.exists() {
        n += 1;
        aside = root.join(format!("{label}-{since}-{n}"));
    }
    fs::create_dir_all(&aside).map_err(io(&aside))?;
    for dir in dirs {
        let name = dir.file_name().expect("a checkpoint directory has a name");
        fs::rename(dir, aside.join(name)).map_err(io(dir))?;
    }
    sync_dir(&aside)?;
    sync_dir(&root)?;
    Ok(aside)
}

/// Accepts `step-00000042`, `step-42` or `42`.
fn parse_checkpoint_name(run: &Path, name: &str) -> Result<PathBuf> {
    let digits = name.strip_prefix("step-").unwrap_or(name);
    let step: u64 = digits.parse().map_err(|_| TrainError::Invalid {
        name: "--from-checkpoint",
        value: name.into(),
        rule: "must name a checkpoint: step-N or N (see the run's checkpoints/ folder)".into(),
    })?;
    let dir = checkpoints_dir(run).join(name_of(step));
    if !dir.is_dir() {
        let have: Vec<String> = list(run)?
            .iter()
            .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        return Err(TrainError::Invalid {
            name: "--from-checkpoint",
            value: name.into(),
            rule: format!(
                "the run has no checkpoint of step {step}; it has: {}",
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ),
        });
    }
    Ok(dir)
}

/// Chooses the checkpoint a resume continues from, and verifies it.
///
/// With `from`, exactly that checkpoint (an error if it does not verify). Otherwise the one
/// `latest` names; if that one (or the pointer) is damaged, the newest checkpoint that does
/// verify, with a message through `log` naming each one skipped and why. Checkpoints newer
/// than the chosen one are [set aside](set_aside), so the resumed run never prunes, overwrites
/// or later falls back into the abandoned history.
///
/// # Errors
/// [`TrainError::Checkpoint`] when no candidate verifies (naming each and why), or for a
/// `from` that does not; [`TrainError::Invalid`] for a `from` that names no checkpoint.
pub fn resume_point(
    run: &Path,
    from: Option<&str>,
    model_json: &str,
    tokenizer_json: &str,
    log: &mut dyn FnMut(String),
) -> Result<(PathBuf, CheckpointState)> {
    let all = list(run)?;
    let newer_than = |step: u64| -> Vec<PathBuf> {
        all.iter()
            .filter(|d| step_of(d).is_some_and(|s| s > step))
            .cloned()
            .collect()
    };
    if let Some(name) = from {
        let dir = parse_checkpoint_name(run, name)?;
        let state = verify(&dir, model_json, tokenizer_json)?;
        tracing::info!(checkpoint = %dir.display(), step = state.step, "resume: the checkpoint asked for");
        let later = newer_than(state.step);
        if !later.is_empty() {
            let aside = set_aside(run, &later, "abandoned")?;
            tracing::info!(count = later.len(), to = %aside.display(), "resume: later checkpoints set aside");
            log(format!(
                "resume: {} later checkpoint(s) moved to {} (the run continues from step {} instead)",
                later.len(),
                aside.display(),
                state.step
            ));
        }
        return Ok((dir, state));
    }
    // Candidates: what `latest` names first, then every checkpoint newest first.
    let mut failures: Vec<String> = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    match latest(run) {
        Ok(Some(dir)) => candidates.push(dir),
        Ok(None) => tracing::debug!("resume: no `latest` pointer; trying every checkpoint"),
        Err(e) => {
            tracing::warn!(reason = %e, "resume: the `latest` pointer is unusable");
            failures.push(e.to_string());
        }
    }
    for dir in all.iter().rev() {
        if !candidates.contains(dir) {
            candidates.push(dir.clone());
        }
    }
    for dir in &candidates {
        match verify(dir, model_json, tokenizer_json) {
            Ok(state) => {
                if !failures.is_empty() {
                    for why in &failures {
                        log(format!("resume: skipped {why}"));
                    }
                    let later = newer_than(state.step);
                    if !later.is_empty() {
                        let aside = set_aside(run, &later, "unverified")?;
                        tracing::warn!(count = later.len(), to = %aside.display(), "resume: unverified checkpoints set aside");
                        log(format!(
                            "resume: {} newer checkpoint(s) that did not verify moved to {}",
                            later.len(),
                            aside.display()
                        ));
                    }
                    log(format!(
                        "resume: falling back to {}, the newest checkpoint that verifies",
                        dir.display()
                    ));
                    tracing::warn!(checkpoint = %dir.display(), step = state.step, skipped = failures.len(), "resume: fell back");
                    write_atomic(
                        &checkpoints_dir(run).join("latest"),
                        dir.file_name()
                            .expect("a checkpoint has a name")
                            .to_string_lossy()
                            .as_bytes(),
                    )?;
                }
                tracing::debug!(checkpoint = %dir.display(), step = state.step, "resume: checkpoint verified");
                return Ok((dir.clone(), state));
            }
            Err(e) => {
                tracing::warn!(checkpoint = %dir.display(), reason = %e, "resume: checkpoint does not verify");
                failures.push(e.to_string());
            }
        }
    }
    if failures.is_empty() {
        return Err(bad(
            &checkpoints_dir(run),
            "holds no complete checkpoint to resume from",
        ));
    }
    Err(bad(
        &checkpoints_dir(run),
        format!(
            "no checkpoint verifies, nothing was changed: {}",
            failures.join("; ")
        ),
    ))
}
