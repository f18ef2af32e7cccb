//! The command line end to end on a tiny model: train, stop and resume (bit-identical losses),
//! eval, generate.

use crate::common::*;

fn f(row: &serde_json::Value, key: &str) -> Option<f64> {
    row.get(key).and_then(|v| v.as_f64())
}

#[test]
fn train_stop_resume_eval_generate() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());

    // An uninterrupted run of 8 steps.
    let a = tmp.path().join("a");
    let out = ok(&tiny_args(&a, &cache, &corpus));
    assert!(out.contains("training a byte-level BPE tokenizer"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    assert!(out.contains("validation: loss"), "{out}");
    assert!(out.contains("sample (temperature"), "{out}");
    for file in [
        "config.json",
        "model.json",
        "tokenizer.json",
        "metrics.csv",
        "metrics.jsonl",
    ] {
        assert!(a.join(file).is_file(), "missing {file}");
    }
    let png = std::fs::read(a.join("loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "loss.png is not a PNG");
    let csv = std::fs::read_to_string(a.join("metrics.csv")).unwrap();
    assert_eq!(
        csv.lines().count(),
        1 + 8,
        "header + one line per step:\n{csv}"
    );
    assert_eq!(latest(&a), "step-00000008");
    let kept = std::fs::read_dir(a.join("checkpoints"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert_eq!(kept, 2, "keep_checkpoints = 2");
    let rows_a = rows(&a);
    assert_eq!(rows_a.len(), 8);
    for (i, row) in rows_a.iter().enumerate() {
        assert_eq!(row["step"].as_u64(), Some(i as u64 + 1));
        assert_eq!(row["tokens"].as_u64(), Some(256 * (i as u64 + 1)));
        assert!(f(row, "loss").unwrap().is_finite());
        assert!(f(row, "grad_norm").unwrap() > 0.0);
        assert_eq!(row["val_loss"].is_null(), (i + 1) % 4 != 0);
    }
    // It learns: the last loss is below the first (ln 300 = 5.70 at the start).
    let first = f(&rows_a[0], "loss").unwrap();
    let last = f(&rows_a[7], "loss").unwrap();
    assert!(first > 5.0 && last < first - 0.3, "loss {first} -> {last}");

    // The same run stopped at step 4, then resumed: the same losses, bit for bit.
    let b = tmp.path().join("b");
    let out = ok(&with(tiny_args(&b, &cache, &corpus), "--stop-at", "4"));
    assert!(
        out.contains("data: reusing"),
        "second run reuses the token cache:\n{out}"
    );
    assert!(out.contains("stopped at step 4/8"), "{out}");
    assert!(out.contains("relation train --resume"), "{out}");
    assert_eq!(latest(&b), "step-00000004");
    let out = ok(&[
        "train".into(),
        "--resume".into(),
        "--run-dir".into(),
        b.to_str().unwrap().into(),
        "--no-progress".into(),
    ]);
    assert!(out.contains("resume:"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    let rows_b = rows(&b);
    assert_eq!(rows_b.len(), 8);
    for (ra, rb) in rows_a.iter().zip(&rows_b) {
        for key in [
            "step",
            "tokens",
            "lr",
            "loss",
            "grad_norm",
            "val_loss",
            "val_bpb",
        ] {
            assert_eq!(ra[key], rb[key], "{key} differs at step {}", ra["step"]);
        }
    }

    // Data parallel over two replicas (here two copies on flex, each on its own thread): the
    // micro-batches are summed in order, so the run is the same as on one device.
    let c = tmp.path().join("c");
    let out = ok(&with(
        tiny_args(&c, &cache, &corpus),
        "--devices",
        "flex,flex",
    ));
    assert!(out.contains("device flex + flex"), "{out}");
    assert!(
        out.contains("data parallel: gradients summed in micro-batch order on flex"),
        "Flex has no Burn collective, so auto takes the ordered sum:\n{out}"
    );
    for (ra, rc) in rows_a.iter().zip(&rows(&c)) {
        for key in ["loss", "grad_norm", "val_loss"] {
            assert_eq!(ra[key], rc[key], "{key} differs at step {}", ra["step"]);
        }
    }

    // Eval of the final checkpoint on the same validation tokens reproduces the logged loss.
    let run = a.to_str().unwrap().to_string();
    let out = ok(&[
        "eval".into(),
        "--run-dir".into(),
        run.clone(),
        "--eval-tokens".into(),
        "256".into(),
    ]);
    let logged = f(&rows_a[7], "val_loss").unwrap();
    let printed: f64 = out
        .split("loss ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no loss in:\n{out}"));
    assert!(
        (printed - logged).abs() < 1e-3,
        "eval {printed} vs logged {logged}"
    );
    // On any text.
    let other = tmp.path().join("other.jsonl");
    std::fs::write(
        &other,
        "{\"text\": \"Call me Ishmael. The whale.\"}\n{\"text\": \"The sea was calm.\"}\n",
    )
    .unwrap();
    let out = ok(&[
        "eval".into(),
        "--run-dir".into(),
        run.clone(),
        "--data".into(),
        other.to_str().unwrap().into(),
    ]);
    assert!(out.contains("on 2 documents"), "{out}");

    // Generation continues the prompt and is repeatable for a seed.
    let gen_args: Vec<String> = [
        "generate",
        "--run-dir",
        &run,
        "--prompt",
        "Call me",
        "--max-new-tokens",
        "12",
        "--seed",
        "7",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let g1 = ok(&gen_args);
    let g2 = ok(&gen_args);
    assert!(g1.starts_with("Call me"), "{g1}");
    assert!(g1.len() > "Call me".len() + 5, "{g1}");
    assert_eq!(g1, g2, "same seed, same sample");
}

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

/// Data parallel through Burn's collective: refused on Flex, which has none in Burn 0.22, with
/// the reason; and the collective's arrangement — each replica sums its own micro-batches,
/// then the replicas' sums are added — run with the host doing the all-reduce: bit for bit one
/// device with one micro-batch per replica (a single addition per element), and equal up to
/// the order of the sum with two each.
#[test]
fn data_parallel_collective_arrangement() {
    use relation_train::train::HOST_ALL_REDUCE_ENV;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let short = |run: &std::path::Path, tokens: &str| {
        let args = with(tiny_args(run, &cache, &corpus), "--steps", "4");
        with(args, "--tokens-per-step", tokens)
    };

    let refused = tmp.path().join("refused");
    let args = with(short(&refused, "256"), "--devices", "flex,flex");
    let out = fails_with(
        &with(args, "--reduce", "collective"),
        &[],
        "--reduce collective",
    );
    assert!(
        out.contains("`flex` is a Flex device, and Burn 0.22 has no collective operations there"),
        "{out}"
    );

    // Asked for nothing (auto), the same devices take the ordered sum, and the trace says why.
    let auto = tmp.path().join("auto");
    let args = with(short(&auto, "256"), "--devices", "flex,flex");
    let out = relation(&args, &[("RUST_LOG", "relation_train=info")]);
    let out = text(&out);
    assert!(
        out.contains("no Burn collective over these devices")
            && out.contains("has no collective operations there"),
        "{out}"
    );

    let host = [(HOST_ALL_REDUCE_ENV, "1")];
    for (tokens, bitwise) in [("256", true), ("512", false)] {
        let one = tmp.path().join(format!("one-{tokens}"));
        ok(&short(&one, tokens));
        let two = tmp.path().join(format!("two-{tokens}"));
        let out = relation(&with(short(&two, tokens), "--devices", "flex,flex"), &host);
        let out = text(&out);
        assert!(out.contains("replica sums added by the host"), "{out}");
        for (a, b) in rows(&one).iter().zip(&rows(&two)) {
            for key in ["loss", "grad_norm"] {
                let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
                if bitwise {
                    assert_eq!(x, y, "{key} at step {} ({tokens} tokens)", a["step"]);
                } else {
                    assert!(
                        (x - y).abs() <= COLLECTIVE_REL_TOL * x.abs(),
                        "{key} at step {}: one device {x} vs replica sums {y}",
                        a["step"]
                    );
                }
            }
        }
    }
}

/// How far the collective's order of summation (each replica's micro-batches, then the
/// replicas) may move the tiny run's loss and gradient norm from one device's (micro-batches
/// in order) over 4 steps of 4 micro-batches: f32 rounding of the reordered sums, carried
/// through AdamW's updates. Measured: at most 6.6e-8 (about one f32 rounding) over these 4
/// steps, 3e-7 over 12; the bound leaves room for other CPUs' rounding of the same sums.
const COLLECTIVE_REL_TOL: f64 = 1e-6;

/// The same command on wgpu: the fused CubeCL kernels train the model (software Vulkan here);
/// and data parallel across two backends (flex holds the optimizer, wgpu computes every other
/// micro-batch on a forked copy) matches flex alone up to float rounding — through the ordered
/// sum, as Burn's collective spans one backend (and wgpu has none), which `--reduce
/// collective` says.
#[cfg(feature = "wgpu")]
#[test]
fn trains_on_wgpu_and_across_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let short = |run: &std::path::Path| with(tiny_args(run, &cache, &corpus), "--steps", "2");

    let gpu = tmp.path().join("gpu");
    let out = ok(&with(short(&gpu), "--device", "wgpu"));
    assert!(out.contains("device wgpu"), "{out}");
    assert!(out.contains("finished at step 2/2"), "{out}");
    assert!(
        rows(&gpu)
            .iter()
            .all(|r| r["loss"].as_f64().unwrap().is_finite())
    );

    let flex = tmp.path().join("flex");
    ok(&short(&flex));
    let both = tmp.path().join("both");
    let out = ok(&with(short(&both), "--devices", "flex,wgpu"));
    assert!(out.contains("device flex + wgpu"), "{out}");
    assert!(
        out.contains("gradients summed in micro-batch order on flex"),
        "{out}"
    );
    for (a, b) in rows(&flex).iter().zip(&rows(&both)) {
        for key in ["loss", "grad_norm"] {
            let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-4 * x.abs(),
                "{key} at step {}: flex {x} vs flex+wgpu {y}",
                a["step"]
            );
        }
    }
    let refused = tmp.path().join("refused");
    let args = with(short(&refused), "--devices", "flex,wgpu");
    let out = fails_with(
        &with(args, "--reduce", "collective"),
        &[],
        "--reduce collective",
    );
    assert!(out.contains("different backends"), "{out}");
    let args = with(short(&refused), "--devices", "wgpu,wgpu");
    let out = fails_with(
        &with(args, "--reduce", "collective"),
        &[],
        "--reduce collective",
    );
    assert!(out.contains("no transport between its devices"), "{out}");
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

/// `relation report` turns a folder of `<variant>-s<seed>` runs into the table and two plots;
/// unfinished runs are listed, not averaged.
#[test]
fn report_tabulates_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let runs = tmp.path().join("runs");
    for (name, pattern, steps) in [("A-s0", "A", "4"), ("F-s0", "F", "4"), ("F-s1", "F", "4")] {
        let args = with(
            tiny_args(&runs.join(name), &cache, &corpus),
            "--steps",
            steps,
        );
        let args = with(with(args, "--pattern", pattern), "--eval-every", "2");
        ok(&with(args, "--seed", &name[3..]));
    }
    // An unfinished run: stopped at step 2 of 4.
    let args = with(
        tiny_args(&runs.join("L-s0"), &cache, &corpus),
        "--steps",
        "4",
    );
    ok(&with(with(args, "--pattern", "L"), "--stop-at", "2"));

    let out_dir = tmp.path().join("results");
    let out = ok(&[
        "report".to_string(),
        runs.to_str().unwrap().to_string(),
        "--out".to_string(),
        out_dir.to_str().unwrap().to_string(),
    ]);
    let table = std::fs::read_to_string(out_dir.join("table.md")).unwrap();
    assert!(table.contains("| A | 0 |"), "{table}");
    assert!(table.contains("| F | 0, 1 |"), "{table}");
    assert!(
        !table.contains("| L |"),
        "unfinished runs stay out of the table:\n{table}"
    );
    assert!(
        out.contains("unfinished (not in the table): L-s0 at step 2/4"),
        "{out}"
    );
    for png in ["val.png", "gap.png"] {
        let bytes = std::fs::read(out_dir.join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
}

#[test]
fn generation_stops_at_end_of_text_streams_and_exports() {
    let tmp = tempfile::tempdir().unwrap();
    // One short sentence per document: every document ends with <|endoftext|>, so a trained
    // model ends its continuation there.
    let data = tmp.path().join("sat.jsonl");
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
    let run = tmp.path().join("run");
    let cache = tmp.path().join("cache");
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
    let r = run.to_str().unwrap().to_string();
    let generate = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["generate", "--run-dir", &r, "--temperature", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let stdout = |args: &[String]| {
        let out = relation(args, &[]);
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    // Greedy: the sentence, then end-of-text ends it (30 tokens would allow three more
    // sentences); no special token is printed.
    let out = stdout(&generate(&[
        "--prompt",
        "the owl",
        "--max-new-tokens",
        "30",
    ]));
    assert_eq!(out, "the owl sat on the mat.\n");
    // A stop string ends it earlier, and is not printed.
    let out = stdout(&generate(&[
        "--prompt",
        "the owl",
        "--max-new-tokens",
        "30",
        "--stop",
        " on",
    ]));
    assert_eq!(out, "the owl sat\n");
    // The prompt from a file, and from standard input.
    let file = tmp.path().join("prompt.txt");
    std::fs::write(&file, "the dog").unwrap();
    let out = stdout(&generate(&["--prompt-file", file.to_str().unwrap()]));
    assert_eq!(out, "the dog sat on the mat.\n");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_relation"))
        .args(generate(&["--prompt", "-"]))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"the fox").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "the fox sat on the mat.\n"
    );
    // A prompt longer than the context (32 tokens) is refused, or cut with --truncate-prompt.
    let long = "the cat sat on the mat. ".repeat(12);
    fails_with(
        &generate(&["--prompt", &long]),
        &[],
        "longer than the run's context of 32 tokens",
    );
    let out = relation(
        &generate(&[
            "--prompt",
            &long,
            "--truncate-prompt",
            "--max-new-tokens",
            "3",
        ]),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("cut to its last 32 tokens"),
        "{}",
        text(&out)
    );

    // Export: safetensors (an 8-byte header length, then a JSON header naming the tensors)
    // with the configuration and the tokenizer beside it.
    let dest = tmp.path().join("export/m.safetensors");
    let out = ok(&[
        "export".into(),
        "--run-dir".into(),
        r.clone(),
        "--out".into(),
        dest.to_str().unwrap().into(),
    ]);
    assert!(out.contains("step 40"), "{out}");
    let bytes = std::fs::read(&dest).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    assert!(header.contains("embedding.weight"), "{header}");
    for name in ["model.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(tmp.path().join("export").join(name)).unwrap(),
            std::fs::read(run.join(name)).unwrap()
        );
    }
}

/// `RUST_LOG` turns on the trainer's trace, on stderr only: here, the checkpoint writes.
#[test]
fn rust_log_traces_checkpoint_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let run = tmp.path().join("run");
    let args = with(tiny_args(&run, &cache, &corpus), "--stop-at", "2");
    let out = relation(&args, &[("RUST_LOG", "relation_train=debug")]);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("checkpoint written") && l.contains("step=2")),
        "no checkpoint event on stderr:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("checkpoint written"), "{stdout}");
}

/// Mixed precision: `--precision f16|bf16` on `device` keeps f32 master weights, runs the
/// passes in half precision, tracks the f32 run's loss step by step (within 1%; the weights
/// start equal whatever the precision), announces and records itself, and (f16) saves its loss
/// scale in every checkpoint.
fn check_precision_tracks_f32(device: &str, precision: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let train = |name: &str, precision: &str| {
        let run = tmp.path().join(name);
        let mut args = with(tiny_args(&run, &cache, &corpus), "--steps", "6");
        args = with(args, "--device", device);
        args = with(args, "--precision", precision);
        let out = ok(&args);
        (run, out)
    };
    let (f32_run, _) = train("f32", "f32");
    let (half_run, out) = train("half", precision);
    assert!(
        out.contains(&format!("{precision} compute with f32 master weights")),
        "{out}"
    );
    let (a, b) = (rows(&f32_run), rows(&half_run));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 0.01 * x,
            "{device}: step loss f32 {x} vs {precision} {y}"
        );
    }
    let first = b[0]["loss"].as_f64().unwrap();
    let last = b[b.len() - 1]["loss"].as_f64().unwrap();
    assert!(last < first, "{precision} trains: {first} -> {last}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(half_run.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["train"]["precision"], precision);
    let scale = state(&half_run).get("loss_scale").cloned();
    if precision == "f16" {
        assert_eq!(
            scale,
            Some(serde_json::json!({"scale": 65536.0, "good_steps": 6}))
        );
    } else {
        assert_eq!(scale, None);
    }
    assert!(state(&f32_run).get("loss_scale").is_none());
}

/// The checkpoint state (`state.json`) that `latest` names.
fn state(run: &std::path::Path) -> serde_json::Value {
    let dir = run.join("checkpoints").join(latest(run));
    serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).unwrap()).unwrap()
}

#[test]
fn half_precision_on_flex_tracks_f32() {
    check_precision_tracks_f32("flex", "bf16");
    check_precision_tracks_f32("flex", "f16");
}

/// f16 on wgpu (f16 arithmetic in software Vulkan here, the CubeCL kernels in f16); and f16
/// gradients that overflow (a loss scale of 1e30) skip the update and halve the scale instead
/// of stopping the run.
#[cfg(feature = "wgpu")]
#[test]
fn f16_on_wgpu_tracks_f32_and_survives_overflow() {
    check_precision_tracks_f32("wgpu", "f16");

    let tmp = tempfile::tempdir().unwrap();
    let over = tmp.path().join("over");
    let mut args = with(
        tiny_args(&over, &tmp.path().join("cache"), &corpus(tmp.path())),
        "--steps",
        "2",
    );
    args = with(args, "--device", "wgpu");
    args = with(args, "--precision", "f16");
    let out = relation_ok(&args, &[("RELATION_TEST_LOSS_SCALE", "1e30")]);
    assert!(
        out.contains("f16 gradients overflowed: update skipped, loss scale"),
        "{out}"
    );
    assert_eq!(state(&over)["loss_scale"]["scale"].as_f64(), Some(2.5e29));
    assert_eq!(
        state(&over)["skipped_steps"],
        0,
        "an overflow is not a divergence"
    );
    assert!(rows(&over)[0]["loss"].as_f64().unwrap().is_finite());
}
