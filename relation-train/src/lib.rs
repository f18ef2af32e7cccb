// The crate documentation is the README, so its usage example is compiled and run as a doctest
// (`doctest = true` in Cargo.toml) and cannot drift from the API.
#![doc = include_str!("../README.md")]

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod error;
pub mod evaluate;
#[cfg(feature = "testing")]
pub mod faults;
#[cfg(not(feature = "testing"))]
mod faults;
pub mod fs;
pub mod hf;
pub mod memory;
pub mod metrics;
pub mod optim;
mod plot;
pub mod precision;
pub mod ranks;
pub mod report;
pub mod sample;
pub mod serve;
pub mod train;

pub use config::{DataSpec, ModelSpec, Packing, Reduce, RunConfig, TrainSpec};
pub use error::{Result, TrainError};
pub use evaluate::{
    EvalOptions, EvalResult, LoadedRun, ScoredWindow, evaluate, evaluate_each, load_run,
};
pub use memory::keep_freed_memory;
pub use ranks::{MpiSession, Ranks};
pub use train::{TrainEvent, TrainOptions, TrainSummary, train, train_with};
