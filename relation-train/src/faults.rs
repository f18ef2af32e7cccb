//! Fault injection for the trainer's own tests (the `testing` feature): failures that are hard to
//! provoke from outside — a NaN loss at a chosen step, an f16 loss scale that overflows at once,
//! a process killed in the middle of a checkpoint write, a data-parallel all-reduce on devices
//! that have no collective — as a typed field of [`TrainOptions`](crate::TrainOptions), set on the
//! command line with `relation train --fault …` in a binary built with the feature. Without it,
//! neither the field nor the flag exists and the trainer runs with [`Faults::NONE`].

#[cfg(feature = "testing")]
use std::str::FromStr;

/// The faults a run injects. The default injects none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Steps whose loss is replaced by NaN (the divergence handling, without a real divergence).
    pub poison_steps: Vec<u64>,
    /// The loss scale a fresh `--precision f16` run starts with instead of
    /// [`INITIAL_SCALE`](crate::precision::INITIAL_SCALE) (e.g. `1e30`: the first step's f16
    /// gradients overflow).
    pub loss_scale: Option<f64>,
    /// A checkpoint save aborts the process after writing the model file.
    pub crash_during_save: bool,
    /// Data parallel over several devices with the collective's arrangement (each replica sums its
    /// own micro-batches) and the all-reduce done by the host: the replicas' sums added in rank
    /// order on the first device, which is what an all-reduce `Sum` of two replicas computes, so
    /// the arrangement is tested on devices where Burn has no collective.
    pub host_all_reduce: bool,
    /// Milliseconds every step waits after its update: a slower run, so that a signal or a kill
    /// lands mid-run however fast the machine is.
    pub step_delay_ms: u64,
    /// `(rank, step)`: that rank of a multi-process run (or the one process, rank 0) panics at
    /// the start of that step.
    pub panic_at: Option<(usize, u64)>,
}

impl Faults {
    /// No fault.
    pub const NONE: Faults = Faults {
        poison_steps: Vec::new(),
        loss_scale: None,
        crash_during_save: false,
        host_all_reduce: false,
        step_delay_ms: 0,
        panic_at: None,
    };

    /// Adds one fault, as the command line's `--fault` gives it.
    #[cfg(feature = "testing")]
    pub fn add(&mut self, fault: Fault) {
        match fault {
            Fault::PoisonSteps(steps) => self.poison_steps.extend(steps),
            Fault::LossScale(scale) => self.loss_scale = Some(scale),
            Fault::CrashDuringSave => self.crash_during_save = true,
            Fault::HostAllReduce => self.host_all_reduce = true,
            Fault::StepDelayMs(ms) => self.step_delay_ms = ms,
            Fault::PanicAt(rank, step) => self.panic_at = Some((rank, step)),
        }
    }
}

/// One fault of [`Faults`], parsed from `poison-steps=3,5`, `loss-scale=1e30`,
/// `crash-during-save`, `host-all-reduce`, `step-delay-ms=20` or `panic-at=RANK:STEP`.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// [`Faults::poison_steps`].
    PoisonSteps(Vec<u64>),
    /// [`Faults::loss_scale`].
    LossScale(f64),
    /// [`Faults::crash_during_save`].
    CrashDuringSave,
    /// [`Faults::host_all_reduce`].
    HostAllReduce,
    /// [`Faults::step_delay_ms`].
    StepDelayMs(u64),
    /// [`Faults::panic_at`].
    PanicAt(usize, u64),
}

#[cfg(feature = "testing")]
impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |what: &str| format!("--fault {s}: {what}");
        match s.split_once('=') {
            Some(("poison-steps", steps)) => steps
                .split(',')
                .map(|v| v.trim().parse::<u64>())
                .collect::<Result<Vec<_>, _>>()
                .map(Fault::PoisonSteps)
                .map_err(|_| bad("expected step numbers separated by commas")),
            Some(("loss-scale", scale)) => match scale.parse::<f64>() {
                Ok(x) if x.is_finite() && x > 0.0 => Ok(Fault::LossScale(x)),
                _ => Err(bad("expected a finite positive loss scale")),
            },
            Some(("step-delay-ms", ms)) => ms
                .parse()
                .map(Fault::StepDelayMs)
                .map_err(|_| bad("expected milliseconds")),
            Some(("panic-at", at)) => at
                .split_once(':')
                .and_then(|(r, s)| Some(Fault::PanicAt(r.parse().ok()?, s.parse().ok()?)))
                .ok_or_else(|| bad("expected RANK:STEP")),
            None if s == "crash-during-save" => Ok(Fault::CrashDuringSave),
            None if s == "host-all-reduce" => Ok(Fault::HostAllReduce),
            _ => Err(bad(
                "expected poison-steps=N[,N…], loss-scale=X, crash-during-save, host-all-reduce, step-delay-ms=N or panic-at=RANK:STEP",
            )),
        }
    }
}
