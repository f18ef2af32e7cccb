//! `relation generate` and `relation export`: streamed sampling that ends at end-of-text or a
//! stop string, prompts from files and standard input, and the standalone safetensors model.

use crate::common::*;

#[test]
fn generation_stops_at_end_of_text_streams_and_exports() {
    let tmp = tempfile::tempdir().unwrap();
    let run = sat_run(tmp.path());
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
    // With the decoding caches in f16 and bf16 (their rounding does not move this confident
    // model's greedy choice); an unknown cache dtype is refused with the choices named.
    for dtype in ["f16", "bf16"] {
        let out = stdout(&generate(&[
            "--prompt",
            "the owl",
            "--max-new-tokens",
            "30",
            "--cache-dtype",
            dtype,
        ]));
        assert_eq!(out, "the owl sat on the mat.\n", "--cache-dtype {dtype}");
    }
    fails_with(
        &generate(&["--cache-dtype", "f8"]),
        &[],
        "possible values: model, f16, bf16, f32",
    );
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
    // One prompt per line, decoded together two at a time (continuous batching, caches in f16):
    // one JSON line per prompt as it ends, each the same as the prompt alone; blank lines are
    // skipped.
    let lines = tmp.path().join("prompts.txt");
    std::fs::write(&lines, "the dog\n\nthe owl\nthe cat sat\nthe fox\n").unwrap();
    let out = stdout(&generate(&[
        "--prompt-file",
        lines.to_str().unwrap(),
        "--each-line",
        "--max-batch",
        "2",
        "--max-new-tokens",
        "30",
        "--cache-dtype",
        "f16",
    ]));
    let mut rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    rows.sort_by_key(|r| r["index"].as_u64());
    let prompts: Vec<&str> = rows.iter().map(|r| r["prompt"].as_str().unwrap()).collect();
    assert_eq!(prompts, ["the dog", "the owl", "the cat sat", "the fox"]);
    for row in &rows {
        let want = if row["prompt"] == "the cat sat" {
            " on the mat."
        } else {
            " sat on the mat."
        };
        assert_eq!(row["completion"], want, "{row}");
        assert_eq!(row["finish_reason"], "stop", "{row}");
    }
    // A stop string, and a length limit.
    let each = |extra: &[&str]| -> Vec<(String, String)> {
        let mut a = vec!["--prompt-file", lines.to_str().unwrap(), "--each-line"];
        a.extend(extra);
        let mut rows: Vec<serde_json::Value> = stdout(&generate(&a))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        rows.sort_by_key(|r| r["index"].as_u64());
        rows.iter()
            .map(|r| {
                let field = |k: &str| r[k].as_str().unwrap().to_string();
                (field("completion"), field("finish_reason"))
            })
            .collect()
    };
    let pair = |c: &str, r: &str| (c.to_string(), r.to_string());
    let stopped = each(&["--max-new-tokens", "30", "--stop", " on"]);
    assert_eq!(stopped[1], pair(" sat", "stop"));
    assert_eq!(stopped[2], pair("", "stop"));
    let short = each(&["--max-new-tokens", "1"]);
    assert_eq!(short[0], pair(" sat", "length"));
    assert_eq!(short[2], pair(" on", "length"));
    fails_with(
        &generate(&[
            "--prompt-file",
            lines.to_str().unwrap(),
            "--each-line",
            "--samples",
            "2",
        ]),
        &[],
        "must be 1 with --each-line",
    );
    // A prompt longer than the context (32 tokens) is refused, read whole with a larger
    // --max-context, or cut with --truncate-prompt.
    let long = "the cat sat on the mat. ".repeat(12);
    fails_with(
        &generate(&["--prompt", &long]),
        &[],
        "longer than the context of 32 tokens",
    );
    let out = relation(
        &generate(&[
            "--prompt",
            &long,
            "--max-context",
            "4096",
            "--max-new-tokens",
            "3",
        ]),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("extrapolate"), "{}", text(&out));
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
