//! `relation import --from hf`: a Hugging Face folder (ours, or one a PyTorch user saved after
//! fine-tuning) read back into a run directory that `relation eval`, `generate` and `export`
//! use like any other.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use relation_model::RelationLm;
use safetensors::{Dtype, SafeTensors};
use tokenizers::Tokenizer;

use super::names::{Slot, slots, transpose};
use super::{HfConfig, HfError};
use crate::checkpoint::{self, CheckpointState};
use crate::config::RunConfig;
use crate::data::DataPosition;
use crate::error::io;
use crate::fs::write_atomic;
use crate::{Result, TrainError};

/// What [`import_hf`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Its checkpoint (step 0).
    pub checkpoint: PathBuf,
    /// Layers.
    pub layers: usize,
    /// The layer pattern.
    pub pattern: String,
    /// Parameters read.
    pub parameters: usize,
    /// Element type of the weights in the folder (`F32`, `BF16`, `F16`).
    pub dtype: String,
}

/// The name transformers may give the tied output projection when it saves a folder.
const LM_HEAD: &str = "lm_head.weight";
/// The embedding's name in the folder.
const EMBEDDING: &str = "model.embed_tokens.weight";

/// A Hugging Face folder read into a model.
pub(crate) struct Folder {
    /// Its `config.json`.
    pub hf: HfConfig,
    /// The model with the folder's weights.
    pub model: RelationLm,
    /// The model configuration as `relation train` writes `model.json`.
    pub model_json: String,
    /// The folder's `tokenizer.json`.
    pub tokenizer_json: String,
    /// The element types of its weights (`F32`, or e.g. `BF16` for an export with `--dtype`).
    pub dtype: String,
}

/// One tensor of the folder: its shape, its values as f32 and its element type in the file.
fn read_tensor(
    file: &SafeTensors<'_>,
    path: &Path,
    name: &str,
) -> Result<(Vec<usize>, Vec<f32>, Dtype)> {
    let view = file.tensor(name).map_err(|e| HfError::Safetensors {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let bytes = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(HfError::Dtype {
                path: path.into(),
                name: name.into(),
                dtype: format!("{other:?}"),
            }
            .into());
        }
    };
    if values.iter().any(|v| !v.is_finite()) {
        return Err(HfError::NonFinite {
            path: path.into(),
            name: name.into(),
        }
        .into());
    }
    Ok((view.shape().to_vec(), values, view.dtype()))
}

/// Reads the Hugging Face folder `dir` into a model on `device`: its configuration, and every
/// weight named and shaped as [`super::names`] lists them.
///
/// # Errors
/// [`HfError`] naming the problem: another `model_type`, a bad configuration value, a missing,
/// misshapen, unexpected, non-finite or wrongly typed tensor, a tokenizer whose vocabulary
/// differs from the embedding's.
pub(crate) fn read_folder(dir: &Path, device: &Device) -> Result<Folder> {
    let config_path = dir.join("config.json");
    let hf = HfConfig::load(&config_path)?;
    let model_config = hf.model_config(&config_path)?;

    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer_json = std::fs::read_to_string(&tokenizer_path).map_err(io(&tokenizer_path))?;
    let tokenizer = tokenizer_json
        .parse::<Tokenizer>()
        .map_err(|e| TrainError::Tokenizer(format!("{}: {e}", tokenizer_path.display())))?;
    let tokens = tokenizer.get_vocab_size(true);
    if tokens != model_config.vocab_size {
        return Err(HfError::Vocabulary {
            path: tokenizer_path,
            tokenizer: tokens,
            model: model_config.vocab_size,
        }
        .into());
    }

    let weights_path = dir.join("model.safetensors");
    let bytes = std::fs::read(&weights_path).map_err(io(&weights_path))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| HfError::Safetensors {
        path: weights_path.clone(),
        reason: e.to_string(),
    })?;
    let mut unread: BTreeSet<String> = file.names().into_iter().map(String::from).collect();
    let mut dtypes = BTreeSet::new();

    // transformers drops one of two tied tensors when it saves; accept either name for the
    // embedding, and both only when they are equal.
    if unread.contains(EMBEDDING) && unread.contains(LM_HEAD) {
        let (_, embedding, _) = read_tensor(&file, &weights_path, EMBEDDING)?;
        let (_, head, _) = read_tensor(&file, &weights_path, LM_HEAD)?;
        if embedding != head {
            return Err(HfError::Config {
                path: weights_path,
                reason: format!(
                    "`{LM_HEAD}` differs from `{EMBEDDING}`, but a Relation model ties its output projection to the embedding"
                ),
            }
            .into());
        }
        unread.remove(LM_HEAD);
    }

    let mut model = model_config.init(device)?;
    for (name, slot) in slots(&mut model)? {
        let expected = slot.shape();
        let stored = if name == EMBEDDING && !unread.contains(EMBEDDING) {
            LM_HEAD.to_string()
        } else {
            name.clone()
        };
        if !unread.remove(&stored) {
            return Err(HfError::Missing {
                path: weights_path,
                name,
                expected,
            }
            .into());
        }
        let (shape, values, dtype) = read_tensor(&file, &weights_path, &stored)?;
        if shape != expected {
            return Err(HfError::Shape {
                path: weights_path,
                name,
                expected,
                found: shape,
            }
            .into());
        }
        dtypes.insert(dtype.to_string());
        match slot {
            Slot::Linear(linear) => {
                // The model's [in, out] from the folder's [out, in].
                let (d_out, d_in) = (shape[0], shape[1]);
                let values = transpose(&values, d_out, d_in);
                let tensor = Tensor::<2>::from_data(TensorData::new(values, [d_in, d_out]), device);
                linear.weight = Param::from_tensor(tensor);
            }
            Slot::Matrix(param) => {
                let tensor =
                    Tensor::<2>::from_data(TensorData::new(values, [shape[0], shape[1]]), device);
                *param = Param::from_tensor(tensor);
            }
            Slot::Vector(param) => {
                let tensor = Tensor::<1>::from_data(TensorData::new(values, [shape[0]]), device);
                *param = Param::from_tensor(tensor);
            }
        }
    }
    if let Some(name) = unread.into_iter().next() {
        return Err(HfError::Unexpected {
            path: weights_path,
            name,
        }
        .into());
    }
    Ok(Folder {
        hf,
        model,
        model_json: serde_json::to_string_pretty(&model_config).expect("config serializes"),
        tokenizer_json,
        dtype: dtypes.into_iter().collect::<Vec<_>>().join("+"),
    })
}

/// Reads the Hugging Face folder `dir` and writes it as a new run directory `run_dir`
/// (`config.json`, `model.json`, `tokenizer.json` and a step-0 checkpoint with fresh optimizer
/// state), which `relation eval`, `generate` and `export` read like a trained run. The run's
/// context is the folder's `max_position_embeddings`.
///
/// # Errors
/// The folder's problems, each a typed [`HfError`] (another `model_type`, a bad value, a
/// missing, misshapen, unexpected or non-finite tensor, a tokenizer that does not fit); [`HfError::Output`] when `run_dir`
/// exists and is not empty; file-system failures.
pub fn import_hf(dir: &Path, run_dir: &Path) -> Result<ImportSummary> {
    if run_dir.exists()
        && (!run_dir.is_dir()
            || std::fs::read_dir(run_dir)
                .map_err(io(run_dir))?
                .next()
                .is_some())
    {
        return Err(HfError::Output {
            path: run_dir.into(),
            reason: "exists and is not an empty directory; import into a new run directory".into(),
        }
        .into());
    }
    let device = Device::flex();
    let Folder {
        hf,
        model,
        model_json,
        tokenizer_json,
        dtype,
    } = read_folder(dir, &device)?;

    let mut config = RunConfig::default();
    config.train.seq_len = hf.max_position_embeddings;
    config.model.pattern = Some(hf.mixer_pattern.clone());
    config.model.d_model = Some(hf.hidden_size);
    config.model.n_layers = Some(hf.num_hidden_layers);
    config.model.n_heads = Some(hf.num_attention_heads);
    config.model.d_ff = Some(hf.intermediate_size);
    std::fs::create_dir_all(run_dir).map_err(io(run_dir))?;
    let config_json = serde_json::to_string_pretty(&config).expect("config serializes");
    write_atomic(&run_dir.join("config.json"), config_json.as_bytes())?;
    write_atomic(&run_dir.join("model.json"), model_json.as_bytes())?;
    write_atomic(&run_dir.join("tokenizer.json"), tokenizer_json.as_bytes())?;

    let optim = crate::optim::adamw(&model, &config.train)?;
    let state = CheckpointState {
        format: checkpoint::FORMAT,
        step: 0,
        tokens_seen: 0,
        position: DataPosition { epoch: 0, index: 0 },
        seed: 0,
        model_fingerprint: checkpoint::fingerprint(&model_json),
        tokenizer_fingerprint: checkpoint::fingerprint(&tokenizer_json),
        elapsed_s: 0.0,
        files: Default::default(),
        skipped_steps: 0,
        loss_scale: None,
    };
    let checkpoint = checkpoint::save(run_dir, &model, &optim, state, 1)?;
    Ok(ImportSummary {
        run_dir: run_dir.into(),
        checkpoint,
        layers: hf.num_hidden_layers,
        pattern: hf.mixer_pattern,
        parameters: burn::module::Module::num_params(&model),
        dtype,
    })
}
