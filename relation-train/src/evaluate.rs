//! Evaluation (NLL, perplexity, bits per byte) and loading a trained run for eval/generate.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use relation_model::{RelationLm, RelationLmConfig};
use tokenizers::Tokenizer;

use crate::checkpoint;
use crate::config::RunConfig;
use crate::data::eval_windows;
use crate::error::io;
use crate::optim::token_nll;
use crate::{Result, TrainError};

/// Loss of a model on a token stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalResult {
    /// Predicted tokens.
    pub tokens: usize,
    /// Mean negative log-likelihood, nats per token.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Bits per UTF-8 byte: total NLL in bits over the bytes of text the tokens cover.
    pub bits_per_byte: f64,
}

/// Evaluates `model` (no autodiff needed) on non-overlapping windows of `seq_len` over
/// `stream`, stopping after `max_tokens` predicted tokens (0 = all). `bytes_per_token` turns
/// nats per token into bits per byte (the stream's bytes over its tokens).
///
/// # Errors
/// Model errors; [`TrainError::Data`] for a stream shorter than two tokens.
pub fn evaluate(
    model: &RelationLm,
    stream: &[u32],
    seq_len: usize,
    batch_size: usize,
    max_tokens: usize,
    bytes_per_token: f64,
) -> Result<EvalResult> {
    let windows = eval_windows(stream.len(), seq_len, max_tokens);
    if windows.is_empty() {
        return Err(TrainError::Data(format!(
            "{} tokens: evaluation needs at least two",
            stream.len()
        )));
    }
    let device = model.embedding.weight.val().device();
    let mut total = 0.0f64;
    let mut count = 0usize;
    // Full-length windows in batches; the shorter last one on its own.
    let mut i = 0;
    while i < windows.len() {
        let n = windows[i].1;
        let mut rows = Vec::new();
        while i < windows.len() && windows[i].1 == n && rows.len() < batch_size {
            rows.push(windows[i].0);
            i += 1;
        }
        let b = rows.len();
        let mut inputs = Vec::with_capacity(b * n);
        let mut targets = Vec::with_capacity(b * n);
        for &start in &rows {
            inputs.extend(stream[start..start + n].iter().map(|&t| t as i64));
            targets.extend(stream[start + 1..start + n + 1].iter().map(|&t| t as i64));
        }
        let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [b, n]), &device);
        let y = Tensor::<2, Int>::from_data(TensorData::new(targets, [b, n]), &device);
        let logits = model.forward(x)?; // [b, n, V]
        let nll = token_nll(logits, y)?.sum().into_scalar::<f64>();
        total += nll;
        count += b * n;
    }
    let loss = total / count as f64;
    Ok(EvalResult {
        tokens: count,
        loss,
        perplexity: loss.exp(),
        bits_per_byte: loss / std::f64::consts::LN_2 / bytes_per_token,
    })
}

/// A trained run loaded for evaluation or sampling.
pub struct LoadedRun {
    /// The run's configuration.
    pub config: RunConfig,
    /// Its model configuration.
    pub model_config: RelationLmConfig,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// The model with the checkpoint's weights, on the requested device (no autodiff).
    pub model: RelationLm,
    /// The checkpoint loaded.
    pub checkpoint: PathBuf,
    /// Its step.
    pub step: u64,
}

/// Loads a run directory's model from `checkpoint` (default: the latest) onto `device`.
///
/// # Errors
/// A directory that is not a run, no checkpoint, or a checkpoint that fails verification.
pub fn load_run(run: &Path, checkpoint: Option<&Path>, device: &Device) -> Result<LoadedRun> {
    let not_run = |what: &str| TrainError::RunDir {
        path: run.into(),
        reason: format!("{what} (is it a run directory written by `relation train`?)"),
    };
    let read = |name: &str| -> Result<String> {
        let p = run.join(name);
        if !p.exists() {
            return Err(not_run(&format!("has no {name}")));
        }
        std::fs::read_to_string(&p).map_err(io(&p))
    };
    let config = RunConfig::load(&run.join("config.json"))?;
    let model_json = read("model.json")?;
    let tokenizer_json = read("tokenizer.json")?;
    let model_config: RelationLmConfig =
        serde_json::from_str(&model_json).map_err(|e| TrainError::Config {
            path: run.join("model.json"),
            reason: e.to_string(),
        })?;
    let tokenizer = tokenizer_json.parse::<Tokenizer>().map_err(|e| {
        TrainError::Tokenizer(format!("{}: {e}", run.join("tokenizer.json").display()))
    })?;
    let dir = match checkpoint {
        Some(dir) => dir.to_path_buf(),
        None => checkpoint::latest(run)?.ok_or_else(|| not_run("has no checkpoint yet"))?,
    };
    let state = checkpoint::verify(&dir, &model_json, &tokenizer_json)?;
    let model = checkpoint::load_model(&dir, model_config.init(device)?)?;
    Ok(LoadedRun {
        config,
        model_config,
        tokenizer,
        model,
        checkpoint: dir,
        step: state.step,
    })
}
