//! How `relation train` shows a run as it goes: the run's log lines on standard output, and a
//! progress bar on standard error (unless `--no-progress`) that the lines do not tear.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::train::TrainEvent;

/// The display of one `train` invocation: [`TrainEvent`]s in, lines and a bar out.
pub(super) struct Console {
    /// Whether to draw the bar.
    show_bar: bool,
    /// The bar, from the run's first progress event on.
    bar: Option<ProgressBar>,
}

impl Console {
    /// A display with a progress bar, or (`show_bar` false) log lines only.
    pub(super) fn new(show_bar: bool) -> Self {
        Self {
            show_bar,
            bar: None,
        }
    }

    /// Shows one event: a log line printed above the bar, the bar moved on.
    pub(super) fn show(&mut self, event: TrainEvent<'_>) {
        match event {
            TrainEvent::Log(line) => match &self.bar {
                Some(bar) => bar.suspend(|| println!("{line}")),
                None => println!("{line}"),
            },
            TrainEvent::Progress {
                step,
                steps,
                status,
            } => {
                let show_bar = self.show_bar;
                let bar = self.bar.get_or_insert_with(|| new_bar(steps, show_bar));
                if !status.is_empty() {
                    bar.set_message(status.to_string());
                }
                bar.set_position(step);
            }
        }
    }

    /// Ends the display: the bar cleared after a run that ended normally, left where it
    /// stopped after an error.
    pub(super) fn close(&mut self, ok: bool) {
        if let Some(bar) = self.bar.take() {
            if ok {
                bar.finish_and_clear();
            } else {
                bar.abandon();
            }
        }
    }
}

/// The bar over a run's `steps` (hidden unless `show`).
fn new_bar(steps: u64, show: bool) -> ProgressBar {
    let bar = if show {
        ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} steps [{elapsed_precise} < {eta_precise}] {msg}",
        )
        .expect("valid template"),
    );
    bar
}
