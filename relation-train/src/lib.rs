//! # relation-train
//!
//! The `relation` command line and the library behind it: train Relation language models on
//! real text, evaluate them and sample from them, on any backend compiled in.
//!
//! ```text
//! relation train    [--data PATH..] [--preset cpu|tiny|small|10m|…] [--pattern LLLF] [--device wgpu]
//! relation eval     --run-dir DIR [--data PATH..]
//! relation generate --run-dir DIR --prompt "Call me" [--stop TEXT] [--prompt-file F]
//! relation export   --run-dir DIR --out model.safetensors
//! ```
//!
//! A run directory is the unit of work: `config.json` (every setting), `model.json`,
//! `tokenizer.json`, `checkpoints/` (atomic, verified, resumable to the bit), `metrics.csv` /
//! `metrics.jsonl` and `loss.png`.

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod error;
pub mod evaluate;
pub mod fs;
pub mod metrics;
pub mod optim;
pub mod report;
mod run_dir;
pub mod sample;
pub mod train;

pub use config::{DataSpec, ModelSpec, RunConfig, TrainSpec};
pub use error::{Result, TrainError};
pub use evaluate::{EvalResult, LoadedRun, evaluate, load_run};
pub use train::{TrainOptions, TrainSummary, train};
