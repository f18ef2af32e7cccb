//! `--packing`: a corpus of many documents trains on packed documents by default; such a run
//! resumes bit-exactly, evaluates in its own layout, and cannot switch layout on resume.

use std::path::{Path, PathBuf};

use crate::common::*;

/// The shipped corpus's first 80 KB as a JSON Lines file of its paragraphs: many short
/// documents (each at least 40 bytes).
fn documents(dir: &Path) -> (PathBuf, usize) {
    let text = std::fs::read_to_string(corpus(dir))
        .unwrap()
        .replace("\r\n", "\n");
    let mut lines = String::new();
    let mut n = 0;
    for paragraph in text.split("\n\n").filter(|p| p.trim().len() >= 40) {
        lines.push_str(&serde_json::json!({ "text": paragraph.trim() }).to_string());
        lines.push('\n');
        n += 1;
    }
    let path = dir.join("paragraphs.jsonl");
    std::fs::write(&path, lines).unwrap();
    (path, n)
}

fn config(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("config.json")).unwrap()).unwrap()
}

#[test]
fn packed_documents_by_default_resume_bit_exactly_and_evaluate_in_their_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (docs, n) = documents(tmp.path());
    assert!(n >= 64, "{n} paragraphs: auto must choose documents");

    // Uninterrupted, with the default layout.
    let a = tmp.path().join("a");
    let out = ok(&tiny_args(&a, &cache, &docs));
    assert!(out.contains("data: packing documents"), "{out}");
    assert!(out.contains("rows: documents"), "{out}");
    assert_eq!(
        config(&a)["data"]["packing"],
        "documents",
        "the resolved layout is recorded"
    );
    let rows_a = rows(&a);
    assert_eq!(rows_a.len(), 8);

    // Stopped at step 4 and resumed: the same losses and validation, bit for bit.
    let b = tmp.path().join("b");
    ok(&with(tiny_args(&b, &cache, &docs), "--stop-at", "4"));
    let out = ok(&resume_args(&b));
    assert!(out.contains("finished at step 8/8"), "{out}");
    for (ra, rb) in rows_a.iter().zip(&rows(&b)) {
        for key in ["loss", "grad_norm", "val_loss"] {
            assert_eq!(ra[key], rb[key], "{key} differs at step {}", ra["step"]);
        }
    }

    // The layout defines the run: a resume cannot switch it.
    fails_with(
        &with(resume_args(&b), "--packing", "windows"),
        &[],
        "data.packing",
    );

    // `eval` uses the run's layout, so it reproduces the logged validation loss.
    let logged = rows_a[7]["val_loss"].as_f64().unwrap();
    let (out, printed) = eval_loss(&a, &[]);
    assert!(
        (printed - logged).abs() < 1e-3,
        "eval {printed} vs logged {logged}"
    );

    assert!(out.contains("(documents rows)"), "{out}");
    // Asked for the other layout, it scores the same tokens with context across documents
    // (the library test `packed_evaluation_scores_each_document_alone` shows the difference).
    let (out, _) = eval_loss(&a, &["--packing", "windows"]);
    assert!(out.contains("(windows rows): 256 tokens"), "{out}");

    // Windows over the same data: same tokens and order, other attention pattern, other losses.
    let c = tmp.path().join("c");
    let out = ok(&with(tiny_args(&c, &cache, &docs), "--packing", "windows"));
    assert!(out.contains("rows: windows"), "{out}");
    assert_eq!(config(&c)["data"]["packing"], "windows");
    let rows_c = rows(&c);
    // (The first step's loss can agree: the mixers' output projections start at zero.)
    assert_eq!(rows_a[7]["tokens"], rows_c[7]["tokens"]);
    assert_ne!(
        rows_a[7]["loss"], rows_c[7]["loss"],
        "packing must change what rows see"
    );
    assert_ne!(rows_a[7]["val_loss"], rows_c[7]["val_loss"]);
}
