//! A run's life on the command line: train, stop and resume (bit-identical losses), eval and
//! generate from it; and `RUST_LOG`'s trace beside the command's output.

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
        // The peak resident memory, as Linux reports it: never below the model it holds.
        #[cfg(target_os = "linux")]
        assert!(f(row, "peak_rss_mib").unwrap() > 1.0, "{row}");
        // Model FLOP/s: tokens/s times the model's FLOPs per training token.
        let flops = f(row, "model_gflop_per_s").unwrap() * 1e9 / f(row, "tokens_per_s").unwrap();
        assert!(flops > 1e3 && flops < 1e9, "{row}");
    }
    #[cfg(target_os = "linux")]
    assert!(out.contains("peak resident memory: "), "{out}");
    assert!(out.contains("model FLOP/s: "), "{out}");
    assert!(out.contains("MFLOP per training token"), "{out}");
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .ends_with(",peak_rss_mib,model_gflop_per_s"),
        "{csv}"
    );
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
    let logged = f(&rows_a[7], "val_loss").unwrap();
    let (_, printed) = eval_loss(&a, &[]);
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
