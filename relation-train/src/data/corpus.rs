//! Text in: reading the sources into documents, cutting them into split units, and the
//! deterministic train/validation split of those units.

use std::fs;
use std::path::{Path, PathBuf};

use super::data_err;
use crate::Result;
use crate::config::{DataSpec, MIN_UNITS, SplitMode};
use crate::error::io;

/// The shipped default corpus (Moby Dick, public domain; see `relation-train/data/README.md`).
pub const DEFAULT_CORPUS: &str = include_str!("../../data/moby_dick.txt");

/// Name of the default corpus in messages.
pub const DEFAULT_CORPUS_NAME: &str = "moby_dick.txt (shipped)";

/// Paragraph groups: at most this many bytes each, and small enough for about
/// [`TARGET_GROUPS`] groups, but at least [`MIN_GROUP_BYTES`].
const GROUP_BYTES: usize = 4096;
const MIN_GROUP_BYTES: usize = 256;
const TARGET_GROUPS: usize = 256;

/// One text and where it came from.
#[derive(Debug, Clone)]
pub struct Document {
    /// `file` or `file:line`.
    pub origin: String,
    /// The text.
    pub text: String,
}

/// Reads every source: plain text files (one document each), JSON Lines files (`.jsonl`, one
/// document per line, from its `text` field) and folders (recursively, sorted, files ending in
/// `.txt`, `.md`, `.jsonl`). No sources: the shipped corpus.
///
/// # Errors
/// [`TrainError::Data`](crate::TrainError::Data) for a missing path, a file that is not UTF-8,
/// a JSON line without a string `text` field, or no text at all.
pub fn read_documents(sources: &[PathBuf]) -> Result<Vec<Document>> {
    if sources.is_empty() {
        return Ok(vec![Document {
            origin: DEFAULT_CORPUS_NAME.into(),
            text: DEFAULT_CORPUS.into(),
        }]);
    }
    let mut files = Vec::new();
    for source in sources {
        collect_files(source, &mut files)?;
    }
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).map_err(|e| {
            data_err(format!(
                "{}: {e} (text files must be UTF-8)",
                file.display()
            ))
        })?;
        if file.extension().is_some_and(|e| e == "jsonl") {
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let origin = format!("{}:{}", file.display(), n + 1);
                let value: serde_json::Value = serde_json::from_str(line)
                    .map_err(|e| data_err(format!("{origin}: not JSON: {e}")))?;
                let text = value
                    .get("text")
                    .and_then(|t| t.as_str())
                    .ok_or_else(|| data_err(format!("{origin}: no string field `text`")))?;
                docs.push(Document {
                    origin,
                    text: text.to_string(),
                });
            }
        } else {
            docs.push(Document {
                origin: file.display().to_string(),
                text,
            });
        }
    }
    docs.retain(|d| !d.text.trim().is_empty());
    if docs.is_empty() {
        return Err(data_err(format!(
            "no text found in {}",
            sources
                .iter()
                .map(|s| s.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(docs)
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| data_err(format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(path)
        .map_err(io(path))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect_files(&entry, out)?;
        } else if entry
            .extension()
            .is_some_and(|e| e == "txt" || e == "md" || e == "jsonl")
        {
            out.push(entry);
        }
    }
    Ok(())
}

/// 64-bit FNV-1a: a stable hash (unlike `std`'s) for split decisions and cache keys.
pub fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for &b in bytes {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The split units: the documents themselves when there are enough of them, else each document
/// cut at blank lines (at line ends when it has none; CRLF read as LF) into groups of up to
/// 4096 bytes (fewer for small corpora, so that there are about 256 of them, but at least 256
/// bytes each).
pub fn split_units(docs: &[Document]) -> Vec<String> {
    if docs.len() >= MIN_UNITS {
        return docs.iter().map(|d| d.text.clone()).collect();
    }
    let total: usize = docs.iter().map(|d| d.text.len()).sum();
    let group_bytes = (total / TARGET_GROUPS).clamp(MIN_GROUP_BYTES, GROUP_BYTES);
    let mut units = Vec::new();
    for doc in docs {
        // CRLF files split like LF ones; a text with no blank line at all (one sentence or one
        // speech per line) splits at line ends instead of being one unit.
        let text = doc.text.replace("\r\n", "\n");
        let sep = if text.contains("\n\n") { "\n\n" } else { "\n" };
        let mut group = String::new();
        for paragraph in text.split(sep) {
            if !group.is_empty() {
                group.push_str(sep);
            }
            group.push_str(paragraph);
            if group.len() >= group_bytes {
                units.push(std::mem::take(&mut group));
            }
        }
        if !group.trim().is_empty() {
            units.push(group);
        }
    }
    units
}

/// `true` if a unit belongs to the validation split: a hash of its text below the fraction.
/// Depends only on the text, so adding or reordering files never moves other units.
pub fn is_validation(unit: &str, val_fraction: f64) -> bool {
    let h = fnv1a(unit.as_bytes(), FNV_OFFSET);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < val_fraction
}

/// Where a split unit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Train = 0,
    Validation = 1,
    /// The contiguous split's last part: read by no command.
    Test = 2,
}

/// The side of every unit under `spec.split`. Contiguous: a unit goes by where it starts in the
/// concatenated text, so validation is the `val_fraction` of the bytes after the first
/// `1 - 2 val_fraction` (never more than one unit over).
pub(super) fn assign_sides(units: &[String], spec: &DataSpec) -> Vec<Side> {
    match spec.split {
        SplitMode::Hash => units
            .iter()
            .map(|u| {
                if is_validation(u, spec.val_fraction) {
                    Side::Validation
                } else {
                    Side::Train
                }
            })
            .collect(),
        SplitMode::Contiguous => {
            let total: usize = units.iter().map(String::len).sum();
            let train_end = (1.0 - 2.0 * spec.val_fraction) * total as f64;
            let val_end = (1.0 - spec.val_fraction) * total as f64;
            let mut start = 0usize;
            units
                .iter()
                .map(|u| {
                    let at = start as f64;
                    start += u.len();
                    if at < train_end {
                        Side::Train
                    } else if at < val_end {
                        Side::Validation
                    } else {
                        Side::Test
                    }
                })
                .collect()
        }
    }
}

/// The training and validation units (the test part of a contiguous split is left out), in
/// reading order.
///
/// # Errors
/// [`TrainError::Data`](crate::TrainError::Data) when either side is empty.
pub(super) fn train_and_validation<'a>(
    units: &'a [String],
    sides: &[Side],
    spec: &DataSpec,
) -> Result<(Vec<&'a str>, Vec<&'a str>)> {
    let mut train: Vec<&str> = Vec::new();
    let mut val: Vec<&str> = Vec::new();
    for (unit, side) in units.iter().zip(sides) {
        match side {
            Side::Train => train.push(unit),
            Side::Validation => val.push(unit),
            Side::Test => {}
        }
    }
    if val.is_empty() && train.len() >= 2 && spec.split == SplitMode::Hash {
        // Few units and no hash below the fraction: hold out the unit with the lowest hash
        // (still a function of the text alone).
        let (i, _) = train
            .iter()
            .enumerate()
            .min_by_key(|(_, u)| fnv1a(u.as_bytes(), FNV_OFFSET))
            .expect("non-empty");
        val.push(train.remove(i));
    }
    if train.is_empty() || val.is_empty() {
        return Err(data_err(format!(
            "the split of {} units at val_fraction = {} leaves {} training and {} validation units; give more text",
            units.len(),
            spec.val_fraction,
            train.len(),
            val.len()
        )));
    }
    Ok((train, val))
}
