//! `relation generate`: a run's checkpoint continues a prompt, streamed to standard output
//! (the sampling itself is [`crate::sample::stream_continuation`]).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use relation_model::{DecodeBatch, Finish, Next, Request, Sampling};

use super::{CacheDtype, RunSource};
use crate::data;
use crate::error::io;
use crate::sample::{ContinuationText, stream_continuation};
use crate::{Result, TrainError};

/// `relation generate`.
#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct GenerateArgs {
    /// The run, and which of its checkpoints.
    #[command(flatten)]
    pub source: RunSource,
    /// The text to continue; `-` reads it from standard input.
    #[arg(long, default_value = "Call me", conflicts_with = "prompt_file")]
    pub prompt: String,
    /// Read the text to continue from this file.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Every non-empty line of the prompt text (`--prompt-file`, or `--prompt -` from standard
    /// input) is a prompt of its own; they are decoded together, at most --max-batch at a time
    /// (continuous batching: a finished prompt's place goes to the next), and each completion
    /// is written as one JSON line when it ends: `{"index", "prompt", "completion", "tokens",
    /// "finish_reason"}`. Line `i` samples with seed `--seed + i`.
    #[arg(long)]
    pub each_line: bool,
    /// Most prompts decoded together with --each-line.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub max_batch: usize,
    /// End the continuation where this text appears (repeatable; the text itself is not
    /// printed). Generation always ends at the end-of-text token.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// A prompt longer than the context (--max-context, default the run's train.seq_len
    /// tokens) is refused unless this is given; then only its last tokens are used.
    #[arg(long)]
    pub truncate_prompt: bool,
    /// The longest prompt accepted, in tokens (default: the run's train.seq_len). A Linear
    /// Relation model (pattern `L`) reads any length in constant memory per token; positions
    /// past the trained context extrapolate, so quality there is not guaranteed.
    #[arg(long, value_name = "TOKENS")]
    pub max_context: Option<usize>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 200)]
    pub max_new_tokens: usize,
    /// Softmax temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens with this much probability (1 = all).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f64,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Number of samples.
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// The dtype of the decoding caches (the Full layers' Relation Cache, attention's K/V
    /// cache): f16 or bf16 halve their memory and the bytes each new token reads, at the cost
    /// of rounding what is cached.
    #[arg(long, value_enum, default_value_t = CacheDtype::Model)]
    pub cache_dtype: CacheDtype,
    /// Device (default: the run's).
    #[arg(long)]
    pub device: Option<String>,
}

/// The prompt text: `--prompt-file`, `--prompt -` (standard input) or `--prompt`.
fn prompt_text(args: &GenerateArgs) -> Result<String> {
    if let Some(path) = &args.prompt_file {
        return std::fs::read_to_string(path).map_err(io(path));
    }
    if args.prompt == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(io("standard input"))?;
        return Ok(text);
    }
    Ok(args.prompt.clone())
}

/// Runs `relation generate`.
///
/// # Errors
/// A run or checkpoint that cannot be loaded; a bad prompt or sampling setting.
pub(super) fn run_generate(args: &GenerateArgs) -> Result<()> {
    if args.each_line {
        return generate_each_line(args);
    }
    let run = args.source.load(&args.device)?;
    let text = prompt_text(args)?;
    let mut prompt = data::encode(&run.tokenizer, &text)?;
    if prompt.is_empty() {
        return Err(TrainError::Invalid {
            name: "--prompt",
            value: format!("{text:?}"),
            rule: "must encode to at least one token".into(),
        });
    }
    let trained = run.config.train.seq_len;
    let context = args.max_context.unwrap_or(trained);
    let mut shown = text.clone();
    if prompt.len() > context {
        if !args.truncate_prompt {
            return Err(TrainError::Invalid {
                name: "--prompt",
                value: format!("{} tokens", prompt.len()),
                rule: format!(
                    "is longer than the context of {context} tokens (--max-context, default train.seq_len); shorten it, raise --max-context, or pass --truncate-prompt to use its last {context} tokens"
                ),
            });
        }
        prompt.drain(..prompt.len() - context);
        shown = format!("…{}", data::decode(&run.tokenizer, &prompt)?);
        eprintln!("note: the prompt was cut to its last {context} tokens (--truncate-prompt)");
    }
    if prompt.len() + args.max_new_tokens > trained {
        eprintln!(
            "note: positions past {trained} (the trained context) extrapolate; quality may drop there"
        );
    }
    check_top_p(args)?;
    if args.samples == 0 {
        return Err(TrainError::Invalid {
            name: "--samples",
            value: "0".into(),
            rule: "must be >= 1".into(),
        });
    }
    let stop_tokens: Vec<u32> = run.tokenizer.token_to_id(data::EOT).into_iter().collect();
    let mut out = std::io::stdout().lock();
    for i in 0..args.samples {
        let sampling = sampling(args, i, &stop_tokens);
        write!(out, "{shown}").map_err(io("standard output"))?;
        out.flush().map_err(io("standard output"))?;
        stream_continuation(
            &run,
            &prompt,
            &sampling,
            &args.stop,
            args.cache_dtype.dtype(),
            &mut |piece| {
                write!(out, "{piece}").map_err(io("standard output"))?;
                out.flush().map_err(io("standard output"))
            },
        )?;
        writeln!(out).map_err(io("standard output"))?;
        if i + 1 < args.samples {
            writeln!(out, "---").map_err(io("standard output"))?;
        }
    }
    Ok(())
}

/// The sampling flags, with seed `--seed + i` (sample or line `i`).
fn sampling(args: &GenerateArgs, i: usize, stop_tokens: &[u32]) -> Sampling {
    Sampling {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_k: (args.top_k > 0).then_some(args.top_k),
        top_p: (args.top_p < 1.0).then_some(args.top_p),
        seed: args.seed.wrapping_add(i as u64),
        stop_tokens: stop_tokens.to_vec(),
    }
}

fn check_top_p(args: &GenerateArgs) -> Result<()> {
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(TrainError::Invalid {
            name: "--top-p",
            value: args.top_p.to_string(),
            rule: "must be in (0, 1] (1 = no nucleus cut)".into(),
        });
    }
    Ok(())
}

/// `relation generate --each-line`: one prompt per line, continuous batching, JSON lines out.
fn generate_each_line(args: &GenerateArgs) -> Result<()> {
    check_top_p(args)?;
    for (name, value, ok) in [
        ("--samples", args.samples, args.samples == 1),
        ("--max-batch", args.max_batch, args.max_batch >= 1),
    ] {
        if !ok {
            return Err(TrainError::Invalid {
                name,
                value: value.to_string(),
                rule: if name == "--samples" {
                    "must be 1 with --each-line (repeat a line to sample it again)".into()
                } else {
                    "must be >= 1".into()
                },
            });
        }
    }
    let run = args.source.load(&args.device)?;
    let text = prompt_text(args)?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return Err(TrainError::Invalid {
            name: "--each-line",
            value: "no prompt".into(),
            rule: "the prompt text must have at least one non-empty line".into(),
        });
    }
    let context = args.max_context.unwrap_or(run.config.train.seq_len);
    let stop_tokens: Vec<u32> = run.tokenizer.token_to_id(data::EOT).into_iter().collect();
    let mut requests = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let mut prompt = data::encode(&run.tokenizer, line)?;
        if prompt.len() > context {
            if !args.truncate_prompt {
                return Err(TrainError::Invalid {
                    name: "--prompt-file",
                    value: format!("line {} ({} tokens)", i + 1, prompt.len()),
                    rule: format!(
                        "is longer than the context of {context} tokens (--max-context, default train.seq_len); shorten it, raise --max-context, or pass --truncate-prompt"
                    ),
                });
            }
            prompt.drain(..prompt.len() - context);
        }
        requests.push(Request {
            id: i as u64,
            prompt,
            sampling: sampling(args, i, &stop_tokens),
            logprobs: None,
        });
    }
    for request in &requests {
        DecodeBatch::check(&run.model, request)?;
    }
    let mut texts: Vec<ContinuationText<'_>> = lines
        .iter()
        .map(|_| ContinuationText::new(&run.tokenizer, &args.stop))
        .collect();
    let mut counts = vec![0usize; lines.len()];
    let mut out = std::io::stdout().lock();
    let mut write = |i: usize, text: &mut ContinuationText<'_>, count: usize, reason: &str| {
        text.finish();
        let line = serde_json::json!({
            "index": i,
            "prompt": lines[i],
            "completion": text.text(),
            "tokens": count,
            "finish_reason": reason,
        });
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(io("standard output"))
    };
    let mut waiting = requests.into_iter();
    let mut batch =
        DecodeBatch::new(&run.model, args.max_batch).with_cache_dtype(args.cache_dtype.dtype())?;
    let mut stopped = vec![false; lines.len()];
    let mut failure = None;
    loop {
        let joining: Vec<Request> = waiting.by_ref().take(batch.room()).collect();
        let zero: Vec<u64> = joining
            .iter()
            .filter(|r| r.sampling.max_new_tokens == 0)
            .map(|r| r.id)
            .collect();
        batch.admit(joining)?;
        for id in zero {
            let i = id as usize;
            write(i, &mut texts[i], 0, "length")?;
        }
        if batch.is_empty() {
            break;
        }
        let done = batch.step(&mut |drawn| {
            let i = drawn.id as usize;
            counts[i] += 1;
            match texts[i].push(drawn.token) {
                Ok((_, true)) => {
                    stopped[i] = true;
                    Next::End
                }
                Ok(_) => Next::Continue,
                Err(e) => {
                    failure.get_or_insert(e);
                    Next::End
                }
            }
        })?;
        if let Some(e) = failure.take() {
            return Err(e);
        }
        for (id, why) in done {
            let i = id as usize;
            let reason = match why {
                Finish::Length if !stopped[i] => "length",
                _ => "stop",
            };
            write(i, &mut texts[i], counts[i], reason)?;
        }
    }
    Ok(())
}
