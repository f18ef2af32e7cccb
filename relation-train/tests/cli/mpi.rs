//! Data parallel over MPI ranks (the `mpi` feature), on localhost with `mpirun --oversubscribe`:
//! N ranks train exactly what one process trains, bit for bit; a rank killed mid-run ends the
//! run within a time limit and `--resume` continues exactly; SIGTERM to one rank stops every
//! rank after the same step with a checkpoint of it.
//!
//! Every process runs one Flex thread (`RAYON_NUM_THREADS=1`), as the one-process runs do.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// The longest any `mpirun` here may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(180);

/// One test of this file at a time: each `mpirun` already takes every core.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`SERIAL`] for a test (a test that failed while holding it does not block the rest).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `mpirun -np <ranks> relation <args>` on localhost, one Flex thread per rank.
fn mpirun(ranks: usize, args: &[String]) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &ranks.to_string()])
        .args(["-x", "RAYON_NUM_THREADS=1"])
        .arg(env!("CARGO_BIN_EXE_relation"))
        .args(args)
        // Containers and CI run as root, which Open MPI refuses unless told.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("RAYON_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits for `child` at most [`LIMIT`] (killing it past that, and failing).
fn wait(mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            child.kill().unwrap();
            panic!("mpirun still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Runs `mpirun` and asserts success; returns stdout + stderr.
fn mpi_ok(ranks: usize, args: &[String]) -> String {
    let out = wait(mpirun(ranks, args).spawn().expect("spawn mpirun"));
    let t = text(&out);
    assert!(
        out.status.success(),
        "mpirun -np {ranks} {args:?} failed:\n{t}"
    );
    t
}

/// One process, one Flex thread.
fn one_ok(args: &[String]) -> String {
    relation_ok(args, &[("RAYON_NUM_THREADS", "1")])
}

/// Each logged step's loss and gradient norm, and each validation loss, as logged.
fn curve(run: &Path) -> Vec<(u64, f64, f64, Option<f64>)> {
    rows(run)
        .iter()
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["loss"].as_f64().unwrap(),
                r["grad_norm"].as_f64().unwrap(),
                r["val_loss"].as_f64(),
            )
        })
        .collect()
}

/// The weights of the latest checkpoint, as the bytes of a Hugging Face `model.safetensors`
/// (the checkpoint file itself also holds each process's parameter ids).
fn weights(run: &Path) -> Vec<u8> {
    let out = run.with_extension("hf");
    let args: Vec<String> = [
        "export",
        "--run-dir",
        run.to_str().unwrap(),
        "--format",
        "hf",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--out".to_string(), out.to_str().unwrap().to_string()])
    .collect();
    ok(&args);
    std::fs::read(out.join("model.safetensors")).unwrap()
}

/// With one micro-batch per rank, 2 and 3 ranks give the one-process run's losses, gradient
/// norms, validation losses and final weights bit for bit (the ranks' gradients are added in
/// rank order, the order one process accumulates micro-batches in); the run directory is rank
/// 0's alone, and it reports the share of the step spent exchanging.
#[test]
fn ranks_train_bit_for_bit_what_one_process_trains() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    for ranks in [2usize, 3] {
        // Micro-batches of 4 x 32 tokens: one per rank.
        let per_step = (ranks * 128).to_string();
        let args = |run: &Path| {
            with(
                tiny_args(run, &cache, &corpus),
                "--tokens-per-step",
                &per_step,
            )
        };
        let one = tmp.path().join(format!("one-{ranks}"));
        one_ok(&args(&one));
        let many = tmp.path().join(format!("mpi-{ranks}"));
        let out = mpi_ok(ranks, &args(&many));
        assert!(
            out.contains(&format!("MPI: {ranks} ranks; rank 0 spent")),
            "{out}"
        );
        assert_eq!(
            out.matches("finished at step").count(),
            1,
            "rank 0 alone reports:\n{out}"
        );
        assert_eq!(curve(&many), curve(&one), "{ranks} ranks vs one process");
        assert!(curve(&one).iter().any(|r| r.3.is_some()), "validated");
        assert!(
            weights(&many) == weights(&one),
            "final weights differ, {ranks} ranks"
        );
    }
}

/// More micro-batches than ranks: each rank sums its own first, so the order differs from one
/// process's and the losses agree to rounding, not to the bit; resuming with another number of
/// ranks continues from the same data position.
#[test]
fn ranks_with_several_micro_batches_each_and_a_resume_on_another_count() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let args = |run: &Path| with(tiny_args(run, &cache, &corpus), "--tokens-per-step", "512");
    let one = tmp.path().join("one");
    one_ok(&args(&one));
    let many = tmp.path().join("mpi");
    mpi_ok(2, &with(args(&many), "--stop-at", "4"));
    mpi_ok(3, &resume_args(&many));
    let (a, b) = (curve(&one), curve(&many));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.0, y.0);
        assert!(
            (x.1 - y.1).abs() <= 1e-4 * x.1.abs(),
            "step {}: loss {} vs {}",
            x.0,
            x.1,
            y.1
        );
    }
}

/// Too few micro-batches for the ranks: a typed error naming both counts, before anything is
/// written.
#[test]
fn fewer_micro_batches_than_ranks_is_refused() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = with(tiny_args(&run, &cache, &corpus), "--tokens-per-step", "128");
    let out = wait(mpirun(2, &args).spawn().unwrap());
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("gives 1 micro-batch(es)") && t.contains("2 MPI ranks need at least 2"),
        "{t}"
    );
    assert!(!run.join("checkpoints").exists(), "nothing trained");
}

/// The process of `rank` in the `mpirun` whose command line names `run`.
fn rank_pid(run: &Path, rank: usize) -> u32 {
    let needle = run.to_str().unwrap();
    let start = Instant::now();
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let named = String::from_utf8_lossy(&cmdline).contains(needle);
            let is_rank = environ
                .split(|&b| b == 0)
                .any(|v| v == format!("OMPI_COMM_WORLD_RANK={rank}").as_bytes());
            let is_relation =
                String::from_utf8_lossy(&cmdline).starts_with(env!("CARGO_BIN_EXE_relation"));
            if named && is_rank && is_relation {
                return pid;
            }
        }
        assert!(start.elapsed() < LIMIT, "no rank {rank} process");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a 2-rank run of `steps` and returns it once a few steps are logged.
fn running(args: &[String], run: &Path) -> Child {
    let child = mpirun(2, args).spawn().expect("spawn mpirun");
    let start = Instant::now();
    while std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count()) < 3 {
        assert!(start.elapsed() < LIMIT, "no steps logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `kill -<signal>` of `pid`.
fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// A 2-rank run of 300 tiny steps (slowed, so that the signal lands mid-run) that rank 1 gets
/// `sig` in once a few steps are logged: the launcher's output, the last step logged, the run
/// directory, and a check that `--resume` on 2 ranks reproduces the losses of the same run
/// uninterrupted in one process.
struct Interrupted {
    out: Output,
    reached: u64,
    run: std::path::PathBuf,
    full: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

fn interrupted(sig: &str) -> Interrupted {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let args = |run: &Path| with(tiny_args(run, &cache, &corpus), "--steps", "300");
    let full = tmp.path().join("full");
    one_ok(&args(&full));
    let run = tmp.path().join("run");
    let child = running(&fault(&args(&run), "step-delay-ms=20"), &run);
    signal(rank_pid(&run, 1), sig);
    let out = wait(child);
    assert!(
        !out.status.success(),
        "an interrupted run exits non-zero:\n{}",
        text(&out)
    );
    let reached = rows(&run).last().unwrap()["step"].as_u64().unwrap();
    assert!(reached < 300, "interrupted before the end: {reached}");
    Interrupted {
        out,
        reached,
        run,
        full,
        _tmp: tmp,
    }
}

impl Interrupted {
    /// Resumes on 2 ranks and checks the losses against the uninterrupted run; returns the
    /// resume's output.
    fn resume_matches_the_uninterrupted_run(&self) -> String {
        let out = mpi_ok(2, &resume_args(&self.run));
        let losses = |run: &Path| -> Vec<(u64, f64)> {
            curve(run).into_iter().map(|r| (r.0, r.1)).collect()
        };
        assert_eq!(
            losses(&self.run),
            losses(&self.full),
            "the losses of the uninterrupted run"
        );
        out
    }
}

/// Rank 1 killed (SIGKILL) mid-run: rank 0 does not wait for it for ever — the run ends
/// non-zero within the limit — and `--resume` on 2 ranks continues with the losses of an
/// uninterrupted run.
#[test]
fn a_killed_rank_ends_the_run_and_resume_continues_exactly() {
    let _serial = serial();
    interrupted("KILL").resume_matches_the_uninterrupted_run();
}

/// SIGTERM to rank 1 alone: every rank finishes the step it is in, rank 0 writes a checkpoint of
/// it and says how to go on, the run exits non-zero; `--resume` continues with the losses of an
/// uninterrupted run.
#[test]
fn sigterm_to_one_rank_stops_every_rank_with_a_checkpoint() {
    let _serial = serial();
    let stopped = interrupted("TERM");
    let t = text(&stopped.out);
    assert!(t.contains("stopped by request after step"), "{t}");
    assert!(t.contains("--resume --run-dir"), "says how to go on:\n{t}");
    let reached = stopped.reached;
    assert_eq!(
        latest(&stopped.run),
        format!("step-{reached:08}"),
        "a checkpoint of the step reached"
    );
    let out = stopped.resume_matches_the_uninterrupted_run();
    assert!(out.contains(&format!("(step {reached})")), "{out}");
}

/// A rank that panics mid-run ends every rank (the panic's message, then MPI's abort) within the
/// limit, exiting non-zero; the checkpoints written before it stay good for `--resume`.
#[test]
fn a_panicking_rank_ends_every_rank() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (cache, corpus) = (tmp.path().join("cache"), corpus(tmp.path()));
    let run = tmp.path().join("run");
    let args = fault(&tiny_args(&run, &cache, &corpus), "panic-at=1:5");
    let out = wait(mpirun(2, &args).spawn().unwrap());
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("injected fault: rank 1 panics at step 5"), "{t}");
    assert_eq!(latest(&run), "step-00000004", "the checkpoint before it");
    mpi_ok(2, &resume_args(&run));
    assert_eq!(rows(&run).last().unwrap()["step"].as_u64(), Some(8));
}
