//! What rank 0 sends the other ranks of a multi-process run (see [`crate::ranks`]): at the start,
//! the run as it set it up (the configuration, the tokenizer and the training tokens — the other
//! ranks need neither the data files nor the run directory); on resume, the checkpoint's files.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::data::{Corpus, CorpusMeta};
use crate::error::io;
use crate::ranks::Ranks;
use crate::{Result, TrainError};

/// The start as rank 0 decided it.
#[derive(Serialize, Deserialize)]
struct Header {
    /// The configuration (its packing resolved).
    config: RunConfig,
    /// Whether the run resumes from a checkpoint.
    resume: bool,
    /// The step this invocation stops after (`--stop-at`), if any.
    stop_at: Option<u64>,
    /// The tokenizer, as JSON.
    tokenizer_json: String,
    /// The corpus's sizes.
    meta: CorpusMeta,
    /// Source documents read.
    documents: usize,
}

/// What a rank other than 0 starts from: rank 0's configuration, whether it resumes, and the
/// corpus (its training tokens; no validation tokens, which rank 0 alone evaluates).
pub(super) struct Shared {
    pub(super) config: RunConfig,
    pub(super) resume: bool,
    pub(super) stop_at: Option<u64>,
    pub(super) corpus: Corpus,
}

/// Rank 0: sends its start to the other ranks.
pub(super) fn send_start(
    ranks: &Ranks,
    config: &RunConfig,
    resume: bool,
    stop_at: Option<u64>,
    corpus: &Corpus,
) {
    let header = Header {
        config: config.clone(),
        resume,
        stop_at,
        tokenizer_json: corpus.tokenizer_json.clone(),
        meta: corpus.meta.clone(),
        documents: corpus.documents,
    };
    let header = serde_json::to_vec(&header).expect("the start serializes");
    let mut bytes = Vec::with_capacity(8 + header.len() + 4 * corpus.train.len());
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&header);
    for t in &corpus.train {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    ranks.broadcast(&mut bytes);
}

/// The other ranks: rank 0's start.
///
/// # Errors
/// [`TrainError::Mpi`] for a message that does not decode (ranks of different builds).
pub(super) fn receive_start(ranks: &Ranks) -> Result<Shared> {
    let mut bytes = Vec::new();
    ranks.broadcast(&mut bytes);
    let bad = |what: &str| TrainError::Mpi {
        reason: format!(
            "rank {} could not read rank 0's start ({what}): are all ranks the same build?",
            ranks.rank()
        ),
    };
    let len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .ok_or_else(|| bad("too short"))?;
    let header = bytes.get(8..8 + len).ok_or_else(|| bad("too short"))?;
    let header: Header = serde_json::from_slice(header).map_err(|e| bad(&e.to_string()))?;
    let tokens = &bytes[8 + len..];
    if tokens.len() != 4 * header.meta.train_tokens {
        return Err(bad("training tokens"));
    }
    let train = tokens
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    Ok(Shared {
        config: header.config,
        resume: header.resume,
        stop_at: header.stop_at,
        corpus: Corpus {
            train,
            val: Vec::new(),
            meta: header.meta,
            tokenizer_json: header.tokenizer_json,
            cache: PathBuf::new(),
            reused: true,
            documents: header.documents,
        },
    })
}

/// The files a checkpoint is made of.
const CHECKPOINT_FILES: [&str; 3] = ["state.json", "model.bpk", "optim.bpk"];

/// Rank 0: sends the checkpoint in `dir` (the one the run resumes from) to the other ranks.
///
/// # Errors
/// An unreadable file.
pub(super) fn send_checkpoint(ranks: &Ranks, dir: &Path) -> Result<()> {
    let mut bytes = Vec::new();
    for name in CHECKPOINT_FILES {
        let path = dir.join(name);
        let file = fs::read(&path).map_err(io(&path))?;
        bytes.extend_from_slice(&(file.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&file);
    }
    ranks.broadcast(&mut bytes);
    Ok(())
}

/// The other ranks: rank 0's checkpoint, written into a private folder of the system's
/// temporary directory (removed with the returned guard) for the loaders that read folders.
///
/// # Errors
/// A message that does not decode, a folder that cannot be written.
pub(super) fn receive_checkpoint(ranks: &Ranks) -> Result<TempCheckpoint> {
    let mut bytes = Vec::new();
    ranks.broadcast(&mut bytes);
    let dir = std::env::temp_dir().join(format!(
        "relation-rank{}-{}-checkpoint",
        ranks.rank(),
        std::process::id()
    ));
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let guard = TempCheckpoint(dir);
    let mut rest = &bytes[..];
    for name in CHECKPOINT_FILES {
        let len = rest
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
        let Some(file) = len.and_then(|len| rest.get(8..8 + len)) else {
            return Err(TrainError::Mpi {
                reason: format!("rank 0's checkpoint arrived cut short (at {name})"),
            });
        };
        let path = guard.0.join(name);
        fs::write(&path, file).map_err(io(&path))?;
        rest = &rest[8 + file.len()..];
    }
    Ok(guard)
}

/// A checkpoint received from rank 0, in a folder removed when this is dropped.
pub(super) struct TempCheckpoint(pub(super) PathBuf);

impl Drop for TempCheckpoint {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
