//! `relation generate` (streamed sampling that ends at end-of-text or a stop string) and
//! `relation export` (a checkpoint as a standalone safetensors model).

use std::path::PathBuf;

use relation_model::Sampling;

use crate::cli::{ExportArgs, ExportFormat, GenerateArgs};
use crate::data;
use crate::error::io;
use crate::{Result, TrainError};

/// Runs `relation export`.
///
/// # Errors
/// A run or checkpoint that cannot be loaded; unwritable output.
pub fn run_export(args: &ExportArgs) -> Result<()> {
    // The run's own device (any backend can write safetensors).
    let run = args.source.load(&None)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.source.run_dir.join("export").join("model.safetensors"));
    let folder = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&folder).map_err(io(&folder))?;
    match args.format {
        ExportFormat::Safetensors => run.model.export_safetensors(&out)?,
    }
    for name in ["model.json", "tokenizer.json"] {
        let from = args.source.run_dir.join(name);
        let bytes = std::fs::read(&from).map_err(io(&from))?;
        crate::fs::write_atomic(&folder.join(name), &bytes)?;
    }
    println!(
        "exported {} (step {}) to {} with model.json and tokenizer.json beside it; load with RelationLmConfig from model.json, then RelationLm::import_safetensors",
        run.checkpoint.display(),
        run.step,
        out.display()
    );
    Ok(())
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

/// How much of `text` can be printed now: all of it except a trailing incomplete character
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

/// Runs `relation generate`.
///
/// # Errors
/// A run or checkpoint that cannot be loaded; a bad prompt or sampling setting.
pub fn run_generate(args: &GenerateArgs) -> Result<()> {
    use std::io::Write;

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
    let context = run.config.train.seq_len;
    let mut shown = text.clone();
    if prompt.len() > context {
        if !args.truncate_prompt {
            return Err(TrainError::Invalid {
                name: "--prompt",
                value: format!("{} tokens", prompt.len()),
                rule: format!(
                    "is longer than the run's context of {context} tokens (train.seq_len); shorten it, or pass --truncate-prompt to use its last {context} tokens"
                ),
            });
        }
        prompt.drain(..prompt.len() - context);
        shown = format!("…{}", data::decode(&run.tokenizer, &prompt)?);
        eprintln!("note: the prompt was cut to its last {context} tokens (--truncate-prompt)");
    }
    if prompt.len() + args.max_new_tokens > context {
        eprintln!(
            "note: positions past {context} (the trained context) extrapolate; quality may drop there"
        );
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(TrainError::Invalid {
            name: "--top-p",
            value: args.top_p.to_string(),
            rule: "must be in (0, 1] (1 = no nucleus cut)".into(),
        });
    }
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
        let sampling = Sampling {
            max_new_tokens: args.max_new_tokens,
            temperature: args.temperature,
            top_k: (args.top_k > 0).then_some(args.top_k),
            top_p: (args.top_p < 1.0).then_some(args.top_p),
            seed: args.seed.wrapping_add(i as u64),
            stop_tokens: stop_tokens.clone(),
        };
        write!(out, "{shown}").map_err(io("standard output"))?;
        out.flush().map_err(io("standard output"))?;
        // Streamed: after each token the continuation is decoded again and what is new (and
        // can no longer change or turn out to be a stop string) is printed.
        let mut tokens: Vec<u32> = Vec::new();
        let mut printed = 0usize;
        let mut failure: Option<TrainError> = None;
        let mut text = String::new();
        run.model.generate_stream(&prompt, &sampling, |token| {
            tokens.push(token);
            match data::decode(&run.tokenizer, &tokens) {
                Ok(t) => text = t,
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            }
            let stop_at = args.stop.iter().filter_map(|s| text.find(s.as_str())).min();
            if let Some(at) = stop_at {
                text.truncate(at);
            }
            let ready = if stop_at.is_some() {
                text.len()
            } else {
                printable_len(&text, &args.stop)
            };
            if ready > printed && text.is_char_boundary(printed) {
                let _ = write!(out, "{}", &text[printed..ready]);
                let _ = out.flush();
                printed = ready;
            }
            stop_at.is_none()
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if text.len() > printed && text.is_char_boundary(printed) {
            write!(out, "{}", &text[printed..]).map_err(io("standard output"))?;
        }
        writeln!(out).map_err(io("standard output"))?;
        if i + 1 < args.samples {
            writeln!(out, "---").map_err(io("standard output"))?;
        }
    }
    Ok(())
}
