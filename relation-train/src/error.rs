//! Typed errors of the command-line tools: each names the value at fault and the rule it broke.

use std::path::PathBuf;

use relation_model::ModelError;
use thiserror::Error;

/// Why a command refused to start or stopped.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A setting out of range.
    #[error("invalid `{name}` = {value}: {rule}")]
    Invalid {
        /// The setting (config key or flag).
        name: &'static str,
        /// Its value, as given.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
    /// Started as one of several processes by an MPI launcher (`mpirun -np N`) in a build
    /// without the `mpi` feature, which cannot train them together: each would train the whole
    /// run alone into the same run directory.
    #[error(
        "started as one of {size} processes by an MPI launcher ({variable}={size}), but this build has no MPI (the `mpi` cargo feature) and trains in one process only: each process would train the whole run alone into the same run directory. Rebuild with `--features mpi` to train data-parallel over MPI ranks, run one process (without mpirun), or spread the micro-batches over the devices of one process with --devices"
    )]
    MultiProcess {
        /// The launcher's variable that gave the world size.
        variable: &'static str,
        /// The world size.
        size: usize,
    },
    /// MPI failed, or the ranks of a run disagree.
    #[error("MPI: {reason}")]
    Mpi {
        /// What went wrong.
        reason: String,
    },
    /// A device that is not compiled into this build or does not exist.
    #[error("device `{name}`: {reason}")]
    Device {
        /// The name given to `--device`.
        name: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// `--reduce collective` over devices Burn's collective engine cannot all-reduce over.
    #[error(
        "--reduce collective over {devices}: {reason}; --reduce ordered (or auto) sums the gradients on the first device instead"
    )]
    Collective {
        /// The devices, as given (`flex + flex`).
        devices: String,
        /// Why Burn's all-reduce cannot run over them.
        reason: NoCollective,
    },
    /// A configuration file that cannot be read or parsed.
    #[error("config {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// Parser message.
        reason: String,
    },
    /// Unusable training or evaluation data.
    #[error("data: {0}")]
    Data(String),
    /// The tokenizer could not be trained, loaded or applied.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A run directory that cannot be used as asked.
    #[error("run directory {path}: {reason}")]
    RunDir {
        /// The run directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint that is missing, corrupt, or made for another model or tokenizer.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A stop was requested ([`TrainOptions::stop`](crate::TrainOptions::stop): SIGTERM or
    /// SIGINT on the command line): the run finished the optimizer step it was in and wrote a
    /// checkpoint of it.
    #[error(
        "stopped by request after step {step}; its checkpoint is {checkpoint}. To go on: `relation train --resume --run-dir {run_dir}`"
    )]
    Stopped {
        /// The last step done (and checkpointed).
        step: u64,
        /// The checkpoint written.
        checkpoint: String,
        /// The run directory.
        run_dir: String,
    },
    /// The loss or gradient norm became NaN or infinite.
    #[error(
        "training stopped at step {step}: {what} is {value} (not finite); nothing was saved from this step; the last good checkpoint is {last_good}. To go on: `relation train --resume --run-dir DIR` with `--on-nan skip` (skip such steps), or with `--from-checkpoint step-N --lr LOWER` (an earlier checkpoint and a lower learning rate)"
    )]
    NonFinite {
        /// The optimizer step that produced it.
        step: u64,
        /// `loss` or `gradient norm`.
        what: &'static str,
        /// The value.
        value: f64,
        /// Path of the last good checkpoint, or `none (no checkpoint written yet)`.
        last_good: String,
    },
    /// Too many steps skipped for non-finite values (`--on-nan skip`): the model has likely
    /// diverged, which skipping cannot repair.
    #[error(
        "training stopped at step {step}: its loss or gradient is not finite and the run has already skipped {limit} steps (--max-skipped-steps); the model has likely diverged. The last good checkpoint is {last_good}; resume from an earlier one with a lower learning rate: `relation train --resume --run-dir DIR --from-checkpoint step-N --lr LOWER`"
    )]
    SkipLimit {
        /// The optimizer step that would have been skipped.
        step: u64,
        /// The cap.
        limit: u64,
        /// Path of the last good checkpoint, or `none (no checkpoint written yet)`.
        last_good: String,
    },
    /// A file-system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The model refused its configuration or inputs.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A Hugging Face folder that cannot be written or read back
    /// ([`crate::hf`]: `relation export --format hf`, `relation import`).
    #[error(transparent)]
    Hf(#[from] crate::hf::HfError),
}

impl From<relation_kernels::device::DeviceError> for TrainError {
    /// The shared device parser's error, as this crate's [`TrainError::Device`] (same message).
    fn from(e: relation_kernels::device::DeviceError) -> Self {
        Self::Device {
            name: e.name,
            reason: e.reason,
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = core::result::Result<T, TrainError>;

/// Attaches a path to an I/O error.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.into();
    move |source| TrainError::Io { path, source }
}

/// Why Burn 0.22's collective engine cannot all-reduce over a set of devices.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NoCollective {
    /// Devices of different backends (or different CubeCL runtimes): a collective runs over
    /// the devices of one.
    #[error(
        "`{first}` and `{other}` are different backends, and a Burn collective runs over the devices of one backend"
    )]
    MixedBackends {
        /// The first device.
        first: String,
        /// The first device of another backend.
        other: String,
    },
    /// A backend without collective operations in Burn 0.22.
    #[error("`{device}` is a {backend} device, and Burn 0.22 has no collective operations there")]
    Backend {
        /// The device, as given.
        device: String,
        /// Its backend.
        backend: &'static str,
    },
    /// A CubeCL runtime without a transport between its devices (in CubeCL 0.11 only CUDA has
    /// one, and only where the NCCL library is found).
    #[error(
        "`{device}` runs on CubeCL's {runtime} runtime, which has no transport between its devices (in CubeCL 0.11 only CUDA with NCCL has one)"
    )]
    NoTransport {
        /// The device, as given.
        device: String,
        /// The runtime's name.
        runtime: &'static str,
    },
    /// The same device twice: a collective gives each device one rank.
    #[error("`{device}` is listed twice, and a collective gives each device one rank")]
    Repeated {
        /// The device, as given.
        device: String,
    },
}
