//! The loss against the training budget: `L(D) = E + B · D^(−β)` fitted to each variant's mean
//! final validation loss at every budget, what it predicts at a larger budget, and how loose
//! that is — the section `relation report --budget` appends to `budget.md`.

use std::collections::BTreeMap;

use super::{mean_sd, variant_order};

/// `L(D) = e + b · D^(−beta)`, `D` in tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerLaw {
    /// The loss it tends to with unlimited tokens.
    pub e: f64,
    /// The scale of the reducible part.
    pub b: f64,
    /// The exponent.
    pub beta: f64,
    /// The sum of squared residuals at the fitted points (0 for three points: the curve passes
    /// through each).
    pub sse: f64,
}

impl PowerLaw {
    /// The loss it predicts after `tokens`.
    pub fn at(&self, tokens: f64) -> f64 {
        self.e + self.b * tokens.powf(-self.beta)
    }
}

/// The exponents searched: `beta` in (0, 3], finest near the small values scaling laws have.
fn betas() -> impl Iterator<Item = f64> {
    (1..=3000).map(|i| i as f64 * 1e-3)
}

/// The least-squares `L(D) = E + B D^(−β)` through `points` (`(tokens, loss)`, at least three
/// distinct budgets): for each `β` of a fine grid, `E` and `B` by linear least squares, keeping
/// the `β` with the smallest residual; `B > 0` (the loss falls with tokens) is required. With
/// three points the curve goes through all three. `None` when fewer than three budgets, or when
/// no falling power law fits (a loss that rises, or falls faster than any `β ≤ 3` allows).
pub fn fit_power_law(points: &[(f64, f64)]) -> Option<PowerLaw> {
    let mut budgets: Vec<f64> = points.iter().map(|p| p.0).collect();
    budgets.sort_by(f64::total_cmp);
    budgets.dedup();
    if budgets.len() < 3 || points.iter().any(|p| !(p.0 > 0.0 && p.1.is_finite())) {
        return None;
    }
    let n = points.len() as f64;
    let mut best: Option<PowerLaw> = None;
    for beta in betas() {
        let xs: Vec<f64> = points.iter().map(|p| p.0.powf(-beta)).collect();
        let (mx, my) = (
            xs.iter().sum::<f64>() / n,
            points.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
        let sxy: f64 = xs
            .iter()
            .zip(points)
            .map(|(x, p)| (x - mx) * (p.1 - my))
            .sum();
        if sxx <= 0.0 {
            continue;
        }
        let b = sxy / sxx;
        if b <= 0.0 {
            continue;
        }
        let e = my - b * mx;
        let sse: f64 = xs
            .iter()
            .zip(points)
            .map(|(x, p)| (p.1 - e - b * x).powi(2))
            .sum();
        if best.is_none_or(|f| sse < f.sse) {
            best = Some(PowerLaw { e, b, beta, sse });
        }
    }
    // A best exponent at the grid's end is no fit: the data fall faster than the grid allows.
    best.filter(|f| f.beta < 3.0 - 1e-9)
}

/// One variant's mean final validation loss at each budget, with the standard error of that
/// mean over seeds (`None` for one seed): `(tokens, mean, se)`.
fn means_by_budget(budgets: &[super::Budget], variant: &str) -> Vec<(f64, f64, Option<f64>)> {
    let mut out = Vec::new();
    for b in budgets {
        let finals = super::budget::finals_by_seed(&b.runs, variant);
        if finals.is_empty() {
            continue;
        }
        let losses: Vec<f64> = finals.values().map(|v| v.0).collect();
        let tokens = finals.values().next().expect("one run").1 as f64;
        let (mean, sd) = mean_sd(&losses);
        let se = (losses.len() > 1).then(|| sd / (losses.len() as f64).sqrt());
        out.push((tokens, mean, se));
    }
    out
}

/// The fit section of `budget.md`: per variant, the points, `E`, `B`, `β`, the loss predicted at
/// `predict_tokens`, and the range of that prediction over the fits to every corner of the points
/// moved by ± one standard error (how loose three points are); then each variant's predicted
/// difference to `baseline`.
pub fn fit_section(budgets: &[super::Budget], baseline: &str, predict_tokens: f64) -> String {
    let order = variant_order(budgets.iter().flat_map(|b| &b.runs));
    let at = format!("{:.0}M", predict_tokens / 1e6);
    let mut md = format!(
        "\n## Loss against the budget: `L(D) = E + B·D^(−β)`\n\nEach variant's mean final validation loss over its finished seeds at each budget, fitted by least squares over `β` (then `E`, `B` linear). Three budgets give three points for three parameters: the curve passes through each, so nothing in the fit says how good it is. The range beside each prediction refits every corner of the points moved by ± one standard error of their seed mean (one seed: no range).\n\n| variant | points (tokens: mean loss) | E | B | β | L({at}) | L({at}) range |\n|---|---|---|---|---|---|---|\n"
    );
    let mut predicted: BTreeMap<&str, f64> = BTreeMap::new();
    for v in &order {
        let points = means_by_budget(budgets, v);
        let listed: Vec<String> = points
            .iter()
            .map(|(t, l, _)| format!("{:.1}M: {l:.4}", t / 1e6))
            .collect();
        if points.is_empty() {
            continue; // no finished run at any budget
        }
        let xy: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.1)).collect();
        let Some(fit) = fit_power_law(&xy) else {
            let why = if points.len() < 3 {
                "fewer than three budgets: no fit"
            } else {
                "no falling power law fits these points"
            };
            md.push_str(&format!(
                "| {v} | {} | {why} | | | | |\n",
                listed.join(", ")
            ));
            continue;
        };
        let prediction = fit.at(predict_tokens);
        predicted.insert(v, prediction);
        let range = corner_range(&points, predict_tokens)
            .map_or("—".to_string(), |(lo, hi)| format!("{lo:.4} … {hi:.4}"));
        md.push_str(&format!(
            "| {v} | {} | {:.4} | {:.3e} | {:.3} | {prediction:.4} | {range} |\n",
            listed.join(", "),
            fit.e,
            fit.b,
            fit.beta
        ));
    }
    if let Some(base) = predicted.get(baseline) {
        let leads: Vec<String> = predicted
            .iter()
            .filter(|(v, _)| **v != baseline)
            .map(|(v, l)| format!("`{v}` {:+.4}", l - base))
            .collect();
        if !leads.is_empty() {
            md.push_str(&format!(
                "\nPredicted difference to `{baseline}` at {at} tokens (from the fits above, not paired by seed): {}.\n",
                leads.join(", ")
            ));
        }
    }
    md
}

/// The lowest and highest prediction at `tokens` over the fits to every corner of `points`
/// moved by ± their standard error; `None` when a point has no standard error or no corner fits.
fn corner_range(points: &[(f64, f64, Option<f64>)], tokens: f64) -> Option<(f64, f64)> {
    let ses: Vec<f64> = points.iter().map(|p| p.2).collect::<Option<_>>()?;
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for corner in 0..(1u32 << points.len().min(10)) {
        let moved: Vec<(f64, f64)> = points
            .iter()
            .zip(&ses)
            .enumerate()
            .map(|(i, (p, se))| (p.0, p.1 + if corner >> i & 1 == 1 { *se } else { -*se }))
            .collect();
        if let Some(fit) = fit_power_law(&moved) {
            let l = fit.at(tokens);
            lo = lo.min(l);
            hi = hi.max(l);
        }
    }
    lo.is_finite().then_some((lo, hi))
}
