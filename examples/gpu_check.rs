//! `gpu_check`: the GPU check's programs in one binary, for a machine without a Rust toolchain.
//!
//! `scripts/gpu/build.sh` ships the kernel test binary of `relation-kernels` and this one, twice:
//! built as the tests are, and with Burn's `autotune` feature (`gpu_check_autotune`, whose
//! `flash --only-attention` rows are Burn's attention at its best). Each statically links the
//! CubeCL compilers (and, in a CUDA build, LLVM's NVPTX and X86 backends), so one binary for the
//! benchmarks and the trainer instead of several keeps the bundle small.
//!
//! ```text
//! gpu_check flash    [flash_relation_bench flags]     FlashRelation vs materialized vs attention
//! gpu_check linear   [linear_relation_bench flags]    Linear Relation scaling
//! gpu_check decode   [--patterns --contexts --streams] decoding steps of the 3.7M model's widths
//! gpu_check staging  [--params N,N]                   gradient-sized copies device <-> host
//! gpu_check relation [relation flags]                 the trainer (`relation train ...`, etc.)
//! gpu_check summary  --dir OUT --devices vulkan,cuda  check every promised table and log, and
//!                    [--dtypes f32,f16,bf16]          write OUT/summary.md with the paper's anchors
//!                    [--b8-dtype bf16] [--autotune]   (the B 8 tables' dtype; the autotuned rows)
//! ```
//!
//! `summary` exits with status 1 when a table or log the run promised is missing or does not
//! parse, naming each one: `scripts/gpu/run.sh --rehearse` relies on it in CI.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use relation_examples::bench::{decode, flash, linear, staging};
use relation_examples::counting::Counting;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The GPU check's benchmarks, trainer and summary in one binary.
#[derive(Debug, Parser)]
#[command(name = "gpu_check")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// FlashRelation fused vs materialized vs Burn's attention (`flash_relation_bench`).
    Flash(flash::Args),
    /// Linear Relation chunked vs recurrent vs FlashRelation (`linear_relation_bench`).
    Linear(linear::Args),
    /// Decoding steps: one sequence and a ragged batch per pattern and context, and the Linear
    /// Relation layer's own step.
    Decode(decode::Args),
    /// Gradient-sized copies from the device to the host and back (what an MPI rank's
    /// host-staged exchange adds to each step).
    Staging(staging::Args),
    /// The `relation` command line (train, evaluate, generate, ...), unchanged.
    Relation {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Checks the run's tables and logs and writes `summary.md` beside them.
    Summary(SummaryArgs),
}

#[derive(Debug, clap::Args)]
struct SummaryArgs {
    /// The folder `run.sh` wrote (its `$OUT`).
    #[arg(long)]
    dir: PathBuf,
    /// The devices the run measured, as `run.sh` names them in file names.
    #[arg(long, value_delimiter = ',', required = true)]
    devices: Vec<String>,
    /// The dtypes of the FlashRelation tables, for every device.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16")]
    dtypes: Vec<String>,
    /// The dtype of the B 8 tables (`flash_relation_<dtype>_b8_<device>.md`).
    #[arg(long, default_value = "bf16")]
    b8_dtype: String,
    /// The run timed Burn's attention from the `autotune` build too
    /// (`flash_attention_autotune_<dtype>_b8_<device>.md`).
    #[arg(long)]
    autotune: bool,
}

fn main() {
    match Cli::parse().command {
        Command::Flash(args) => flash::run(&args),
        Command::Linear(args) => linear::run(&args),
        Command::Decode(args) => decode::run(&args),
        Command::Staging(args) => staging::run(&args),
        Command::Relation { args } => {
            let cli = <relation_train::cli::Cli as Parser>::parse_from(
                std::iter::once("relation".to_string()).chain(args),
            );
            if let Err(e) = relation_train::cli::run(cli) {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        Command::Summary(args) => {
            let problems = summary(&args);
            if !problems.is_empty() {
                eprintln!("gpu_check summary: {} problem(s):", problems.len());
                for p in &problems {
                    eprintln!("  - {p}");
                }
                std::process::exit(1);
            }
        }
    }
}

/// The paper's systems numbers (RTX 5090, bf16, Triton kernels), printed beside ours.
const ANCHOR_FUSED_VS_MATERIALIZED: &str = "3.6-4.4x faster than materialized at T = 1024";
const ANCHOR_TRAINING_VS_ATTENTION: &str = "0.76-0.85x of FlashAttention's training throughput";

/// One row of a benchmark table: `| T | method | fwd ms | train ms | ... |`.
struct Row {
    seq: usize,
    method: String,
    forward_ms: f64,
    train_ms: f64,
    /// The FlashRelation tables' `fwd TFLOP/s` column (the ninth), where the table has one.
    tflops: Option<f64>,
}

/// The rows of the markdown table in `text` whose first cell is a number and whose timings
/// parse, and the rows whose method failed the benchmark's output check (`T method: why`, not
/// timed); `None` when a row starts like one but does not parse (a broken table).
fn rows(text: &str) -> Option<(Vec<Row>, Vec<String>)> {
    let (mut out, mut failed) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| a | b |" splits into ["", "a", "b", ""].
        if cells.len() < 5 || !cells[1].starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        if let Some(why) = cells[3].strip_prefix("failed: ") {
            failed.push(format!("{} at T {}: {why}", cells[2], cells[1]));
            continue;
        }
        out.push(Row {
            seq: cells[1].parse().ok()?,
            method: cells[2].to_string(),
            forward_ms: cells[3].parse().ok()?,
            train_ms: cells[4].parse().ok()?,
            tflops: cells.get(9).and_then(|c| c.parse().ok()),
        });
    }
    Some((out, failed))
}

/// The rows of table `name` that failed the output check, as problems of the summary.
fn failed_rows(problems: &mut Vec<String>, name: &str, failed: &[String]) {
    for f in failed {
        problems.push(format!("{name}: {f} (output check; not timed)"));
    }
}

/// The row of `method` at the largest `T` of the table at or below `seq` (the paper's anchor is at
/// T = 1024; a rehearsal runs shorter sequences).
fn at_or_below<'a>(rows: &'a [Row], method: &str, seq: usize) -> Option<&'a Row> {
    rows.iter()
        .filter(|r| r.method == method && r.seq <= seq)
        .max_by_key(|r| r.seq)
}

/// Median of the `tokens_per_s` column of a trainer's `metrics.csv`, skipping the first logged
/// step (compilation and autotuning).
fn median_tokens_per_s(csv: &str) -> Option<f64> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next()?.split(',').collect();
    let col = header.iter().position(|h| *h == "tokens_per_s")?;
    let mut values: Vec<f64> = lines
        .filter_map(|l| l.split(',').nth(col)?.parse().ok())
        .collect();
    if values.len() > 1 {
        values.remove(0);
    }
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// The device a kernel test ran on: the last segment of its name (`flash_relation_f16::cuda`)
/// when that is one of the test suite's device modules, else `all devices` (a test that checks
/// every device in one body, or none: `chunk_size_is_validated_on_every_device`).
fn device_of(test: &str) -> &str {
    const DEVICES: [&str; 6] = ["flex", "wgpu", "vulkan", "metal", "cuda", "cube_cpu"];
    match test.rsplit("::").next() {
        Some(last) if DEVICES.contains(&last) => last,
        _ => "all devices",
    }
}

fn read(dir: &Path, name: &str, problems: &mut Vec<String>) -> Option<String> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Some(text),
        Err(e) => {
            problems.push(format!("{name}: {e}"));
            None
        }
    }
}

/// The summary's table of the fused training step against Burn's attention with its default
/// kernels and with the `autotune` build's (`dtype`, B 8), per device and `T`.
fn best_attention(
    dir: &Path,
    (devices, dtype): (&[String], &str),
    md: &mut String,
    problems: &mut Vec<String>,
) {
    let _ = writeln!(
        md,
        "\n## Training step against Burn's attention at its best ({dtype}, B 8)\n"
    );
    *md += "| device | T | fused train ms | attention train ms | autotuned attention train ms | best attention / fused |\n";
    *md += "|---|---|---|---|---|---|\n";
    let mut notes = Vec::new();
    for device in devices {
        let plain = format!("flash_relation_{dtype}_b8_{device}.md");
        let tuned_name = format!("flash_attention_autotune_{dtype}_b8_{device}.md");
        let (Some(plain_text), Some(tuned_text)) = (
            read(dir, &plain, problems),
            read(dir, &tuned_name, problems),
        ) else {
            continue;
        };
        if plain_text.contains("not supported by this device") {
            let _ = writeln!(md, "| {device} | - | not supported | | | |");
            continue;
        }
        let (Some((plain_rows, _)), Some((tuned_rows, failed))) =
            (rows(&plain_text), rows(&tuned_text))
        else {
            problems.push(format!(
                "{plain} or {tuned_name}: a table row does not parse"
            ));
            continue;
        };
        failed_rows(problems, &tuned_name, &failed);
        if let Some(line) = tuned_text.lines().find(|l| l.starts_with("Burn built")) {
            notes.push(format!("{device}, second build: {line}"));
        }
        for fused in plain_rows.iter().filter(|r| r.method == "fused") {
            let find = |rows: &[Row]| {
                rows.iter()
                    .find(|r| r.method.starts_with("burn attention") && r.seq == fused.seq)
                    .map(|r| r.train_ms)
            };
            let (default, tuned) = (find(&plain_rows), find(&tuned_rows));
            let best = match (default, tuned) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let cell = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.3}"));
            let _ = writeln!(
                md,
                "| {device} | {} | {:.3} | {} | {} | {} |",
                fused.seq,
                fused.train_ms,
                cell(default),
                cell(tuned),
                best.map_or("-".into(), |b| format!("{:.2}x", b / fused.train_ms)),
            );
            if tuned.is_none() {
                problems.push(format!("{tuned_name}: no attention row at T {}", fused.seq));
            }
        }
    }
    for note in notes {
        let _ = writeln!(md, "\n{note}");
    }
}

/// Writes `summary.md` and returns what is missing or broken.
fn summary(args: &SummaryArgs) -> Vec<String> {
    let dir = &args.dir;
    let mut problems = Vec::new();
    let mut md = String::from("# GPU check summary\n\n");
    if let Ok(gpu) = std::fs::read_to_string(dir.join("gpu.txt")) {
        let _ = writeln!(md, "GPU: {}\n", gpu.lines().nth(1).unwrap_or("?").trim());
    }

    // 1. Kernel tests: libtest's verdict, and the tests that ran per device (the module suffix).
    md += "## Kernel tests\n\n";
    if let Some(log) = read(dir, "kernel-tests.log", &mut problems) {
        let verdict = log.lines().find(|l| l.starts_with("test result:"));
        match verdict {
            Some(v) if v.starts_with("test result: ok") => {}
            Some(v) => problems.push(format!("kernel-tests.log: {v}")),
            None => problems.push("kernel-tests.log: no `test result:` line".into()),
        }
        md += "| device | passed | failed |\n|---|---|---|\n";
        // `test a::b::cuda ... ok`; a test's own stderr may come between the name and its
        // outcome, which then stands alone on a later line.
        let mut per_device: Vec<(String, usize, usize)> = Vec::new();
        let mut pending: Option<String> = None;
        for line in log.lines() {
            let (device, outcome) = match line
                .strip_prefix("test ")
                .and_then(|l| l.split_once(" ... "))
            {
                Some((name, outcome)) => (device_of(name).to_string(), outcome),
                None => match pending.take() {
                    Some(device) if matches!(line.trim(), "ok" | "FAILED") => (device, line.trim()),
                    other => {
                        pending = other;
                        continue;
                    }
                },
            };
            let passed = outcome.starts_with("ok");
            if !passed && !outcome.starts_with("FAILED") {
                pending = Some(device);
                continue;
            }
            match per_device.iter_mut().find(|(d, ..)| *d == device) {
                Some(entry) if passed => entry.1 += 1,
                Some(entry) => entry.2 += 1,
                None => per_device.push((device, usize::from(passed), usize::from(!passed))),
            }
        }
        for (device, ok, failed) in &per_device {
            let _ = writeln!(md, "| {device} | {ok} | {failed} |");
        }
        let _ = writeln!(md, "\n{}\n", verdict.unwrap_or("(no verdict)"));
    }

    // 2. FlashRelation: fused vs materialized and vs Burn's attention, per device and dtype.
    md += "## FlashRelation (largest T <= 1024 measured; B 8: also the largest T)\n\n";
    let _ = writeln!(md, "Paper: {ANCHOR_FUSED_VS_MATERIALIZED}.\n");
    md += "| device | dtype | B | T | fused fwd ms | materialized / fused fwd | materialized / fused train | attention / fused train | emulated / fused fwd | fused fwd TFLOP/s | share of matmul |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|\n";
    // The B = 1 tables of every dtype, then bf16 at B = 8 (a batch that fills a large GPU) at
    // T = 1024 and at the table's largest T.
    let tables = args
        .dtypes
        .iter()
        .map(|d| (d.as_str(), 1usize, 1024usize))
        .chain([
            (args.b8_dtype.as_str(), 8, 1024),
            (args.b8_dtype.as_str(), 8, usize::MAX),
        ]);
    for device in &args.devices {
        for (dtype, batch, at_seq) in tables.clone() {
            let name = if batch == 1 {
                format!("flash_relation_{dtype}_{device}.md")
            } else {
                format!("flash_relation_{dtype}_b{batch}_{device}.md")
            };
            let Some(text) = read(dir, &name, &mut problems) else {
                continue;
            };
            if text.contains("not supported by this device") {
                if at_seq == usize::MAX {
                    continue; // said once, at T = 1024
                }
                let _ = writeln!(
                    md,
                    "| {device} | {dtype} | {batch} | - | not supported | | | | | | |"
                );
                continue;
            }
            let Some((rows, failed)) = rows(&text) else {
                problems.push(format!("{name}: a table row does not parse"));
                continue;
            };
            failed_rows(&mut problems, &name, &failed);
            let Some(fused) = at_or_below(&rows, "fused", at_seq) else {
                problems.push(format!("{name}: no `fused` row at T <= {at_seq}"));
                continue;
            };
            let ratio = |method: &str, train: bool| {
                rows.iter()
                    .find(|r| r.method == method && r.seq == fused.seq)
                    .map_or("-".to_string(), |r| {
                        let (a, b) = if train {
                            (r.train_ms, fused.train_ms)
                        } else {
                            (r.forward_ms, fused.forward_ms)
                        };
                        format!("{:.2}x", a / b)
                    })
            };
            let matmul = rows
                .iter()
                .find(|r| r.method.starts_with("matmul") && r.seq == fused.seq);
            // Both rows count the same FLOPs, so the share is the ratio of the times.
            let share = matmul.map_or("-".into(), |m| {
                format!("{:.0} %", 100.0 * m.forward_ms / fused.forward_ms)
            });
            let _ = writeln!(
                md,
                "| {device} | {dtype} | {batch} | {} | {:.3} | {} | {} | {} | {} | {} | {share} |",
                fused.seq,
                fused.forward_ms,
                ratio("materialized", false),
                ratio("materialized", true),
                ratio("burn attention", true),
                ratio("fused, emulated tiles", false),
                fused.tflops.map_or("-".into(), |t| format!("{t:.3}")),
            );
        }
    }

    // 2c. The training step against Burn's attention at its best: its default kernels (the B 8
    //     table) or the autotuned build's, whichever is faster at each T.
    if args.autotune {
        best_attention(dir, (&args.devices, &args.b8_dtype), &mut md, &mut problems);
    }

    // 3. Linear Relation: the table parses and names its crossover.
    md += "\n## Linear Relation\n\n";
    for device in &args.devices {
        let name = format!("linear_relation_{device}.md");
        let Some(text) = read(dir, &name, &mut problems) else {
            continue;
        };
        let parsed = rows(&text);
        if let Some((_, failed)) = &parsed {
            failed_rows(&mut problems, &name, failed);
        }
        match parsed {
            Some((rows, _)) if !rows.is_empty() => {
                let largest = rows.iter().map(|r| r.seq).max().unwrap_or(0);
                let crossover = text
                    .lines()
                    .find(|l| l.starts_with("largest T run"))
                    .unwrap_or("(no crossover line)");
                let _ = writeln!(
                    md,
                    "- {device}: {} rows up to T = {largest}; {crossover}",
                    rows.len()
                );
            }
            _ => problems.push(format!("{name}: no table rows")),
        }
    }

    // 4. Decoding: the table parses; the Linear Relation layer's step time.
    md += "\n## Decoding (3.7M widths)\n\n";
    for device in &args.devices {
        let name = format!("decode_{device}.md");
        let Some(text) = read(dir, &name, &mut problems) else {
            continue;
        };
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| pattern"))
            .collect();
        if let Some(failed) = rows.iter().find(|l| l.contains("failed")) {
            problems.push(format!("{name}: {failed}"));
        }
        let layer = text.lines().find(|l| l.starts_with("L layer step"));
        match (rows.is_empty(), layer) {
            (false, Some(layer)) => {
                let _ = writeln!(md, "- {device}: {} rows; {layer}", rows.len());
                for row in rows.iter().filter(|r| r.starts_with("| LLLF |")) {
                    let _ = writeln!(md, "  {row}");
                }
            }
            _ => problems.push(format!("{name}: no table rows or no `L layer step` line")),
        }
    }

    // 4b. Host staging of gradients (the MPI exchange's copies).
    md += "\n## Gradient staging, device to host and back\n\n";
    md +=
        "What a multi-process run's host-staged exchange adds per step (`docs/bench/mpi.md`).\n\n";
    for device in &args.devices {
        let name = format!("staging_{device}.md");
        let Some(text) = read(dir, &name, &mut problems) else {
            continue;
        };
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| values"))
            .collect();
        if rows.is_empty() {
            problems.push(format!("{name}: no table rows"));
        }
        for row in rows {
            let _ = writeln!(md, "- {device}: {row}");
        }
    }

    // 5. The trainer: Relation vs attention tokens/s on the same device and shape.
    md += "\n## Training, Relation vs MHA (same backbone)\n\n";
    let _ = writeln!(md, "Paper: {ANCHOR_TRAINING_VS_ATTENTION}.\n");
    md += "| device | Relation tokens/s | MHA tokens/s | Relation / MHA |\n|---|---|---|---|\n";
    for device in &args.devices {
        let mut rates = [None, None];
        for (i, model) in ["relation", "mha"].iter().enumerate() {
            let name = format!("metrics-{device}-{model}.csv");
            if let Some(csv) = read(dir, &name, &mut problems) {
                rates[i] = median_tokens_per_s(&csv);
                if rates[i].is_none() {
                    problems.push(format!("{name}: no tokens_per_s values"));
                }
            }
        }
        if let [Some(relation), Some(mha)] = rates {
            let _ = writeln!(
                md,
                "| {device} | {relation:.0} | {mha:.0} | {:.2}x |",
                relation / mha
            );
        }
    }

    if !problems.is_empty() {
        md += "\n## Problems\n\n";
        for p in &problems {
            let _ = writeln!(md, "- {p}");
        }
    }
    if let Err(e) = std::fs::write(dir.join("summary.md"), &md) {
        problems.push(format!("summary.md: {e}"));
    }
    print!("{md}");
    problems
}
