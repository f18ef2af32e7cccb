//! Line charts as PNG files: the one drawing routine behind every plot the trainer and `relation
//! report` write (`loss.png`, `val.png`, `gap.png`, `budget.png`, `long-context.png`).
//!
//! A plot is one or more [`Chart`] panels side by side, each a set of [`Line`]s on linear axes.
//! Text (captions, axis names, legends) needs a TrueType font: the system's, or `RELATION_FONT`
//! ([`register_font`]); without one the same plot is drawn without text.

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::RGBAColor;

/// One panel: axes, their names and the lines drawn on them.
pub(crate) struct Chart {
    /// The panel's caption.
    pub caption: String,
    /// Name of the x axis.
    pub x_desc: &'static str,
    /// Name of the y axis, if any.
    pub y_desc: Option<&'static str>,
    /// The x range shown.
    pub x: Range<f64>,
    /// The y range shown.
    pub y: Range<f64>,
    /// How x values are written on the axis (`None`: plotters' default).
    pub x_labels: Option<fn(&f64) -> String>,
    /// How many x labels at most (`None`: plotters' default).
    pub x_label_count: Option<usize>,
    /// A black line at `y = 0` (for differences).
    pub zero_line: bool,
    /// Where the legend goes.
    pub legend: SeriesLabelPosition,
    /// The lines, drawn in order.
    pub lines: Vec<Line>,
}

impl Chart {
    /// A panel with plotters' default axis labels, no zero line and the legend at the upper
    /// right.
    pub(crate) fn new(caption: impl Into<String>, x: Range<f64>, y: Range<f64>) -> Self {
        Self {
            caption: caption.into(),
            x_desc: "optimizer step",
            y_desc: None,
            x,
            y,
            x_labels: None,
            x_label_count: None,
            zero_line: false,
            legend: SeriesLabelPosition::UpperRight,
            lines: Vec::new(),
        }
    }
}

/// One line of a [`Chart`].
pub(crate) struct Line {
    /// Its legend entry (`None`: not in the legend).
    pub label: Option<String>,
    /// The points, joined in order.
    pub points: Vec<(f64, f64)>,
    /// Its colour.
    pub colour: RGBAColor,
    /// Stroke width in pixels.
    pub width: u32,
    /// Dashed rather than solid.
    pub dashed: bool,
    /// A filled dot of this radius at every point (0: none).
    pub dots: u32,
    /// A vertical bar `(x, y - e) .. (x, y + e)` per entry `(x, y, e)` (error bars).
    pub bars: Vec<(f64, f64, f64)>,
}

impl Line {
    /// A solid line of width `width`, no dots, no bars.
    pub(crate) fn new(
        label: Option<String>,
        points: Vec<(f64, f64)>,
        colour: RGBAColor,
        width: u32,
    ) -> Self {
        Self {
            label,
            points,
            colour,
            width,
            dashed: false,
            dots: 0,
            bars: Vec::new(),
        }
    }
}

/// `lo..hi` of `values` widened by `fraction` of its span on each side (at least `min_pad`), with
/// 0 inside when `with_zero`; `None` when no value is finite.
pub(crate) fn padded_range(
    values: impl IntoIterator<Item = f64>,
    fraction: f64,
    min_pad: f64,
    with_zero: bool,
) -> Option<Range<f64>> {
    let start = if with_zero {
        (0.0, 0.0)
    } else {
        (f64::INFINITY, f64::NEG_INFINITY)
    };
    let (lo, hi) = values
        .into_iter()
        .filter(|y| y.is_finite())
        .fold(start, |(a, b), y| (a.min(y), b.max(y)));
    if lo > hi {
        return None;
    }
    let pad = ((hi - lo) * fraction).max(min_pad);
    Some(lo - pad..hi + pad)
}

/// The colour of the `i`-th of several series (plotters' 99-colour palette).
pub(crate) fn palette(i: usize) -> RGBAColor {
    Palette99::pick(i).to_rgba()
}

/// Draws `panels` side by side into a PNG of `size` pixels at `path`.
///
/// # Errors
/// Plotting or file errors, as text.
pub(crate) fn draw(path: &Path, size: (u32, u32), panels: &[Chart]) -> Result<(), String> {
    let text = register_font();
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, chart) in areas.iter().zip(panels) {
        draw_panel(area, chart, text).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    c: &Chart,
    text: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = ChartBuilder::on(area);
    builder.margin(20);
    if text {
        builder
            .caption(&c.caption, ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(c.x.clone(), c.y.clone())?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc(c.x_desc);
        if let Some(y) = c.y_desc {
            mesh.y_desc(y);
        }
        if let Some(count) = c.x_label_count {
            mesh.x_labels(count);
        }
        if let Some(format) = &c.x_labels {
            mesh.x_label_formatter(format);
        }
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    if c.zero_line {
        chart.draw_series(LineSeries::new(
            vec![(c.x.start, 0.0), (c.x.end, 0.0)],
            BLACK,
        ))?;
    }
    let mut legend = false;
    for line in &c.lines {
        let style = line.colour.stroke_width(line.width);
        let drawn = if line.dashed {
            chart.draw_series(DashedLineSeries::new(line.points.clone(), 8, 5, style))?
        } else {
            chart.draw_series(LineSeries::new(line.points.clone(), style))?
        };
        if let (true, Some(label)) = (text, &line.label) {
            let colour = line.colour;
            let width = line.width;
            drawn.label(label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
            });
            legend = true;
        }
        if line.dots > 0 {
            let fill = line.colour.filled();
            chart.draw_series(line.points.iter().map(|&p| Circle::new(p, line.dots, fill)))?;
        }
        chart.draw_series(
            line.bars
                .iter()
                .map(|&(x, y, e)| PathElement::new(vec![(x, y - e), (x, y + e)], style)),
        )?;
    }
    if legend {
        chart
            .configure_series_labels()
            .position(c.legend.clone())
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// A TrueType font for the chart's text: `RELATION_FONT`, else common system locations.
fn find_font() -> Option<&'static [u8]> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("RELATION_FONT") {
        candidates.push(p.into());
    }
    for p in [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
        "/System/Library/Fonts/Supplemental/Arial.ttf",
        "/Library/Fonts/Arial.ttf",
        "C:\\Windows\\Fonts\\arial.ttf",
    ] {
        candidates.push(p.into());
    }
    candidates
        .into_iter()
        .find_map(|p| fs::read(p).ok())
        .map(|bytes| &*Box::leak(bytes.into_boxed_slice()))
}

/// Registers a system TrueType font as plotters' "sans-serif" (once per process); whether one was
/// found. Without one, plots are drawn without text.
pub(crate) fn register_font() -> bool {
    use plotters::style::FontStyle;
    use std::sync::OnceLock;
    static FONT: OnceLock<bool> = OnceLock::new();
    *FONT.get_or_init(|| match find_font() {
        Some(bytes) => {
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
        }
        None => false,
    })
}
