//! Sampling from a loaded run, streamed: the continuation is decoded as it grows and handed on
//! as soon as it can no longer change, ending at a stop token or a stop string; and a run's
//! checkpoint exported as a standalone safetensors model. The `generate` and `export`
//! commands built on them are in `cli/generate.rs` and `cli/export.rs`.

use std::path::{Path, PathBuf};

use relation_model::Sampling;

use crate::data;
use crate::error::io;
use crate::evaluate::LoadedRun;
use crate::{Result, TrainError};

/// Writes `run`'s weights to `out` as safetensors, with the model configuration and the
/// tokenizer of the run in `run_dir` (`model.json`, `tokenizer.json`) copied into the same
/// folder, which is created.
///
/// # Errors
/// Unwritable output; a run directory without those files.
pub fn export_safetensors(run: &LoadedRun, run_dir: &Path, out: &Path) -> Result<()> {
    let folder = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder).map_err(io(&folder))?;
    run.model.export_safetensors(out)?;
    for name in ["model.json", "tokenizer.json"] {
        let from = run_dir.join(name);
        let bytes = std::fs::read(&from).map_err(io(&from))?;
        crate::fs::write_atomic(&folder.join(name), &bytes)?;
    }
    Ok(())
}

/// How much of `text` can be shown now: all of it except a trailing incomplete character
/// (byte-level tokens can end inside one) and a trailing part that could begin a stop string.
fn printable_len(text: &str, stops: &[String]) -> usize {
    let mut end = text.trim_end_matches('\u{fffd}').len();
    for stop in stops {
        for (i, _) in stop.char_indices().skip(1) {
            if text[..end].ends_with(&stop[..i]) {
                end = end.min(text.len() - i);
            }
        }
    }
    end
}

/// Continues the `prompt` tokens with `run`'s model under `sampling`, handing the
/// continuation's text to `emit` piece by piece as it is generated: after each token the
/// continuation is decoded again, and what is new (and can no longer change, or turn out to
/// be the start of a stop string) is emitted. Generation ends at `sampling`'s stop tokens,
/// after its `max_new_tokens`, or where one of `stops` appears (that text is not emitted).
///
/// # Errors
/// A model or tokenizer error; the first error `emit` returns (generation stops there).
pub fn stream_continuation(
    run: &LoadedRun,
    prompt: &[u32],
    sampling: &Sampling,
    stops: &[String],
    emit: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<()> {
    let mut tokens: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let mut failure: Option<TrainError> = None;
    let mut text = String::new();
    run.model.generate_stream(prompt, sampling, |token| {
        tokens.push(token);
        match data::decode(&run.tokenizer, &tokens) {
            Ok(t) => text = t,
            Err(e) => {
                failure = Some(e);
                return false;
            }
        }
        let stop_at = stops.iter().filter_map(|s| text.find(s.as_str())).min();
        if let Some(at) = stop_at {
            text.truncate(at);
        }
        let ready = if stop_at.is_some() {
            text.len()
        } else {
            printable_len(&text, stops)
        };
        if ready > printed && text.is_char_boundary(printed) {
            if let Err(e) = emit(&text[printed..ready]) {
                failure = Some(e);
                return false;
            }
            printed = ready;
        }
        stop_at.is_none()
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if text.len() > printed && text.is_char_boundary(printed) {
        emit(&text[printed..])?;
    }
    Ok(())
}
