//! What a run reports while it trains: the lines of its log and where it is. The library
//! prints nothing; [`train_with`](super::train_with)'s caller shows the events (the `relation`
//! command prints the lines and draws a progress bar), and [`train`](super::train) passes them
//! on to `tracing`.

/// Something a run reports while it trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrainEvent<'a> {
    /// A line of the run's log, for a person to read: what setup and resume decided (data
    /// tokenized or reused, a run discarded, the checkpoint resumed from, a setting changed),
    /// the run's description, each step's line at the log cadence, validation results,
    /// skipped steps, a loss curve that could not be drawn.
    Log(&'a str),
    /// Where the run is, for a progress display: at `step` of its `steps`. Sent before this
    /// invocation's first step (with an empty `status`) and after every step, with a short
    /// status of that step (loss, learning rate, throughput).
    Progress {
        /// Optimizer steps done.
        step: u64,
        /// Optimizer steps of the whole run.
        steps: u64,
        /// The last step's loss, learning rate and throughput; empty before the first.
        status: &'a str,
    },
}

/// [`train`](super::train)'s handling of the events: each log line as a `tracing` event at
/// `info` level, the progress at `trace` level.
pub(super) fn trace_event(event: TrainEvent<'_>) {
    match event {
        TrainEvent::Log(line) => tracing::info!("{line}"),
        TrainEvent::Progress {
            step,
            steps,
            status,
        } => tracing::trace!(step, steps, status, "progress"),
    }
}
