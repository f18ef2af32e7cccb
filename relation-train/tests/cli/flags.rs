//! `train`'s flags: the help, a configuration file under the flags, the ablation and
//! Linear Relation switches, and the step size they make.

use crate::common::*;

#[test]
fn help_explains_every_flag() {
    let out = ok(&["train".into(), "--help".into()]);
    for flag in [
        "--run-dir",
        "--config",
        "--resume",
        "--stop-at",
        "--device",
        "--preset",
        "--pattern",
        "--data",
        "--vocab-size",
        "--tokenizer",
        "--steps",
        "--seq-len",
        "--batch-size",
        "--tokens-per-step",
        "--lr",
        "--warmup-steps",
        "--decay-fraction",
        "--weight-decay",
        "--grad-clip",
        "--seed",
        "--checkpoint-every",
    ] {
        assert!(out.contains(flag), "train --help lacks {flag}");
    }
    // Each subcommand has its own line in the top-level help ("eval" alone would also match
    // "evaluate" in the description).
    let top = ok(&["--help".into()]);
    for sub in ["train", "eval", "generate"] {
        assert!(
            top.lines()
                .any(|l| l.trim_start().starts_with(&format!("{sub} "))),
            "--help lists no `{sub}` subcommand:\n{top}"
        );
    }
}

#[test]
fn config_file_and_flags_combine() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let config = tmp.path().join("config.json");
    // The file sets the pattern (Hybrid: Linear + Full) and steps; a flag overrides steps.
    std::fs::write(
        &config,
        r#"{"model": {"pattern": "LF"}, "train": {"steps": 50}}"#,
    )
    .unwrap();
    let run = tmp.path().join("run");
    let mut args = with(tiny_args(&run, &cache, &corpus), "--steps", "2");
    args.extend(["--config".into(), config.to_str().unwrap().into()]);
    args = with(args, "--warmup-steps", "1");
    let out = ok(&args);
    assert!(out.contains("`LF`"), "{out}");
    assert!(out.contains("finished at step 2/2"), "{out}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("config.json")).unwrap()).unwrap();
    assert_eq!(saved["model"]["pattern"], "LF");
    assert_eq!(saved["train"]["steps"], 2);
}

/// The ablation flags reach the model, its saved configuration and the run header; the single-head
/// Relation trains; a frozen lambda stays where it started.
#[test]
fn ablation_flags_train_and_are_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let run = tmp.path().join("ablation");
    let mut args = with(tiny_args(&run, &cache, &corpus), "--steps", "4");
    args = with(args, "--n-heads", "1");
    args = with(args, "--lambda-init", "0");
    args = with(args, "--tau", "1.5");
    args.extend(["--freeze-lambda".to_string(), "--no-givens".to_string()]);
    let out = ok(&args);
    assert!(
        out.contains("(tau 1.5, lambda frozen at 0, no Givens)"),
        "run header names the switches:\n{out}"
    );
    assert!(out.contains("1 heads"), "{out}");
    let model: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("model.json")).unwrap()).unwrap();
    assert_eq!(model["givens"], serde_json::json!(false), "{model}");
    assert_eq!(
        model["lambda_trainable"],
        serde_json::json!(false),
        "{model}"
    );
    assert_eq!(model["lambda_init"].as_f64(), Some(0.0), "{model}");
    assert_eq!(model["tau"].as_f64(), Some(1.5), "{model}");
    assert!(
        rows(&run)
            .iter()
            .all(|r| r["loss"].as_f64().unwrap().is_finite())
    );

    // The two transport ablations: I = X and Exchange-only, recorded and trained.
    let run = tmp.path().join("transport");
    let mut args = with(tiny_args(&run, &cache, &corpus), "--steps", "4");
    args.extend([
        "--info-from-input".to_string(),
        "--exchange-only".to_string(),
    ]);
    let out = ok(&args);
    assert!(out.contains("(I = X, Exchange-only)"), "{out}");
    let model: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("model.json")).unwrap()).unwrap();
    assert_eq!(
        model["info_projection"],
        serde_json::json!(false),
        "{model}"
    );
    assert_eq!(model["exchange_only"], serde_json::json!(true), "{model}");
    assert!(
        rows(&run)
            .iter()
            .all(|r| r["loss"].as_f64().unwrap().is_finite())
    );

    // Without --no-givens an odd head count is refused with the reason.
    let odd = with(
        tiny_args(&tmp.path().join("odd"), &cache, &corpus),
        "--n-heads",
        "1",
    );
    let err = fails_with(&odd, &[], "even");
    assert!(err.contains("heads"), "{err}");
}

/// `--linear-mode chunked:N` reaches the Linear Relation layers, the header and the saved model
/// configuration; it computes the same function as the recurrent default (equal first loss, before
/// any update); a chunk size the kernels lack is refused with the allowed ones.
#[test]
fn linear_mode_flag_selects_the_kernel() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let first_loss = |name: &str, mode: Option<&str>| {
        let run = tmp.path().join(name);
        let mut args = with(tiny_args(&run, &cache, &corpus), "--steps", "2");
        args = with(args, "--pattern", "L");
        if let Some(mode) = mode {
            args = with(args, "--linear-mode", mode);
        }
        let out = ok(&args);
        let model: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("model.json")).unwrap())
                .unwrap();
        (out, model, rows(&run)[0]["loss"].as_f64().unwrap())
    };
    let (_, model, recurrent) = first_loss("recurrent", None);
    assert_eq!(
        model["linear_mode"],
        serde_json::json!("recurrent"),
        "{model}"
    );
    let (out, model, chunked) = first_loss("chunked", Some("chunked:16"));
    assert!(
        out.contains("Linear Relation chunked:16"),
        "header names the mode:\n{out}"
    );
    assert_eq!(
        model["linear_mode"],
        serde_json::json!({"chunked": {"chunk_size": 16}}),
        "{model}"
    );
    assert!(
        (recurrent - chunked).abs() < 1e-4,
        "recurrent {recurrent} vs chunked {chunked}"
    );

    let bad = with(
        tiny_args(&tmp.path().join("bad"), &cache, &corpus),
        "--linear-mode",
        "chunked:7",
    );
    let err = fails_with(&bad, &[], "chunk");
    assert!(err.contains('7') && err.contains("64"), "{err}");
}

/// `--tokens-per-step` must be a whole number of micro-batches (--batch-size x --seq-len): any
/// other value is refused before the run directory is touched, naming the value and the
/// micro-batch, instead of training with another step size.
#[test]
fn tokens_per_step_not_a_whole_number_of_micro_batches_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let args = tiny_args(&run, &tmp.path().join("cache"), &corpus(tmp.path()));
    // The tiny run's micro-batch: 4 sequences of 32 tokens.
    for (tokens, nearest) in [("7", "e.g. 128)"), ("300", "e.g. 256 or 384)")] {
        let err = fails_with(
            &with(args.clone(), "--tokens-per-step", tokens),
            &[],
            &format!("invalid `train.tokens_per_step` = {tokens}"),
        );
        assert!(err.contains("4 x 32 = 128 tokens"), "{err}");
        assert!(err.contains(nearest), "{err}");
        assert!(!run.join("config.json").exists(), "{err}");
    }
}

/// `--activation-checkpointing` (only the blocks' inputs kept, one block recomputed at a time,
/// the loss over chunks of tokens) trains the same steps: the same losses, gradient norms and
/// validation losses, bit for bit, for Relation and Linear Relation layers, on rows of windows
/// and on packed documents.
#[test]
fn activation_checkpointing_gives_the_same_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let run = |name: &str, extra: &[&str]| {
        let dir = tmp.path().join(name);
        let mut args = with(tiny_args(&dir, &cache, &corpus), "--steps", "4");
        args = with(args, "--pattern", "LF");
        args.extend(extra.iter().map(|s| s.to_string()));
        ok(&args);
        rows(&dir)
    };
    for packing in ["windows", "documents"] {
        let plain = run(&format!("plain-{packing}"), &["--packing", packing]);
        let checkpointed = run(
            &format!("checkpointed-{packing}"),
            &["--packing", packing, "--activation-checkpointing"],
        );
        assert_eq!(plain.len(), checkpointed.len(), "{packing}: metrics rows");
        for (a, b) in plain.iter().zip(&checkpointed) {
            for key in ["loss", "grad_norm", "val_loss"] {
                assert_eq!(a[key], b[key], "{packing}: {key} at step {}", a["step"]);
            }
        }
    }
}
