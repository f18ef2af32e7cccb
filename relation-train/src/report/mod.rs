//! `relation report`: the results table and plots of a set of runs (`table`, `plots`), the
//! paired differences across budgets (`budget`), and the long-context plot (`long_context`).
//!
//! Runs are directories named `<variant>-s<seed>` under one folder (what
//! `scripts/experiments/small.sh` makes). For each variant: the final validation loss as mean ± sd
//! over the seeds that finished, its difference to the baseline variant with the standard error
//! of that difference, bits per byte, parameters and the median training tokens/s; plus two PNGs,
//! the validation curves of every run (one colour per variant) and the gap of each variant's mean
//! curve to the baseline's.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn::module::Module;
use burn::tensor::Device;
use relation_model::RelationLmConfig;

mod budget;
mod fit;
mod long_context;

pub use budget::{Budget, PAPER_TOKENS, PairedDelta, budget_report, paired_delta};
pub use fit::{PowerLaw, fit_power_law, fit_section};
pub use long_context::long_context_plot;

use crate::error::io;
use crate::plot::{Chart, Line, draw, padded_range, palette};
use crate::{Result, TrainError};

/// One run's logged curve.
#[derive(Debug, Clone)]
pub struct RunCurve {
    /// Variant name (the directory name before `-s<seed>`).
    pub variant: String,
    /// Seed (from the directory name).
    pub seed: u64,
    /// `(step, validation loss)` at every evaluation.
    pub val: Vec<(u64, f64)>,
    /// Validation bits per byte at the last evaluation.
    pub final_bpb: Option<f64>,
    /// Last logged step.
    pub last_step: u64,
    /// Steps the run was configured for.
    pub steps: u64,
    /// Training tokens/s of every step after the first two (warm-up of caches and allocator).
    pub tokens_per_s: Vec<f64>,
    /// Parameters of the model.
    pub params: usize,
    /// Tokens per optimizer step (`train.tokens_per_step` of the run's configuration).
    pub tokens_per_step: u64,
    /// Where the run ran: one line per start or resume, as the experiment runner records them in
    /// `machines.tsv` beside the metrics (when, host, `from step N`, CPU, cores, AVX-512); empty
    /// when the run has no such file.
    pub machines: Vec<String>,
}

impl RunCurve {
    /// Whether the run reached its last step and evaluated there.
    pub fn finished(&self) -> bool {
        self.last_step >= self.steps && self.val.last().is_some_and(|v| v.0 == self.steps)
    }
}

/// Reads every `<variant>-s<seed>` run under `root`.
///
/// # Errors
/// Unreadable directories or metrics; a run whose `metrics.csv` lacks a column.
pub fn read_runs(root: &Path) -> Result<Vec<RunCurve>> {
    let mut runs = Vec::new();
    let entries = fs::read_dir(root).map_err(io(root))?;
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    dirs.sort();
    for dir in dirs {
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((variant, seed)) = name.rsplit_once("-s") else {
            continue;
        };
        let (Ok(seed), true) = (seed.parse::<u64>(), dir.join("metrics.csv").is_file()) else {
            continue;
        };
        runs.push(read_run(&dir, variant, seed)?);
    }
    Ok(runs)
}

fn read_run(dir: &Path, variant: &str, seed: u64) -> Result<RunCurve> {
    let bad = |reason: String| TrainError::RunDir {
        path: dir.to_path_buf(),
        reason,
    };
    let csv_path = dir.join("metrics.csv");
    let csv = fs::read_to_string(&csv_path).map_err(io(&csv_path))?;
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| bad(format!("metrics.csv has no `{name}` column")))
    };
    let (c_step, c_tps, c_val, c_bpb) = (
        col("step")?,
        col("tokens_per_s")?,
        col("val_loss")?,
        col("val_bpb")?,
    );
    let mut run = RunCurve {
        variant: variant.to_string(),
        seed,
        val: Vec::new(),
        final_bpb: None,
        last_step: 0,
        steps: 0,
        tokens_per_s: Vec::new(),
        params: 0,
        tokens_per_step: 0,
        machines: Vec::new(),
    };
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let num = |c: usize| cells.get(c).and_then(|v| v.parse::<f64>().ok());
        let step = num(c_step).ok_or_else(|| bad(format!("bad metrics line `{line}`")))? as u64;
        run.last_step = step;
        if let (Some(tps), true) = (num(c_tps), step > 2) {
            run.tokens_per_s.push(tps);
        }
        if let Some(v) = num(c_val) {
            run.val.push((step, v));
            run.final_bpb = num(c_bpb);
        }
    }
    let config_path = dir.join("config.json");
    let config: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&config_path).map_err(io(&config_path))?)
            .map_err(|e| bad(format!("config.json: {e}")))?;
    run.steps = config["train"]["steps"].as_u64().unwrap_or(run.last_step);
    run.tokens_per_step = config["train"]["tokens_per_step"].as_u64().unwrap_or(0);
    let model = RelationLmConfig::load(dir.join("model.json"))
        .map_err(|e| bad(format!("model.json: {e}")))?;
    run.params = model.init(&Device::default())?.num_params();
    let machines_path = dir.join("machines.tsv");
    if machines_path.is_file() {
        let tsv = fs::read_to_string(&machines_path).map_err(io(&machines_path))?;
        run.machines = tsv
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split('\t').map(str::trim).collect::<Vec<_>>().join(", "))
            .collect();
    }
    Ok(run)
}

/// Mean and sample standard deviation (0 for one value).
pub(crate) fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// The results table (Markdown) of the finished runs, variants in first-seen order, with the
/// difference to `baseline`: paired by seed over the seeds both have ([`paired_delta`]: the
/// mean of the per-seed differences ± its standard error, which leaves out the seed-to-seed
/// spread both variants share), or, without a common seed, the difference of the means ± the
/// unpaired standard error, marked as such.
pub fn table(runs: &[RunCurve], baseline: &str) -> String {
    let finished = || runs.iter().filter(|r| r.finished());
    let order = variant_order(finished());
    let mut by_variant: BTreeMap<&str, Vec<&RunCurve>> = BTreeMap::new();
    for r in finished() {
        by_variant.entry(&r.variant).or_default().push(r);
    }
    let finals = |v: &str| -> Vec<f64> {
        by_variant[v]
            .iter()
            .map(|r| r.val.last().map_or(f64::NAN, |x| x.1))
            .collect()
    };
    let base = by_variant
        .contains_key(baseline)
        .then(|| mean_sd(&finals(baseline)));
    let mut out = format!(
        "| variant | seeds | parameters | validation loss (mean ± sd) | Δ vs {baseline} (± s.e.) | bits/byte | tokens/s (median) |\n|---|---|---|---|---|---|---|\n"
    );
    for v in order {
        let rs = &by_variant[v];
        let (mean, sd) = mean_sd(&finals(v));
        let seeds: Vec<String> = rs.iter().map(|r| r.seed.to_string()).collect();
        let delta = match (base, paired_delta(runs, v, baseline)) {
            (Some(_), Some(d)) if v != baseline => format!(
                "{:+.4} ± {}, {} paired",
                d.mean,
                d.se.map_or("—".to_string(), |se| format!("{se:.4}")),
                d.per_seed.len()
            ),
            (Some((bm, bsd)), None) if v != baseline => {
                let n = rs.len() as f64;
                let nb = by_variant[baseline].len() as f64;
                let se = (sd * sd / n + bsd * bsd / nb).sqrt();
                format!("{:+.4} ± {se:.4}, unpaired", mean - bm)
            }
            _ => "—".into(),
        };
        let bpb = mean_sd(&rs.iter().filter_map(|r| r.final_bpb).collect::<Vec<_>>()).0;
        let tps: Vec<f64> = rs.iter().flat_map(|r| r.tokens_per_s.clone()).collect();
        out.push_str(&format!(
            "| {v} | {} | {:.3}M | {mean:.4} ± {sd:.4} | {delta} | {bpb:.4} | {:.0} |\n",
            seeds.join(", "),
            rs[0].params as f64 / 1e6,
            median(&tps),
        ));
    }
    out
}

/// The variants of `runs` in the order they first appear (runs are read in the sorted order of
/// their folders), the baseline among them. Each variant's colour is its place here, so a
/// variant has the same colour in every plot made from the same runs: the per-budget plots and
/// the budget plot, which leaves the baseline out, agree.
pub(crate) fn variant_order<'a>(runs: impl IntoIterator<Item = &'a RunCurve>) -> Vec<&'a str> {
    let mut variants: Vec<&str> = Vec::new();
    for r in runs {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    variants
}

/// The colour of variant `v` by its place in `order` ([`variant_order`]).
pub(crate) fn variant_colour(order: &[&str], v: &str) -> plotters::style::RGBAColor {
    palette(order.iter().position(|x| *x == v).unwrap_or(0))
}

/// Writes `val.png` (every run's validation curve, one colour per variant) and `gap.png` (each
/// variant's mean curve minus the baseline's) into `out`.
///
/// # Errors
/// Plotting or file errors, as text.
pub fn plots(runs: &[RunCurve], baseline: &str, out: &Path) -> std::result::Result<(), String> {
    let variants = variant_order(runs);
    let colour = |v: &str| variant_colour(&variants, v);
    let max_step = runs.iter().map(|r| r.last_step).max().unwrap_or(1).max(2) as f64;

    // Validation curves, 4 % of the range below the lowest and above the highest, so neither
    // touches the frame.
    let y = padded_range(
        runs.iter().flat_map(|r| r.val.iter().map(|p| p.1)),
        0.04,
        1e-3,
        false,
    )
    .ok_or("no validation points")?;
    let mut val = Chart::new("validation loss (nats / token)", 0.0..max_step, y);
    for v in &variants {
        for (i, r) in runs.iter().filter(|r| r.variant == *v).enumerate() {
            let points = r.val.iter().map(|&(s, y)| (s as f64, y)).collect();
            // One legend entry per variant.
            let label = (i == 0).then(|| v.to_string());
            val.lines.push(Line::new(label, points, colour(v), 2));
        }
    }
    draw(&out.join("val.png"), (1000, 640), &[val])?;

    // Gap of each variant's mean curve to the baseline's, at the steps both evaluated.
    let mean_curve = |v: &str| -> BTreeMap<u64, f64> {
        let mut sums: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
        for r in runs.iter().filter(|r| r.variant == v) {
            for &(s, y) in &r.val {
                let e = sums.entry(s).or_insert((0.0, 0));
                e.0 += y;
                e.1 += 1;
            }
        }
        sums.into_iter()
            .map(|(s, (t, n))| (s, t / n as f64))
            .collect()
    };
    let base = mean_curve(baseline);
    let gaps: Vec<Line> = variants
        .iter()
        .filter(|v| **v != baseline)
        .map(|v| {
            let pts = mean_curve(v)
                .into_iter()
                .filter_map(|(s, y)| base.get(&s).map(|b| (s as f64, y - b)))
                .collect();
            Line::new(Some(v.to_string()), pts, colour(v), 2)
        })
        .collect();
    let y = padded_range(
        gaps.iter().flat_map(|g| g.points.iter().map(|p| p.1)),
        0.1,
        1e-3,
        true,
    )
    .unwrap_or(-1.0..1.0);
    let mut gap = Chart::new(
        format!("validation loss minus {baseline}'s (mean over seeds; < 0 is better)"),
        0.0..max_step,
        y,
    );
    gap.zero_line = true;
    gap.lines = gaps;
    draw(&out.join("gap.png"), (1000, 640), &[gap])
}

/// The per-seed view of the finished runs (Markdown), variants in first-seen order with the
/// baseline first: the final validation loss of every run by seed, with each variant minus the
/// baseline on the same seed; then the mean validation loss of every variant at each evaluated
/// step (`steps`, or every step some run evaluated), over the seeds that evaluated it.
pub fn seed_tables(runs: &[RunCurve], baseline: &str, steps: Option<&[u64]>) -> String {
    let finished: Vec<&RunCurve> = runs.iter().filter(|r| r.finished()).collect();
    let mut variants = variant_order(finished.iter().copied());
    if let Some(i) = variants.iter().position(|v| *v == baseline) {
        let b = variants.remove(i);
        variants.insert(0, b);
    }
    let others: Vec<&str> = variants
        .iter()
        .copied()
        .filter(|v| *v != baseline)
        .collect();
    let last = |v: &str, seed: u64| {
        finished
            .iter()
            .find(|r| r.variant == v && r.seed == seed)
            .and_then(|r| r.val.last().map(|p| p.1))
    };
    let mut seeds: Vec<u64> = finished.iter().map(|r| r.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let mut head: Vec<String> = vec!["seed".into()];
    head.extend(variants.iter().map(|v| v.to_string()));
    head.extend(others.iter().map(|v| format!("{v} − {baseline}")));
    let mut out = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    let num = |x: Option<f64>, sign: bool| match x {
        Some(x) if sign => format!("{x:+.4}").replace('-', "−"),
        Some(x) => format!("{x:.4}"),
        None => "—".into(),
    };
    for &s in &seeds {
        let mut cells = vec![s.to_string()];
        cells.extend(variants.iter().map(|v| num(last(v, s), false)));
        let base = last(baseline, s);
        cells.extend(
            others
                .iter()
                .map(|v| num(last(v, s).zip(base).map(|(x, b)| x - b), true)),
        );
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    let steps: Vec<u64> = match steps {
        Some(steps) => steps.to_vec(),
        None => {
            let mut all: Vec<u64> = finished
                .iter()
                .flat_map(|r| r.val.iter().map(|p| p.0))
                .collect();
            all.sort_unstable();
            all.dedup();
            all
        }
    };
    let cols: Vec<String> = steps.iter().map(u64::to_string).collect();
    out.push_str(&format!(
        "\n| step | {} |\n|{}\n",
        cols.join(" | "),
        "---|".repeat(steps.len() + 1)
    ));
    for v in &variants {
        let rs: Vec<&&RunCurve> = finished.iter().filter(|r| r.variant == *v).collect();
        let cells: Vec<String> = steps
            .iter()
            .map(|st| {
                let xs: Vec<f64> = rs
                    .iter()
                    .filter_map(|r| r.val.iter().find(|p| p.0 == *st).map(|p| p.1))
                    .collect();
                if xs.is_empty() {
                    "—".into()
                } else {
                    format!("{:.3}", xs.iter().sum::<f64>() / xs.len() as f64)
                }
            })
            .collect();
        let n = rs.len();
        let plural = if n > 1 { "s" } else { "" };
        out.push_str(&format!(
            "| {v} ({n} seed{plural}) | {} |\n",
            cells.join(" | ")
        ));
    }
    out.push_str(&machines_table(&finished));
    out
}

/// Where each finished run ran, one row per run: its starts and resumes as the runner recorded
/// them (`machines.tsv`), or "not recorded".
fn machines_table(runs: &[&RunCurve]) -> String {
    let mut out = String::from("\n| run | where it ran (each start or resume) |\n|---|---|\n");
    for r in runs {
        let at = if r.machines.is_empty() {
            "not recorded".to_string()
        } else {
            r.machines.join("; ")
        };
        out.push_str(&format!("| {}-s{} | {at} |\n", r.variant, r.seed));
    }
    out
}
