//! `relation report`: the results table and plots of a set of runs (issue 11's comparison).
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

use crate::error::io;
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
    Ok(run)
}

/// Mean and sample standard deviation (0 for one value).
fn mean_sd(xs: &[f64]) -> (f64, f64) {
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
fn variant_order<'a>(runs: impl IntoIterator<Item = &'a RunCurve>) -> Vec<&'a str> {
    let mut variants: Vec<&str> = Vec::new();
    for r in runs {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    variants
}

/// The colour of variant `v` by its place in `order` ([`variant_order`]).
fn variant_colour(order: &[&str], v: &str) -> plotters::style::RGBAColor {
    use plotters::style::{Color, Palette, Palette99};
    Palette99::pick(order.iter().position(|x| *x == v).unwrap_or(0)).to_rgba()
}

/// Writes `val.png` (every run's validation curve, one colour per variant) and `gap.png` (each
/// variant's mean curve minus the baseline's) into `out`.
///
/// # Errors
/// Plotting or file errors, as text.
pub fn plots(runs: &[RunCurve], baseline: &str, out: &Path) -> std::result::Result<(), String> {
    use plotters::prelude::*;
    crate::metrics::register_font();
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let variants = variant_order(runs);
    let colour = |v: &str| variant_colour(&variants, v);
    let max_step = runs.iter().map(|r| r.last_step).max().unwrap_or(1).max(2) as f64;

    // Validation curves.
    let ys: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.val.iter().map(|p| p.1))
        .collect();
    let (lo, hi) = ys
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &y| {
            (a.min(y), b.max(y))
        });
    if !lo.is_finite() {
        return Err("no validation points".into());
    }
    let path = out.join("val.png");
    let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption("validation loss (nats / token)", ("sans-serif", 22))
        .x_label_area_size(40)
        .y_label_area_size(60)
        // 4 % of the range below the lowest curve and above the highest, so neither touches the
        // frame.
        .build_cartesian_2d(0.0..max_step, {
            let pad = ((hi - lo) * 0.04).max(1e-3);
            (lo - pad)..(hi + pad)
        })
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .draw()
        .map_err(|e| err(&e))?;
    for v in &variants {
        let mut first = true;
        for r in runs.iter().filter(|r| r.variant == *v) {
            let points: Vec<(f64, f64)> = r.val.iter().map(|&(s, y)| (s as f64, y)).collect();
            let series = chart
                .draw_series(LineSeries::new(points, colour(v).stroke_width(2)))
                .map_err(|e| err(&e))?;
            if first {
                let c = colour(v);
                series
                    .label(v.to_string())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
                first = false;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;

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
    let gaps: Vec<(&str, Vec<(f64, f64)>)> = variants
        .iter()
        .filter(|v| **v != baseline)
        .map(|v| {
            let pts = mean_curve(v)
                .into_iter()
                .filter_map(|(s, y)| base.get(&s).map(|b| (s as f64, y - b)))
                .collect();
            (*v, pts)
        })
        .collect();
    let gy: Vec<f64> = gaps.iter().flat_map(|g| g.1.iter().map(|p| p.1)).collect();
    let (glo, ghi) = gy
        .iter()
        .fold((0.0f64, 0.0f64), |(a, b), &y| (a.min(y), b.max(y)));
    let pad = ((ghi - glo) * 0.1).max(1e-3);
    let path = out.join("gap.png");
    let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(
            format!("validation loss minus {baseline}'s (mean over seeds; < 0 is better)"),
            ("sans-serif", 22),
        )
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_step, (glo - pad)..(ghi + pad))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(vec![(0.0, 0.0), (max_step, 0.0)], BLACK))
        .map_err(|e| err(&e))?;
    for (v, pts) in gaps {
        let c = colour(v);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(v.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// One budget of a budget comparison: its name (`2m`), its runs and the tokens they trained on.
pub struct Budget {
    /// The name given on the command line.
    pub name: String,
    /// Every run of the budget's folder.
    pub runs: Vec<RunCurve>,
}

/// A variant's difference to the baseline at one budget, paired by seed: `d_s = loss_v,s -
/// loss_baseline,s` over the seeds where both finished.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedDelta {
    /// Training tokens of the budget (steps x tokens per step).
    pub tokens: u64,
    /// `(seed, d_s)` per paired seed.
    pub per_seed: Vec<(u64, f64)>,
    /// Mean of `d_s`.
    pub mean: f64,
    /// Standard error of that mean (`sd / sqrt(n)`; `None` for one seed).
    pub se: Option<f64>,
}

/// Final validation loss of the finished runs of `variant`, by seed.
fn finals_by_seed(runs: &[RunCurve], variant: &str) -> BTreeMap<u64, (f64, u64)> {
    runs.iter()
        .filter(|r| r.variant == variant && r.finished())
        .filter_map(|r| Some((r.seed, (r.val.last()?.1, r.steps * r.tokens_per_step))))
        .collect()
}

/// The paired difference of `variant` to `baseline` in `runs`; `None` without a paired seed.
pub fn paired_delta(runs: &[RunCurve], variant: &str, baseline: &str) -> Option<PairedDelta> {
    let base = finals_by_seed(runs, baseline);
    let per: Vec<(u64, f64, u64)> = finals_by_seed(runs, variant)
        .into_iter()
        .filter_map(|(seed, (loss, tokens))| base.get(&seed).map(|b| (seed, loss - b.0, tokens)))
        .collect();
    if per.is_empty() {
        return None;
    }
    let ds: Vec<f64> = per.iter().map(|p| p.1).collect();
    let (mean, sd) = mean_sd(&ds);
    Some(PairedDelta {
        tokens: per[0].2,
        per_seed: per.iter().map(|p| (p.0, p.1)).collect(),
        mean,
        se: (ds.len() > 1).then(|| sd / (ds.len() as f64).sqrt()),
    })
}

/// The table of every variant's paired difference to `baseline` at every budget (Markdown),
/// and `budget.png` in `out`: the differences against the training tokens, with ± one
/// standard error.
///
/// # Errors
/// Plotting or file errors, as text; no paired run at all.
pub fn budget_report(
    budgets: &[Budget],
    baseline: &str,
    out: &Path,
) -> std::result::Result<String, String> {
    use plotters::prelude::*;
    // Every variant with the baseline counted: the order fixes the colours, as in each budget's
    // own plots.
    let order = variant_order(budgets.iter().flat_map(|b| &b.runs));
    let variants: Vec<&str> = order.iter().copied().filter(|v| *v != baseline).collect();
    let mut table = format!(
        "| variant | budget | tokens | paired seeds | Δ vs {baseline} (mean ± s.e.) | per seed |\n|---|---|---|---|---|---|\n"
    );
    let mut series: Vec<(&str, Vec<PairedDelta>)> = Vec::new();
    for v in &variants {
        let mut points = Vec::new();
        for b in budgets {
            let Some(d) = paired_delta(&b.runs, v, baseline) else {
                continue;
            };
            let per_seed: Vec<String> = d
                .per_seed
                .iter()
                .map(|(s, x)| format!("s{s}: {x:+.4}"))
                .collect();
            table.push_str(&format!(
                "| {v} | {} | {:.2}M | {} | {:+.4} ± {} | {} |\n",
                b.name,
                d.tokens as f64 / 1e6,
                d.per_seed.len(),
                d.mean,
                d.se.map_or("—".to_string(), |se| format!("{se:.4}")),
                per_seed.join(", "),
            ));
            points.push(d);
        }
        if !points.is_empty() {
            series.push((v, points));
        }
    }
    if series.is_empty() {
        return Err(format!(
            "no variant has a seed paired with a finished {baseline} run"
        ));
    }

    crate::metrics::register_font();
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let all: Vec<&PairedDelta> = series.iter().flat_map(|s| &s.1).collect();
    let tmax = all.iter().map(|d| d.tokens as f64).fold(1.0, f64::max);
    let (ylo, yhi) = all.iter().fold((0.0f64, 0.0f64), |(a, b), d| {
        let se = d.se.unwrap_or(0.0);
        (a.min(d.mean - se), b.max(d.mean + se))
    });
    let pad = ((yhi - ylo) * 0.1).max(1e-3);
    let path = out.join("budget.png");
    let root = BitMapBackend::new(&path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .margin(20)
        .caption(
            format!("validation loss minus {baseline}'s, paired by seed (± s.e.; < 0 is better)"),
            ("sans-serif", 22),
        )
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..tmax * 1.15, (ylo - pad)..(yhi + pad))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("training tokens")
        .x_label_formatter(&|t| format!("{:.1}M", t / 1e6))
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(vec![(0.0, 0.0), (tmax * 1.15, 0.0)], BLACK))
        .map_err(|e| err(&e))?;
    for (v, points) in &series {
        let c = variant_colour(&order, v);
        let line: Vec<(f64, f64)> = points.iter().map(|d| (d.tokens as f64, d.mean)).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(v.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
        chart
            .draw_series(line.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(points.iter().filter_map(|d| {
                let se = d.se?;
                let t = d.tokens as f64;
                Some(PathElement::new(
                    vec![(t, d.mean - se), (t, d.mean + se)],
                    c.stroke_width(2),
                ))
            }))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(table)
}

/// One row of `scripts/bench/long-context.sh`'s CSV that ran to the end.
struct LongContextRow {
    pattern: String,
    checkpointed: bool,
    seq_len: f64,
    tokens_per_s: f64,
    peak_gib: f64,
}

/// One panel of the long-context plot: caption, unit, the value of a row.
type Panel = (&'static str, &'static str, fn(&LongContextRow) -> f64);

/// Reads the finished rows of a long-context CSV
/// (`pattern,mode,seq_len,status,s_per_step,tokens_per_s,peak_rss_mib`).
fn read_long_context(csv: &Path) -> Result<Vec<LongContextRow>> {
    let text = fs::read_to_string(csv).map_err(io(csv))?;
    let mut rows = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 7 || f[3] != "ok" {
            continue;
        }
        let num = |s: &str| s.parse::<f64>().ok();
        if let (Some(t), Some(rate), Some(rss)) = (num(f[2]), num(f[5]), num(f[6])) {
            rows.push(LongContextRow {
                pattern: f[0].to_string(),
                checkpointed: f[1] == "checkpointed",
                seq_len: t,
                tokens_per_s: rate,
                peak_gib: rss / 1024.0,
            });
        }
    }
    Ok(rows)
}

/// Writes `long-context.png` into `out`: training tokens/s (left) and peak resident memory
/// (right) against the sequence length (log scale), one colour per pattern, solid with
/// activation checkpointing and dashed without.
///
/// # Errors
/// An unreadable CSV; plotting or file errors.
pub fn long_context_plot(csv: &Path, out: &Path) -> Result<PathBuf> {
    use plotters::prelude::*;
    let rows = read_long_context(csv)?;
    if rows.is_empty() {
        return Err(TrainError::Data(format!(
            "{} has no finished long-context row",
            csv.display()
        )));
    }
    crate::metrics::register_font();
    let path = out.join("long-context.png");
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let mut patterns: Vec<&str> = Vec::new();
        for r in &rows {
            if !patterns.contains(&r.pattern.as_str()) {
                patterns.push(&r.pattern);
            }
        }
        let colour =
            |p: &str| Palette99::pick(patterns.iter().position(|x| *x == p).unwrap_or(0)).to_rgba();
        // The x axis is log2(T), one grid line per power of two, labelled in K tokens.
        let (t_lo, t_hi) = rows.iter().fold((f64::INFINITY, 0.0f64), |(a, b), r| {
            (a.min(r.seq_len.log2()), b.max(r.seq_len.log2()))
        });
        let root = BitMapBackend::new(&path, (1200, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let panels = root.split_evenly((1, 2));
        let series: [Panel; 2] = [
            ("training tokens / s (batch 1)", "tokens / s", |r| {
                r.tokens_per_s
            }),
            ("peak resident memory", "GiB", |r| r.peak_gib),
        ];
        for (panel, (caption, unit, value)) in panels.iter().zip(series) {
            let y_hi = rows.iter().map(value).fold(0.0f64, f64::max) * 1.1;
            let mut chart = ChartBuilder::on(panel)
                .margin(20)
                .caption(caption, ("sans-serif", 22))
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(t_lo - 0.4..t_hi + 0.4, 0.0..y_hi)?;
            chart
                .configure_mesh()
                .x_desc("sequence length T (tokens, log scale)")
                .y_desc(unit)
                .x_labels((t_hi - t_lo) as usize + 2)
                .x_label_formatter(&|x| format!("{}K", (x.exp2() / 1024.0).round()))
                .draw()?;
            for p in &patterns {
                for checkpointed in [true, false] {
                    let mut pts: Vec<(f64, f64)> = rows
                        .iter()
                        .filter(|r| r.pattern == *p && r.checkpointed == checkpointed)
                        .map(|r| (r.seq_len.log2(), value(r)))
                        .collect();
                    if pts.is_empty() {
                        continue;
                    }
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let c = colour(p);
                    let label = format!(
                        "{p}, {}",
                        if checkpointed {
                            "checkpointing"
                        } else {
                            "plain"
                        }
                    );
                    let style = c.stroke_width(2);
                    let drawn = if checkpointed {
                        chart.draw_series(LineSeries::new(pts.clone(), style))?
                    } else {
                        chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))?
                    };
                    drawn.label(label).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                    });
                    chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
                }
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| TrainError::Data(format!("plotting {}: {e}", path.display())))?;
    Ok(path)
}
