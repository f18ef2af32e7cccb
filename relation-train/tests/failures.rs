//! Crashes, corruption, divergence and bad input: clear errors, no lost or overwritten work.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

#[test]
fn crash_during_checkpoint_write_keeps_the_previous_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    ok(&with(tiny_args(&run, &cache, &corpus), "--stop-at", "4"));
    assert_eq!(latest(&run), "step-00000004");
    // Abort in the middle of writing the step-6 checkpoint (after the model file).
    let out = relation(&fault(&resume_args(&run), "crash-during-save"), &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(
        latest(&run),
        "step-00000004",
        "latest must still name a complete checkpoint"
    );
    assert!(
        run.join("checkpoints/.tmp-step-00000006").is_dir(),
        "the half-written one is aside"
    );
    // A resume continues from step 4, cleans the leftover and finishes.
    let out = ok(&resume_args(&run));
    assert!(out.contains("(step 4)"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    assert!(!run.join("checkpoints/.tmp-step-00000006").exists());
    let steps: Vec<u64> = rows(&run)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=8).collect::<Vec<_>>(), "each step logged once");
}

#[test]
fn killed_at_random_moments_always_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    // A checkpoint after every step, so kills land in saves as well as in steps.
    let args = with(
        with(tiny_args(&run, &cache, &corpus), "--checkpoint-every", "1"),
        "--steps",
        "40",
    );
    ok(&with(args.clone(), "--stop-at", "1"));
    for delay_ms in [700u64, 1300, 2100] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_relation"))
            .args(resume_args(&run))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL: no chance to clean up
        child.wait().unwrap();
        // Whatever was interrupted, `latest` names a checkpoint that verifies and loads.
        let out = ok(&[
            "eval".into(),
            "--run-dir".into(),
            run.to_str().unwrap().into(),
            "--eval-tokens".into(),
            "64".into(),
        ]);
        assert!(out.contains("bits/byte"), "{out}");
    }
    let out = ok(&resume_args(&run));
    assert!(out.contains("finished at step 40/40"), "{out}");
}

#[test]
fn corrupted_or_foreign_checkpoints_are_refused_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    ok(&with(tiny_args(&run, &cache, &corpus), "--stop-at", "2"));
    let ckpt = run.join("checkpoints/step-00000002");

    // One flipped byte in the weights.
    let model = ckpt.join("model.bpk");
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&model, &bytes).unwrap();
    fails_with(&resume_args(&run), &[], "corrupt");
    fails_with(
        &[
            "eval".into(),
            "--run-dir".into(),
            run.to_str().unwrap().into(),
        ],
        &[],
        "corrupt",
    );
    assert_eq!(
        std::fs::read(&model).unwrap(),
        bytes,
        "a refused checkpoint is never overwritten"
    );
    bytes[mid] ^= 0x5a;
    std::fs::write(&model, &bytes).unwrap();

    // A truncated optimizer file.
    let optim = ckpt.join("optim.bpk");
    let good = std::fs::read(&optim).unwrap();
    std::fs::write(&optim, &good[..good.len() / 3]).unwrap();
    fails_with(&resume_args(&run), &[], "corrupt");
    std::fs::write(&optim, &good).unwrap();

    // A checkpoint of another model: swap in a model.json with another width.
    let model_json = run.join("model.json");
    let original = std::fs::read_to_string(&model_json).unwrap();
    std::fs::write(
        &model_json,
        original.replace("\"d_model\": 32", "\"d_model\": 64"),
    )
    .unwrap();
    fails_with(
        &[
            "eval".into(),
            "--run-dir".into(),
            run.to_str().unwrap().into(),
        ],
        &[],
        "another model configuration",
    );
    fails_with(&resume_args(&run), &[], "model.json differs");
    std::fs::write(&model_json, &original).unwrap();

    // Garbage state, and a `latest` that names nothing.
    let state = ckpt.join("state.json");
    let good_state = std::fs::read_to_string(&state).unwrap();
    std::fs::write(&state, "{ not json").unwrap();
    fails_with(&resume_args(&run), &[], "state.json");
    std::fs::write(&state, &good_state).unwrap();
    // Repaired, it resumes; a `latest` that names nothing is skipped for the newest checkpoint
    // that verifies, with a message.
    std::fs::write(run.join("checkpoints/latest"), "step-00000099").unwrap();
    let out = ok(&resume_args(&run));
    assert!(out.contains("does not exist"), "{out}");
    assert!(out.contains("falling back to"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
}

#[test]
fn non_finite_loss_stops_and_keeps_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let t = fails_with(
        &fault(&tiny_args(&run, &cache, &corpus), "poison-steps=3"),
        &[],
        "training stopped at step 3: loss is NaN",
    );
    assert!(
        t.contains("step-00000002"),
        "names the last good checkpoint:\n{t}"
    );
    assert_eq!(latest(&run), "step-00000002");
    assert_eq!(rows(&run).len(), 2, "the poisoned step is not logged");
    // The run goes on from the good checkpoint.
    assert!(ok(&resume_args(&run)).contains("finished at step 8/8"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let base = tiny_args(&run, &cache, &corpus);
    for (flag, value, needle) in [
        ("--device", "tpu", "unknown backend"),
        ("--device", "wgpu:x", "not a device index"),
        (
            "--device",
            "cuda",
            "not compiled into this build; rebuild with `--features cuda`",
        ),
        ("--steps", "0", "invalid `train.steps` = 0"),
        ("--lr", "-1", "invalid `train.lr` = -1"),
        ("--val-fraction", "0.7", "invalid `data.val_fraction` = 0.7"),
        ("--vocab-size", "10", "invalid `data.vocab_size` = 10"),
        ("--warmup-steps", "100", "must be <= train.steps = 8"),
        ("--n-heads", "3", "not divisible by n_heads = 3"),
        ("--preset", "huge", "unknown preset"),
        ("--pattern", "FX", "unknown mixer letter `X`"),
        ("--data", "/no/such/file.txt", "/no/such/file.txt"),
        (
            "--tokenizer",
            "/no/such/tokenizer.json",
            "/no/such/tokenizer.json",
        ),
    ] {
        let _ = std::fs::remove_dir_all(&run);
        fails_with(&with(base.clone(), flag, value), &[], needle);
    }
    // A context longer than the training split (with a step of whole micro-batches of it:
    // 4 x 100,000 tokens).
    let _ = std::fs::remove_dir_all(&run);
    let long = with(base.clone(), "--seq-len", "100000");
    fails_with(
        &with(long, "--tokens-per-step", "400000"),
        &[],
        "fewer than seq_len + 1 = 100001",
    );

    // Data files.
    let bad_jsonl = tmp.path().join("bad.jsonl");
    std::fs::write(
        &bad_jsonl,
        "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n",
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&run);
    fails_with(
        &with(base.clone(), "--data", bad_jsonl.to_str().unwrap()),
        &[],
        "bad.jsonl:2: no string field `text`",
    );
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "  \n").unwrap();
    let _ = std::fs::remove_dir_all(&run);
    fails_with(
        &with(base.clone(), "--data", empty.to_str().unwrap()),
        &[],
        "no text found",
    );

    // Config files.
    let config = tmp.path().join("config.json");
    std::fs::write(&config, r#"{"train": {"stepz": 3}}"#).unwrap();
    let _ = std::fs::remove_dir_all(&run);
    fails_with(
        &with(base.clone(), "--config", config.to_str().unwrap()),
        &[],
        "unknown field `stepz`",
    );

    // Run directories: never overwrite a run; resume only a run, with its own settings.
    let _ = std::fs::remove_dir_all(&run);
    ok(&with(base.clone(), "--stop-at", "1"));
    fails_with(&base, &[], "already holds a run; pass --resume");
    let mut resume_seq = resume_args(&run);
    resume_seq.extend(["--seq-len".into(), "64".into()]);
    fails_with(&resume_seq, &[], "train.seq_len 32 -> 64");
    let nothing = tmp.path().join("nothing");
    fails_with(&resume_args(&nothing), &[], "has no config.json");
    // A hand-edited config.json that no longer parses is named with the parser's message.
    let config_path = run.join("config.json");
    let saved = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, saved.replace("\"train\"", "\"trian\"")).unwrap();
    fails_with(&resume_args(&run), &[], "unknown field `trian`");
    std::fs::write(&config_path, saved).unwrap();
    fails_with(
        &[
            "eval".into(),
            "--run-dir".into(),
            nothing.to_str().unwrap().into(),
        ],
        &[],
        "config.json",
    );

    // Generation settings.
    let r = run.to_str().unwrap().to_string();
    fails_with(
        &[
            "generate".into(),
            "--run-dir".into(),
            r.clone(),
            "--prompt".into(),
            "".into(),
        ],
        &[],
        "--prompt",
    );
    fails_with(
        &[
            "generate".into(),
            "--run-dir".into(),
            r.clone(),
            "--top-p".into(),
            "1.5".into(),
        ],
        &[],
        "invalid `--top-p` = 1.5",
    );
    fails_with(
        &[
            "generate".into(),
            "--run-dir".into(),
            r,
            "--temperature".into(),
            "-1".into(),
        ],
        &[],
        "temperature",
    );
}

/// Started by an MPI launcher as one of several processes (what `mpirun -np 2` tells each of
/// them), a build without the `mpi` feature refuses before touching the run directory; one
/// process of one trains as usual.
#[cfg(not(feature = "mpi"))]
#[test]
fn several_mpi_processes_are_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    for variable in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        let run = tmp.path().join(variable);
        let t = fails_with(
            &tiny_args(&run, &cache, &corpus),
            &[(variable, "2")],
            &format!("started as one of 2 processes by an MPI launcher ({variable}=2)"),
        );
        assert!(t.contains("Rebuild with `--features mpi`"), "{t}");
        assert!(!run.exists(), "nothing written to the run directory");
    }
    let run = tmp.path().join("one");
    relation_ok(
        &tiny_args(&run, &cache, &corpus),
        &[("OMPI_COMM_WORLD_SIZE", "1")],
    );
}
