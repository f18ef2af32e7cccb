//! Per-step metrics: kept in memory, written to `metrics.jsonl` and `metrics.csv` in the run
//! directory, and drawn as `loss.png` (train and validation loss against step).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Result;
use crate::error::io;
use crate::fs::write_atomic;

/// One optimizer step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Optimizer step (1-based).
    pub step: u64,
    /// Training tokens consumed so far.
    pub tokens: u64,
    /// Learning rate of this step.
    pub lr: f64,
    /// Mean training loss of the step's tokens (nats per token); NaN on a skipped step
    /// (`--on-nan skip`), written as `null` in JSON.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Global gradient norm before clipping (NaN or infinite on a skipped step).
    #[serde(deserialize_with = "nan_if_null")]
    pub grad_norm: f64,
    /// Training tokens per second of this step (forward, backward, update).
    pub tokens_per_s: f64,
    /// Training time so far, seconds.
    pub elapsed_s: f64,
    /// Validation loss (nats per token), on evaluation steps.
    pub val_loss: Option<f64>,
    /// Validation perplexity `exp(val_loss)`.
    pub val_ppl: Option<f64>,
    /// Validation bits per UTF-8 byte of text.
    pub val_bpb: Option<f64>,
    /// The process's peak resident memory so far, MiB ([`peak_rss_mib`]; `None` where the
    /// system does not report it, and in rows written before the metric existed).
    #[serde(default)]
    pub peak_rss_mib: Option<f64>,
    /// Model FLOP/s of this step, GFLOP/s: tokens/s times the model's FLOPs per training token
    /// (`relation_model::flops`). `None` in rows written before the metric existed.
    #[serde(default)]
    pub model_gflop_per_s: Option<f64>,
}

/// The peak resident set size of this process so far, in MiB: the kernel's high-water mark
/// (`VmHWM` of `/proc/self/status`), which counts every page the process ever held at once —
/// model, optimizer state, activations, allocator caches. `None` off Linux.
pub fn peak_rss_mib() -> Option<f64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// JSON has no NaN: serde_json writes a non-finite number as `null`, read back here as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

const CSV_HEADER: &str = "step,tokens,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_ppl,val_bpb,peak_rss_mib,model_gflop_per_s";

fn csv_line(r: &Row) -> String {
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    format!(
        "{},{},{},{},{},{:.1},{:.3},{},{},{},{},{}",
        r.step,
        r.tokens,
        r.lr,
        r.loss,
        r.grad_norm,
        r.tokens_per_s,
        r.elapsed_s,
        opt(r.val_loss),
        opt(r.val_ppl),
        opt(r.val_bpb),
        r.peak_rss_mib.map_or(String::new(), |v| format!("{v:.1}")),
        r.model_gflop_per_s
            .map_or(String::new(), |v| format!("{v:.2}"))
    )
}

/// The metrics log of a run.
pub struct Metrics {
    dir: PathBuf,
    /// Rows so far.
    pub rows: Vec<Row>,
}

impl Metrics {
    /// A new log, or the existing one of a resumed run cut back to `resume_step` (steps after
    /// the checkpoint are redone, so their rows are dropped and both files are rewritten).
    ///
    /// # Errors
    /// Unreadable or unwritable files.
    pub fn open(dir: &Path, resume_step: Option<u64>) -> Result<Self> {
        let jsonl = dir.join("metrics.jsonl");
        let mut rows = Vec::new();
        if let Some(step) = resume_step
            && jsonl.exists()
        {
            let text = fs::read_to_string(&jsonl).map_err(io(&jsonl))?;
            rows = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Row>(l).ok())
                .filter(|r| r.step <= step)
                .collect();
        }
        let metrics = Self {
            dir: dir.into(),
            rows,
        };
        metrics.rewrite()?;
        Ok(metrics)
    }

    /// A log that is never written: the one of a rank other than 0, which logs nothing.
    pub(crate) fn unwritten() -> Self {
        Self {
            dir: PathBuf::new(),
            rows: Vec::new(),
        }
    }

    fn rewrite(&self) -> Result<()> {
        let mut jsonl = String::new();
        let mut csv = format!("{CSV_HEADER}\n");
        for r in &self.rows {
            jsonl.push_str(&serde_json::to_string(r).expect("row serializes"));
            jsonl.push('\n');
            csv.push_str(&csv_line(r));
            csv.push('\n');
        }
        write_atomic(&self.dir.join("metrics.jsonl"), jsonl.as_bytes())?;
        write_atomic(&self.dir.join("metrics.csv"), csv.as_bytes())
    }

    /// Appends a row to memory and both files.
    ///
    /// # Errors
    /// Unwritable files.
    pub fn push(&mut self, row: Row) -> Result<()> {
        for (name, line) in [
            (
                "metrics.jsonl",
                serde_json::to_string(&row).expect("row serializes"),
            ),
            ("metrics.csv", csv_line(&row)),
        ] {
            let path = self.dir.join(name);
            let mut f = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            writeln!(f, "{line}").map_err(io(&path))?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// Draws `loss.png`: training loss per step and validation loss at evaluation steps.
    /// Returns why it could not, if it could not (the run goes on either way).
    pub fn plot(&self, title: &str) -> std::result::Result<PathBuf, String> {
        let path = self.dir.join("loss.png");
        plot_losses(&self.rows, &path, title).map(|()| path)
    }
}

fn plot_losses(rows: &[Row], path: &Path, title: &str) -> std::result::Result<(), String> {
    use crate::plot::{Chart, Line, draw, padded_range};
    use plotters::style::{BLUE, RED};

    if rows.is_empty() {
        return Err("no steps logged".into());
    }
    let train: Vec<(f64, f64)> = rows
        .iter()
        .filter(|r| r.loss.is_finite())
        .map(|r| (r.step as f64, r.loss))
        .collect();
    let val: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.val_loss.map(|v| (r.step as f64, v)))
        .collect();
    let max_step = rows.last().map_or(1, |r| r.step).max(2) as f64;
    let y = padded_range(train.iter().chain(&val).map(|p| p.1), 0.05, 1e-3, false)
        .ok_or("no finite loss")?;
    let mut chart = Chart::new(title, 1.0..max_step, y);
    chart.y_desc = Some("loss (nats / token)");
    chart
        .lines
        .push(Line::new(Some("train".into()), train, BLUE.into(), 1));
    let mut validation = Line::new(Some("validation".into()), val, RED.into(), 2);
    validation.dots = 4;
    chart.lines.push(validation);
    draw(path, (960, 600), &[chart])
}
