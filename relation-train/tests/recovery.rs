//! Recovering runs: a failed first start, --overwrite, --resume auto, resuming from an older
//! checkpoint with a changed learning rate, falling back past a damaged checkpoint, skipping
//! non-finite steps, and the lock that keeps a second writer out.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn plus(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The numbers of each logged step that a rerun must reproduce (not its time or speed).
fn numbers(run: &Path) -> Vec<[serde_json::Value; 5]> {
    rows(run)
        .into_iter()
        .map(|r| ["step", "lr", "loss", "grad_norm", "val_loss"].map(|k| r[k].clone()))
        .collect()
}

fn steps_logged(run: &Path) -> Vec<u64> {
    rows(run)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_failed_first_start_can_be_rerun_or_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = tiny_args(&run, &cache, &corpus);
    // Dies at step 1, before the first checkpoint (step 2): config.json exists, no checkpoint.
    fails_with(&fault(&args, "poison-steps=1"), &[], "step 1");
    assert!(run.join("config.json").exists());
    assert!(!run.join("checkpoints/latest").exists());
    // The same command again starts afresh (it used to be refused as "already holds a run").
    let out = ok(&args);
    assert!(out.contains("starting afresh"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    assert_eq!(steps_logged(&run), (1..=8).collect::<Vec<_>>());

    // --resume after a failed first start begins at step 0 with the saved configuration.
    let run2 = tmp.path().join("run2");
    let args2 = tiny_args(&run2, &cache, &corpus);
    fails_with(&fault(&args2, "poison-steps=1"), &[], "step 1");
    let out = ok(&resume_args(&run2));
    assert!(out.contains("starting from step 0"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    // Same weights as the clean run: the failed start left nothing behind.
    let (a, b) = (rows(&run), rows(&run2));
    assert_eq!(a.last().unwrap()["val_loss"], b.last().unwrap()["val_loss"]);
}

#[test]
fn overwrite_and_resume_auto() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = tiny_args(&run, &cache, &corpus);

    // --resume auto on an empty directory starts the run, with every flag.
    let auto = plus(args.clone(), &["--resume", "auto"]);
    let out = ok(&with(auto.clone(), "--stop-at", "2"));
    assert!(!out.contains("resume:"), "{out}");
    assert_eq!(latest(&run), "step-00000002");
    // A plain rerun is refused and says how to go on.
    let t = fails_with(&args, &[], "already holds a run");
    assert!(t.contains("--overwrite") && t.contains("--resume"), "{t}");
    // The same command line with --resume auto continues (repeating settings is fine).
    let out = ok(&auto);
    assert!(out.contains("(step 2)"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    assert_eq!(steps_logged(&run), (1..=8).collect::<Vec<_>>());
    let first = numbers(&run);
    // ... but not with a setting that defines the run.
    fails_with(
        &with(auto.clone(), "--seq-len", "16"),
        &[],
        "train.seq_len 32 -> 16",
    );
    fails_with(&with(auto, "--d-model", "64"), &[], "model.d_model");

    // --overwrite discards the run (and only the run's files) and starts again.
    let keep = run.join("notes.txt");
    std::fs::write(&keep, "mine").unwrap();
    let out = ok(&plus(args, &["--overwrite"]));
    assert!(out.contains("overwrite: discarding"), "{out}");
    assert!(!out.contains("resume:"), "{out}");
    assert_eq!(steps_logged(&run), (1..=8).collect::<Vec<_>>());
    assert_eq!(
        numbers(&run),
        first,
        "a fresh start of the same configuration"
    );
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "mine");
}

#[test]
fn resume_from_an_older_checkpoint_with_a_lower_learning_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = with(tiny_args(&run, &cache, &corpus), "--keep-checkpoints", "10");
    ok(&with(args, "--stop-at", "6"));
    let out = ok(&plus(
        resume_args(&run),
        &["--from-checkpoint", "step-00000002", "--lr", "0.005"],
    ));
    assert!(out.contains("(step 2)"), "{out}");
    assert!(out.contains("2 later checkpoint(s) moved to"), "{out}");
    assert!(out.contains("train.lr changes from 0.01 to 0.005"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    // Recorded: the change log and the configuration the run now has.
    let changes = std::fs::read_to_string(run.join("changes.jsonl")).unwrap();
    let change: serde_json::Value = serde_json::from_str(changes.lines().next().unwrap()).unwrap();
    assert_eq!(change["step"], 2);
    assert_eq!(change["key"], "train.lr");
    assert_eq!(change["to"], 0.005);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["train"]["lr"], 0.005);
    // Steps 3..6 were redone (logged once each, at the new learning rate), the abandoned
    // checkpoints kept aside.
    let r = rows(&run);
    assert_eq!(steps_logged(&run), (1..=8).collect::<Vec<_>>());
    assert!(r[2]["lr"].as_f64().unwrap() <= 0.005 + 1e-12, "{}", r[2]);
    let aside: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("abandoned-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert!(aside[0].path().join("step-00000006/model.bpk").exists());
    // A name that is no checkpoint is a clear error listing what there is.
    fails_with(
        &plus(resume_args(&run), &["--from-checkpoint", "step-99"]),
        &[],
        "no checkpoint of step 99; it has: step-",
    );
}

#[test]
fn a_damaged_latest_checkpoint_falls_back_to_the_newest_good_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = with(tiny_args(&run, &cache, &corpus), "--keep-checkpoints", "3");
    ok(&with(args.clone(), "--stop-at", "4"));
    // Steps 1..8 straight through, for the comparison.
    let straight = tmp.path().join("straight");
    ok(&tiny_args(&straight, &cache, &corpus));

    let model = run.join("checkpoints/step-00000004/model.bpk");
    let mut bytes = std::fs::read(&model).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&model, &bytes).unwrap();
    let out = ok(&resume_args(&run));
    assert!(
        out.contains("resume: skipped") && out.contains("step-00000004"),
        "names the skipped checkpoint:\n{out}"
    );
    assert!(out.contains("falling back to"), "{out}");
    assert!(out.contains("(step 2)"), "{out}");
    assert!(out.contains("finished at step 8/8"), "{out}");
    // Kept for inspection, not deleted; and the resumed run is the straight one, bit for bit.
    let aside = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("unverified-"))
        .expect("the damaged checkpoint is set aside");
    assert_eq!(
        std::fs::read(aside.path().join("step-00000004/model.bpk")).unwrap(),
        bytes
    );
    assert_eq!(numbers(&run), numbers(&straight));
}

#[test]
fn non_finite_steps_can_be_skipped_up_to_a_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = plus(tiny_args(&run, &cache, &corpus), &["--on-nan", "skip"]);
    let out = relation(&fault(&args, "poison-steps=3"), &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("update skipped (1 of at most 10 skips)"), "{t}");
    assert!(t.contains("finished at step 8/8"), "{t}");
    let r = rows(&run);
    assert_eq!(steps_logged(&run), (1..=8).collect::<Vec<_>>());
    assert!(
        r[2]["loss"].is_null(),
        "the skipped step's loss is NaN: {}",
        r[2]
    );
    // The count survives a resume and is checked against the cap.
    let run2 = tmp.path().join("run2");
    let args2 = plus(
        with(tiny_args(&run2, &cache, &corpus), "--stop-at", "4"),
        &["--on-nan", "skip", "--max-skipped-steps", "2"],
    );
    let out = relation(&fault(&args2, "poison-steps=2,3"), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let t = fails_with(
        &plus(
            resume_args(&run2),
            &[
                "--on-nan",
                "skip",
                "--max-skipped-steps",
                "2",
                "--fault",
                "poison-steps=6",
            ],
        ),
        &[],
        "already skipped 2 steps",
    );
    assert!(t.contains("--from-checkpoint"), "says how to recover:\n{t}");
    // The default stops at the first one, and says how to go on.
    let run3 = tmp.path().join("run3");
    let t = fails_with(
        &fault(&tiny_args(&run3, &cache, &corpus), "poison-steps=3"),
        &[],
        "loss is NaN",
    );
    assert!(t.contains("--on-nan skip"), "{t}");
}

#[test]
fn a_second_writer_is_refused_while_the_first_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = with(tiny_args(&run, &cache, &corpus), "--stop-at", "1");
    ok(&args);
    let long = plus(resume_args(&run), &["--steps", "100000"]);
    let mut first = Command::new(env!("CARGO_BIN_EXE_relation"))
        .args(&long)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until it holds the lock (it writes its pid into the lock file).
    let started = Instant::now();
    let pid = first.id().to_string();
    while !std::fs::read_to_string(run.join("lock")).is_ok_and(|t| t.contains(&pid)) {
        assert!(started.elapsed() < Duration::from_secs(60), "no lock taken");
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = fails_with(&resume_args(&run), &[], "is in use by pid");
    assert!(t.contains(&pid), "names the holder:\n{t}");
    fails_with(
        &plus(args.clone(), &["--overwrite"]),
        &[],
        "is in use by pid",
    );
    first.kill().unwrap(); // SIGKILL: the OS releases the lock with the process
    first.wait().unwrap();
    // Its --steps change was recorded; stop at once, wherever the killed run got to.
    let out = ok(&plus(resume_args(&run), &["--stop-at", "1"]));
    assert!(out.contains("resume:"), "{out}");
}

#[test]
fn changed_data_is_refused_on_resume_and_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let a = tmp.path().join("a");
    ok(&with(tiny_args(&a, &cache, &corpus), "--stop-at", "2"));
    // A run with a given tokenizer: its tokenizer.json does not depend on the data.
    let b = tmp.path().join("b");
    let given = a.join("tokenizer.json");
    ok(&with(
        plus(
            tiny_args(&b, &cache, &corpus),
            &["--tokenizer", given.to_str().unwrap()],
        ),
        "--stop-at",
        "2",
    ));
    let mut text = std::fs::read_to_string(&corpus).unwrap();
    text.push_str("\n\nA paragraph that was not there when the runs started.\n");
    std::fs::write(&corpus, text).unwrap();
    fails_with(&resume_args(&b), &[], "data.json differs");
    fails_with(&resume_args(&a), &[], "tokenizer.json differs");
    fails_with(
        &[
            "eval".into(),
            "--run-dir".into(),
            a.to_str().unwrap().into(),
        ],
        &[],
        "the corpus changed since the run started",
    );
}

/// SIGTERM (a scheduler's time limit or preemption; Ctrl-C is SIGINT, handled alike) mid-run:
/// the run finishes its step, writes a checkpoint of it and exits non-zero saying how to go on;
/// `--resume` then continues with exactly the losses of an uninterrupted run.
#[cfg(unix)]
#[test]
fn sigterm_checkpoints_the_step_reached_and_resume_continues_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let steps = "400";
    let full = tmp.path().join("full");
    ok(&with(tiny_args(&full, &cache, &corpus), "--steps", steps));

    let run = tmp.path().join("run");
    let args = with(tiny_args(&run, &cache, &corpus), "--steps", steps);
    let child = Command::new(env!("CARGO_BIN_EXE_relation"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relation");
    // Signal once a few steps are logged (and well before the last).
    let started = Instant::now();
    while std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count()) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no steps logged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let text = text(&out);
    assert!(
        !out.status.success(),
        "a stopped run exits non-zero:\n{text}"
    );
    assert!(text.contains("stopped by request after step"), "{text}");
    assert!(
        text.contains("--resume --run-dir"),
        "says how to go on:\n{text}"
    );
    let reached = rows(&run).last().unwrap()["step"].as_u64().unwrap();
    assert!(reached < 400, "stopped before the end: {reached}");
    assert_eq!(
        latest(&run),
        format!("step-{reached:08}"),
        "the checkpoint is of the step reached"
    );

    let out = ok(&resume_args(&run));
    assert!(out.contains(&format!("(step {reached})")), "{out}");
    let losses = |run: &Path| -> Vec<(u64, f64)> {
        rows(run)
            .iter()
            .map(|r| (r["step"].as_u64().unwrap(), r["loss"].as_f64().unwrap()))
            .collect()
    };
    assert_eq!(
        losses(&run),
        losses(&full),
        "the same losses as without the stop"
    );
}
