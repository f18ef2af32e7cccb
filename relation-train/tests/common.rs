//! Running the `relation` binary on a tiny model and a slice of the shipped corpus.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// 80 KB of the shipped corpus: real English, enough for a 300-token BPE and a few steps.
pub fn corpus(dir: &Path) -> PathBuf {
    let text = include_str!("../data/moby_dick.txt");
    let mut end = 80_000;
    while !text.is_char_boundary(end) {
        end += 1;
    }
    let path = dir.join("corpus.txt");
    std::fs::write(&path, &text[..end]).unwrap();
    path
}

/// A tiny run: d = 32, 2 layers, 2 heads, 300-token vocabulary, 8 steps of 2 accumulated
/// micro-batches of 4 x 32 tokens, evaluation every 4 steps, a checkpoint every 2.
pub fn tiny_args(run: &Path, cache: &Path, corpus: &Path) -> Vec<String> {
    [
        "train",
        "--run-dir",
        run.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--data",
        corpus.to_str().unwrap(),
        "--device",
        "flex",
        "--vocab-size",
        "300",
        "--d-model",
        "32",
        "--n-layers",
        "2",
        "--n-heads",
        "2",
        "--d-ff",
        "64",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--tokens-per-step",
        "256",
        "--steps",
        "8",
        "--warmup-steps",
        "2",
        "--lr",
        "0.01",
        "--eval-every",
        "4",
        "--eval-tokens",
        "256",
        "--checkpoint-every",
        "2",
        "--log-every",
        "1",
        "--sample-tokens",
        "8",
        "--no-progress",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs `relation` with `args` and extra environment variables.
pub fn relation(args: &[String], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relation"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("spawn relation")
}

/// stdout + stderr as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs and asserts success.
pub fn ok(args: &[String]) -> String {
    relation_ok(args, &[])
}

/// Runs with extra environment variables and asserts success; returns stdout + stderr.
pub fn relation_ok(args: &[String], env: &[(&str, &str)]) -> String {
    let out = relation(args, env);
    let t = text(&out);
    assert!(out.status.success(), "relation {args:?} failed:\n{t}");
    t
}

/// Runs and asserts failure with a message containing `needle`.
pub fn fails_with(args: &[String], env: &[(&str, &str)], needle: &str) -> String {
    let out = relation(args, env);
    let t = text(&out);
    assert!(!out.status.success(), "relation {args:?} should fail:\n{t}");
    assert!(t.contains(needle), "expected `{needle}` in:\n{t}");
    t
}

/// The metrics rows of a run (`metrics.jsonl`).
pub fn rows(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The checkpoint `latest` names.
pub fn latest(run: &Path) -> String {
    std::fs::read_to_string(run.join("checkpoints/latest")).unwrap()
}

/// `args` with one more injected fault (`--fault`, a `testing` build's flag).
pub fn fault(args: &[String], fault: &str) -> Vec<String> {
    let mut args = args.to_vec();
    args.push("--fault".into());
    args.push(fault.into());
    args
}

/// Replaces the value after `flag` in `args`, or appends the pair.
pub fn with(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.into(),
        None => {
            args.push(flag.into());
            args.push(value.into());
        }
    }
    args
}

/// `train --resume` of `run`, without a progress bar.
pub fn resume_args(run: &Path) -> Vec<String> {
    vec![
        "train".into(),
        "--resume".into(),
        "--run-dir".into(),
        run.to_str().unwrap().into(),
        "--no-progress".into(),
    ]
}

/// `relation eval --run-dir RUN --eval-tokens 256` plus `extra`: its output and the loss it
/// printed (nats per token).
pub fn eval_loss(run: &Path, extra: &[&str]) -> (String, f64) {
    let mut args: Vec<String> = [
        "eval",
        "--run-dir",
        run.to_str().unwrap(),
        "--eval-tokens",
        "256",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = ok(&args);
    let loss = out
        .split("loss ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no loss in:\n{out}"));
    (out, loss)
}

/// A run trained on one short sentence per document ("the <animal> sat on the mat.", each
/// document ended by <|endoftext|>): 40 steps of the tiny model, after which greedy decoding of
/// "the owl" is " sat on the mat." and then end-of-text. Returns the run directory.
pub fn sat_run(dir: &Path) -> PathBuf {
    let data = dir.join("sat.jsonl");
    let names = ["cat", "dog", "fox", "owl"];
    let lines: String = (0..3000)
        .map(|i| {
            format!(
                "{{\"text\": \"the {} sat on the mat.\"}}\n",
                names[(i * 7 + i / 5) % 4]
            )
        })
        .collect();
    std::fs::write(&data, lines).unwrap();
    let run = dir.join("run");
    let cache = dir.join("cache");
    let args = with(
        with(
            with(
                with(tiny_args(&run, &cache, &data), "--steps", "40"),
                "--eval-every",
                "40",
            ),
            "--checkpoint-every",
            "40",
        ),
        "--sample-tokens",
        "0",
    );
    ok(&with(
        with(args, "--split", "contiguous"),
        "--warmup-steps",
        "4",
    ));
    run
}
