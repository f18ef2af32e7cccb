//! The paired difference of each variant to the baseline across training budgets: the table and
//! `budget.png` of `relation report --budget`.

use std::collections::BTreeMap;
use std::path::Path;

use super::{RunCurve, mean_sd, variant_colour, variant_order};
use crate::plot::{Chart, Line, draw, padded_range};

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
pub(super) fn finals_by_seed(runs: &[RunCurve], variant: &str) -> BTreeMap<u64, (f64, u64)> {
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

/// The paper's training budget (tokens) at which the loss fits are read off.
pub const PAPER_TOKENS: f64 = 150e6;

/// The table of every variant's paired difference to `baseline` at every budget (Markdown),
/// followed by each variant's loss fitted against the budget ([`super::fit_section`], read at
/// [`PAPER_TOKENS`]), and `budget.png` in `out`: the differences against the training tokens,
/// with ± one standard error.
///
/// # Errors
/// Plotting or file errors, as text; no paired run at all.
pub fn budget_report(
    budgets: &[Budget],
    baseline: &str,
    out: &Path,
) -> std::result::Result<String, String> {
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

    let all: Vec<&PairedDelta> = series.iter().flat_map(|s| &s.1).collect();
    let tmax = all.iter().map(|d| d.tokens as f64).fold(1.0, f64::max);
    let y = padded_range(
        all.iter()
            .flat_map(|d| [d.mean - d.se.unwrap_or(0.0), d.mean + d.se.unwrap_or(0.0)]),
        0.1,
        1e-3,
        true,
    )
    .unwrap_or(-1.0..1.0);
    let mut chart = Chart::new(
        format!("validation loss minus {baseline}'s, paired by seed (± s.e.; < 0 is better)"),
        0.0..tmax * 1.15,
        y,
    );
    chart.x_desc = "training tokens";
    chart.x_labels = Some(|t| format!("{:.1}M", t / 1e6));
    chart.zero_line = true;
    for (v, points) in &series {
        let mut line = Line::new(
            Some(v.to_string()),
            points.iter().map(|d| (d.tokens as f64, d.mean)).collect(),
            variant_colour(&order, v),
            2,
        );
        line.dots = 4;
        line.bars = points
            .iter()
            .filter_map(|d| Some((d.tokens as f64, d.mean, d.se?)))
            .collect();
        chart.lines.push(line);
    }
    draw(&out.join("budget.png"), (1000, 640), &[chart])?;
    table.push_str(&super::fit_section(budgets, baseline, PAPER_TOKENS));
    Ok(table)
}
