//! `relation export --format hf`: a run's checkpoint as a Hugging Face transformers folder.

use std::collections::HashMap;
use std::path::Path;

use relation_model::RelationLm;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, serialize};

use super::names::{Slot, slots, transpose};
use super::{CONFIGURATION_PY, HfConfig, HfError, MODEL_TYPE, MODELING_PY};
use crate::data::EOT;
use crate::error::io;
use crate::evaluate::LoadedRun;
use crate::fs::write_atomic;
use crate::{Result, TrainError};

/// The element type of the exported weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum HfDtype {
    /// f32: the trained weights exactly (a round trip gives them back bit for bit).
    #[default]
    F32,
    /// bfloat16, rounded to nearest even (half the size; a round trip gives the rounded weights).
    Bf16,
    /// float16, rounded to nearest even.
    F16,
}

impl HfDtype {
    /// transformers' name (`torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            Self::F32 => Dtype::F32,
            Self::Bf16 => Dtype::BF16,
            Self::F16 => Dtype::F16,
        }
    }

    /// `values` as little-endian bytes of this type.
    fn bytes(self, values: &[f32]) -> Vec<u8> {
        match self {
            Self::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Self::Bf16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            Self::F16 => values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
        }
    }
}

/// A weight in the folder: its name, shape and values (row-major).
pub(super) type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// The weights of `model` in the folder's names and layouts, as f32 (see [`super::names`]).
///
/// # Errors
/// [`HfError::Mixer`] for an `R`, `N` or `K` layer; a weight that cannot be read back.
pub(super) fn hf_tensors(model: &RelationLm) -> Result<Vec<NamedTensor>> {
    let mut model = model.clone();
    let mut out = Vec::new();
    for (name, slot) in slots(&mut model)? {
        let shape = slot.shape();
        let (data, linear) = match slot {
            Slot::Linear(l) => (l.weight.val().into_data(), true),
            Slot::Matrix(p) => (p.val().into_data(), false),
            Slot::Vector(p) => (p.val().into_data(), false),
        };
        let values = data
            .convert::<f32>()
            .try_to_vec::<f32>()
            .map_err(|e| TrainError::Data(format!("reading weight {name}: {e:?}")))?;
        // The folder's [out, in] from the model's [in, out].
        let values = if linear {
            transpose(&values, shape[1], shape[0])
        } else {
            values
        };
        out.push((name, shape, values));
    }
    Ok(out)
}

/// Refuses an output that holds something other than an earlier export (never overwrites work).
fn check_output(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    let taken = |reason: &str| {
        Err(HfError::Output {
            path: out.into(),
            reason: reason.into(),
        }
        .into())
    };
    if !out.is_dir() {
        return taken("exists and is not a directory");
    }
    let empty = std::fs::read_dir(out).map_err(io(out))?.next().is_none();
    if empty || HfConfig::load(&out.join("config.json")).is_ok() {
        return Ok(());
    }
    taken(&format!(
        "is not empty and holds no model_type \"{MODEL_TYPE}\" config.json (not an earlier export); choose an empty or new directory"
    ))
}

/// Writes `run` (loaded from `run_dir`) as a Hugging Face folder at `out` (created; an earlier
/// export there is replaced, anything else refused), weights in `dtype`.
///
/// # Errors
/// [`HfError::Mixer`] for a model with `R`, `N` or `K` layers; [`HfError::Output`] for an
/// output that holds other files; [`HfError::Vocabulary`] for a tokenizer that does not match
/// the embedding; file-system failures.
pub fn export_hf(run: &LoadedRun, run_dir: &Path, out: &Path, dtype: HfDtype) -> Result<()> {
    let eot = run.tokenizer.token_to_id(EOT);
    let context = run.config.train.seq_len;
    let config = HfConfig::from_model(&run.model_config, context, dtype.torch_name(), eot)?;
    let tokenizer_path = run_dir.join("tokenizer.json");
    let tokens = run.tokenizer.get_vocab_size(true);
    if tokens != run.model_config.vocab_size {
        return Err(HfError::Vocabulary {
            path: tokenizer_path,
            tokenizer: tokens,
            model: run.model_config.vocab_size,
        }
        .into());
    }
    check_output(out)?;
    let tensors = hf_tensors(&run.model)?;
    std::fs::create_dir_all(out).map_err(io(out))?;

    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, shape, values)| (name, shape, dtype.bytes(&values)))
        .collect();
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            TensorView::new(dtype.safetensors(), shape.clone(), data)
                .map(|view| (name.clone(), view))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| TrainError::Data(format!("laying out the weights: {e}")))?;
    // transformers loads a safetensors file only when its metadata says which framework
    // wrote the layout.
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let weights = serialize(views, Some(metadata))
        .map_err(|e| TrainError::Data(format!("writing the weights: {e}")))?;
    write_atomic(&out.join("model.safetensors"), &weights)?;

    let json = |value: &serde_json::Value| {
        let mut text = serde_json::to_string_pretty(value).expect("JSON value serializes");
        text.push('\n');
        text
    };
    let config_json = serde_json::to_value(&config).expect("config serializes");
    write_atomic(&out.join("config.json"), json(&config_json).as_bytes())?;
    let tokenizer = std::fs::read(&tokenizer_path).map_err(io(&tokenizer_path))?;
    write_atomic(&out.join("tokenizer.json"), &tokenizer)?;
    let mut tokenizer_config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context,
        "clean_up_tokenization_spaces": false,
    });
    // No cache: the PyTorch model recomputes the prefix at every step.
    let mut generation = serde_json::json!({ "_from_model_config": true, "use_cache": false });
    if let Some(id) = eot {
        tokenizer_config["eos_token"] = EOT.into();
        tokenizer_config["bos_token"] = EOT.into();
        generation["eos_token_id"] = id.into();
        generation["bos_token_id"] = id.into();
    }
    write_atomic(
        &out.join("tokenizer_config.json"),
        json(&tokenizer_config).as_bytes(),
    )?;
    write_atomic(
        &out.join("generation_config.json"),
        json(&generation).as_bytes(),
    )?;
    write_atomic(
        &out.join("configuration_relation.py"),
        CONFIGURATION_PY.as_bytes(),
    )?;
    write_atomic(&out.join("modeling_relation.py"), MODELING_PY.as_bytes())?;
    Ok(())
}
