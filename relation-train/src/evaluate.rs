//! Evaluation (NLL, perplexity, bits per byte) and loading a trained run for eval/generate.

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use relation_core::Segments;
use relation_model::{RelationLm, RelationLmConfig};
use tokenizers::Tokenizer;

use crate::checkpoint;
use crate::config::{Packing, RunConfig};
use crate::data::{document_segments, eval_windows};
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

/// How [`evaluate`] reads a token stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalOptions {
    /// Tokens per window (the run's context length).
    pub seq_len: usize,
    /// Windows per forward pass.
    pub batch_size: usize,
    /// Stop after this many predicted tokens (0 = the whole stream).
    pub max_tokens: usize,
    /// The stream's UTF-8 bytes over its tokens: turns nats per token into bits per byte.
    pub bytes_per_token: f64,
    /// `Some(<|endoftext|>'s id)`: each window is cut into documents at that token and they
    /// are computed apart, as a run with `--packing documents` trains; `None`: each window is
    /// one sequence. Validation losses compare between runs of the same layout.
    pub document_marker: Option<u32>,
}

impl EvalOptions {
    /// The options a run evaluates with: its context length and micro-batch size, in
    /// `packing`'s layout (the run's own is `config.data.packing`), documents cut at `eot`.
    pub fn for_run(
        config: &RunConfig,
        packing: Packing,
        max_tokens: usize,
        bytes_per_token: f64,
        eot: Option<u32>,
    ) -> Self {
        Self {
            seq_len: config.train.seq_len,
            batch_size: config.train.batch_size,
            max_tokens,
            bytes_per_token,
            document_marker: match packing {
                Packing::Documents => eot,
                _ => None,
            },
        }
    }
}

/// Evaluates `model` (no autodiff needed) on non-overlapping windows of `opts.seq_len` over
/// `stream`, in batches of `opts.batch_size` windows, in the layout `opts` names.
///
/// # Errors
/// Model errors; [`TrainError::Data`] for a stream shorter than two tokens.
pub fn evaluate(model: &RelationLm, stream: &[u32], opts: &EvalOptions) -> Result<EvalResult> {
    evaluate_each(model, stream, opts, None)
}

/// One window of an evaluation, token by token.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredWindow<'a> {
    /// The window's `n + 1` tokens: `n` inputs, the last `n` of them also targets.
    pub tokens: &'a [u32],
    /// `logprobs[k] = log p(tokens[k + 1] | tokens[..=k])` in nats (within its document, when
    /// the window is cut into documents), `n` values.
    pub logprobs: Vec<f64>,
}

/// What [`evaluate_each`] hands every window to.
pub type EachWindow<'f> = &'f mut dyn FnMut(ScoredWindow<'_>) -> Result<()>;

/// [`evaluate`], handing every window's per-token log-likelihoods to `each` (in stream order)
/// when it is given: what `relation eval --per-token` writes, and what an independent
/// implementation of the model is checked against.
///
/// # Errors
/// As [`evaluate`]; the first error `each` returns.
pub fn evaluate_each(
    model: &RelationLm,
    stream: &[u32],
    opts: &EvalOptions,
    mut each: Option<EachWindow<'_>>,
) -> Result<EvalResult> {
    let windows = eval_windows(stream.len(), opts.seq_len, opts.max_tokens);
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
        while i < windows.len() && windows[i].1 == n && rows.len() < opts.batch_size {
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
        let logits = match opts.document_marker {
            Some(eot) => {
                // The b windows back to back as one packed row, cut at window and document
                // starts.
                let segments = Segments::new(&document_segments(&inputs, n, eot), b * n)
                    .map_err(|e| TrainError::Data(format!("evaluation windows: {e}")))?;
                let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [1, b * n]), &device);
                model.forward_packed(x, &segments)? // [1, b·n, V]
            }
            None => {
                let x = Tensor::<2, Int>::from_data(TensorData::new(inputs, [b, n]), &device);
                model.forward(x)? // [b, n, V]
            }
        };
        let [rows_out, cols, _] = logits.dims();
        let y = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows_out, cols]), &device);
        let nll = token_nll(logits, y)?; // [rows, cols], b·n values
        if let Some(each) = each.as_mut() {
            let values = (nll.clone().into_data().convert::<f32>().try_to_vec::<f32>())
                .map_err(|e| TrainError::Data(format!("reading the losses: {e:?}")))?;
            for (&start, window) in rows.iter().zip(values.chunks_exact(n)) {
                each(ScoredWindow {
                    tokens: &stream[start..start + n + 1],
                    logprobs: window.iter().map(|&v| -f64::from(v)).collect(),
                })?;
            }
        }
        total += nll.sum().into_scalar::<f64>();
        count += b * n;
    }
    let loss = total / count as f64;
    Ok(EvalResult {
        tokens: count,
        loss,
        perplexity: loss.exp(),
        bits_per_byte: loss / std::f64::consts::LN_2 / opts.bytes_per_token,
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
