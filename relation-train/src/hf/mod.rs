//! Hugging Face transformers folders: a trained model in the layout PyTorch users load with
//! `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`, and such a folder read
//! back into a run directory.
//!
//! ```text
//! DIR/
//!   config.json               model_type "relation", auto_map, every hyper-parameter
//!   model.safetensors         weights in PyTorch's names and layouts ([out, in] linear weights)
//!   tokenizer.json            the run's tokenizer, as trained
//!   tokenizer_config.json     PreTrainedTokenizerFast, eos_token, model_max_length
//!   generation_config.json    eos and bos ids
//!   configuration_relation.py RelationConfig
//!   modeling_relation.py      the PyTorch model (F, L and A layers, so every Hybrid)
//! ```
//!
//! One table (`names.rs`) names every weight of a model and says how it is laid out, and both
//! directions read it: [`export_hf`] writes what it lists, [`import_hf`] fills what it lists,
//! so the two cannot disagree. `config.json`'s keys are [`HfConfig`]. The mixers `R`, `N` and
//! `K` (research baselines, not in the PyTorch file) are refused with [`HfError::Mixer`].

mod config;
mod export;
mod import;
mod names;

pub use config::{HfConfig, MODEL_TYPE};
pub use export::{HfDtype, export_hf};
pub use import::{ImportSummary, import_hf};

use std::path::PathBuf;

use thiserror::Error;

/// The PyTorch configuration class written into every folder.
pub const CONFIGURATION_PY: &str = include_str!("../../hf/configuration_relation.py");
/// The PyTorch model written into every folder.
pub const MODELING_PY: &str = include_str!("../../hf/modeling_relation.py");

/// Why a Hugging Face folder cannot be written or read.
#[derive(Debug, Error)]
pub enum HfError {
    /// `config.json` is not a Relation model's.
    #[error(
        "{path}: model_type is {found}, not \"relation\": this folder holds another kind of model"
    )]
    ModelType {
        /// The `config.json`.
        path: PathBuf,
        /// Its `model_type` as JSON (`"llama"`, or `null` when absent).
        found: String,
    },
    /// `config.json` cannot be parsed, or a value in it is out of range.
    #[error("{path}: {reason}")]
    Config {
        /// The `config.json`.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A layer whose mixer has no counterpart in the PyTorch implementation.
    #[error(
        "layer {layer} is `{letter}`: only F, L and A layers (and Hybrids of them) can be written as a Hugging Face model"
    )]
    Mixer {
        /// The layer.
        layer: usize,
        /// Its pattern letter.
        letter: char,
    },
    /// A weight the model needs is not in `model.safetensors`.
    #[error("{path}: tensor `{name}` is missing (expected shape {expected:?})")]
    Missing {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The shape it must have.
        expected: Vec<usize>,
    },
    /// A weight of the wrong shape.
    #[error("{path}: tensor `{name}` has shape {found:?}, the model needs {expected:?}")]
    Shape {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor the model does not have (another layer pattern or an ablation's weight).
    #[error(
        "{path}: tensor `{name}` belongs to no weight of this configuration (another layer pattern or ablation?)"
    )]
    Unexpected {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor in an element type other than f32, bf16 or f16.
    #[error("{path}: tensor `{name}` is {dtype}; f32, bf16 and f16 can be read")]
    Dtype {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// Its element type.
        dtype: String,
    },
    /// A weight that is NaN or infinite.
    #[error("{path}: tensor `{name}` holds a value that is not finite")]
    NonFinite {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// `model.safetensors` is not a safetensors file.
    #[error("{path}: not a readable safetensors file: {reason}")]
    Safetensors {
        /// The weights file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// The tokenizer and the embedding disagree on the vocabulary.
    #[error(
        "{path}: the tokenizer has {tokenizer} tokens but the model's vocabulary (vocab_size, the embedding's rows) is {model}"
    )]
    Vocabulary {
        /// The `tokenizer.json`.
        path: PathBuf,
        /// Tokens in the tokenizer.
        tokenizer: usize,
        /// `vocab_size`.
        model: usize,
    },
    /// The output exists and is not an empty directory.
    #[error("{path}: {reason}")]
    Output {
        /// The output path.
        path: PathBuf,
        /// What is in the way.
        reason: String,
    },
}
