//! `long-context.png`: training speed and peak memory against the sequence length, from the CSV
//! of `scripts/bench/long-context.sh`.

use std::fs;
use std::path::{Path, PathBuf};

use plotters::chart::SeriesLabelPosition;

use crate::error::io;
use crate::plot::{Chart, Line, draw, palette};
use crate::{Result, TrainError};

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
    let rows = read_long_context(csv)?;
    if rows.is_empty() {
        return Err(TrainError::Data(format!(
            "{} has no finished long-context row",
            csv.display()
        )));
    }
    let mut patterns: Vec<&str> = Vec::new();
    for r in &rows {
        if !patterns.contains(&r.pattern.as_str()) {
            patterns.push(&r.pattern);
        }
    }
    // The x axis is log2(T), one grid line per power of two, labelled in K tokens.
    let (t_lo, t_hi) = rows.iter().fold((f64::INFINITY, 0.0f64), |(a, b), r| {
        (a.min(r.seq_len.log2()), b.max(r.seq_len.log2()))
    });
    let series: [Panel; 2] = [
        ("training tokens / s (batch 1)", "tokens / s", |r| {
            r.tokens_per_s
        }),
        ("peak resident memory", "GiB", |r| r.peak_gib),
    ];
    let panels: Vec<Chart> = series
        .iter()
        .map(|&(caption, unit, value)| {
            let y_hi = rows.iter().map(value).fold(0.0f64, f64::max) * 1.1;
            let mut chart = Chart::new(caption, t_lo - 0.4..t_hi + 0.4, 0.0..y_hi);
            chart.x_desc = "sequence length T (tokens, log scale)";
            chart.y_desc = Some(unit);
            chart.x_label_count = Some((t_hi - t_lo) as usize + 2);
            chart.x_labels = Some(|x| format!("{}K", (x.exp2() / 1024.0).round()));
            chart.legend = SeriesLabelPosition::UpperLeft;
            for (i, p) in patterns.iter().enumerate() {
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
                    let how = if checkpointed {
                        "checkpointing"
                    } else {
                        "plain"
                    };
                    let mut line = Line::new(Some(format!("{p}, {how}")), pts, palette(i), 2);
                    line.dashed = !checkpointed;
                    line.dots = 3;
                    chart.lines.push(line);
                }
            }
            chart
        })
        .collect();
    let path = out.join("long-context.png");
    draw(&path, (1200, 560), &panels)
        .map_err(|e| TrainError::Data(format!("plotting {}: {e}", path.display())))?;
    Ok(path)
}
