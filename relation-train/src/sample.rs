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

/// A continuation's text as its tokens arrive: decoded again after each token, handed on once
/// it can no longer change (a trailing incomplete character, or a trailing part that could begin
/// a stop string, is held back), and cut where a stop string appears.
#[derive(Debug)]
pub struct ContinuationText<'t> {
    tokenizer: &'t tokenizers::Tokenizer,
    stops: Vec<String>,
    tokens: Vec<u32>,
    text: String,
    emitted: usize,
    stopped: bool,
}

impl<'t> ContinuationText<'t> {
    /// An empty continuation that ends where one of `stops` appears.
    pub fn new(tokenizer: &'t tokenizers::Tokenizer, stops: &[String]) -> Self {
        Self {
            tokenizer,
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            stopped: false,
        }
    }

    /// Adds a token; returns the text that became final (possibly empty) and whether a stop
    /// string has appeared (the continuation ends; the stop string and what follows are dropped).
    ///
    /// # Errors
    /// A token the tokenizer cannot decode.
    pub fn push(&mut self, token: u32) -> Result<(String, bool)> {
        if self.stopped {
            return Ok((String::new(), true));
        }
        self.tokens.push(token);
        self.text = data::decode(self.tokenizer, &self.tokens)?;
        let stop_at = self
            .stops
            .iter()
            .filter_map(|s| self.text.find(s.as_str()))
            .min();
        if let Some(at) = stop_at {
            self.text.truncate(at);
            self.stopped = true;
        }
        let ready = if self.stopped {
            self.text.len()
        } else {
            printable_len(&self.text, &self.stops)
        };
        let mut piece = String::new();
        if ready > self.emitted && self.text.is_char_boundary(self.emitted) {
            piece = self.text[self.emitted..ready].to_string();
            self.emitted = ready;
        }
        Ok((piece, self.stopped))
    }

    /// The text held back so far (at the end of the continuation it is final too).
    pub fn finish(&mut self) -> String {
        if self.text.len() > self.emitted && self.text.is_char_boundary(self.emitted) {
            let rest = self.text[self.emitted..].to_string();
            self.emitted = self.text.len();
            return rest;
        }
        String::new()
    }

    /// The whole continuation's text so far (cut at a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Continues the `prompt` tokens with `run`'s model under `sampling`, handing the
/// continuation's text to `emit` piece by piece as it is generated ([`ContinuationText`]).
/// Generation ends at `sampling`'s stop tokens, after its `max_new_tokens`, or where one of
/// `stops` appears (that text is not emitted).
///
/// # Errors
/// A model or tokenizer error; the first error `emit` returns (generation stops there).
pub fn stream_continuation(
    run: &LoadedRun,
    prompt: &[u32],
    sampling: &Sampling,
    stops: &[String],
    cache_dtype: Option<burn::tensor::DType>,
    emit: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<()> {
    let mut text = ContinuationText::new(&run.tokenizer, stops);
    let mut failure: Option<TrainError> = None;
    run.model
        .generate_stream_in(prompt, sampling, cache_dtype, |token| {
            let (piece, stopped) = match text.push(token) {
                Ok(next) => next,
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            };
            if !piece.is_empty()
                && let Err(e) = emit(&piece)
            {
                failure = Some(e);
                return false;
            }
            !stopped
        })?;
    if let Some(e) = failure {
        return Err(e);
    }
    let rest = text.finish();
    if !rest.is_empty() {
        emit(&rest)?;
    }
    Ok(())
}
