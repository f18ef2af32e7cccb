//! `config.json` of a Hugging Face folder: the model's hyper-parameters under transformers'
//! usual names where one exists (`hidden_size`, `rope_theta`, …), the Relation ones under their
//! own, and what transformers needs to find the code (`model_type`, `architectures`,
//! `auto_map`).

use std::collections::BTreeMap;
use std::path::Path;

use relation_model::{MixerKind, RelationLmConfig};
use serde::{Deserialize, Serialize};

use super::HfError;

/// `model_type` of every Relation folder.
pub const MODEL_TYPE: &str = "relation";

/// Version of the folder layout (tensor names and `config.json` keys).
pub const FORMAT: u32 = 1;

fn default_dtype() -> String {
    "float32".into()
}

fn default_format() -> u32 {
    FORMAT
}

/// `config.json` of a Relation model folder. Written by `relation export --format hf`; read
/// back from it or from a folder that transformers saved (`save_pretrained` keeps every key and
/// adds its own, which are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfConfig {
    /// Always [`MODEL_TYPE`].
    pub model_type: String,
    /// `["RelationForCausalLM"]`.
    pub architectures: Vec<String>,
    /// Where transformers finds the configuration and model classes in the folder.
    pub auto_map: BTreeMap<String, String>,
    /// Vocabulary size `V` (the embedding's rows).
    pub vocab_size: usize,
    /// Model width `d`.
    pub hidden_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Heads `H` (head dimension `d / H`).
    pub num_attention_heads: usize,
    /// SwiGLU hidden width.
    pub intermediate_size: usize,
    /// Mixer letters (`F`, `L`, `A`), repeated to `num_hidden_layers`: layer `i` is
    /// `mixer_pattern[i % len]`.
    pub mixer_pattern: String,
    /// Self temperature `τ_S`.
    pub tau: f64,
    /// The initial count calibration `λ` (the trained one is each F layer's `count_lambda`).
    pub lambda_init: f64,
    /// Whether `λ` was learned.
    pub lambda_trainable: bool,
    /// RoPE base.
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rank `r` of the Linear Relation gate's `W_up W_down` (resolved: never 0).
    pub gate_rank: usize,
    /// Givens mixing of the information heads.
    pub givens: bool,
    /// The information projection `W_I` (`false`: the `I = X` ablation).
    pub info_projection: bool,
    /// The Exchange-only ablation (no Self term).
    pub exchange_only: bool,
    /// How the Rust kernels run the L layers (`recurrent`, `chunked:N`); the same function.
    pub linear_mode: String,
    /// The context the model was trained at.
    pub max_position_embeddings: usize,
    /// Always true: the output projection is the embedding.
    pub tie_word_embeddings: bool,
    /// The element type of `model.safetensors` (`float32`, `bfloat16`, `float16`); read from
    /// `dtype` too, the name transformers 5 writes when it saves a model.
    #[serde(alias = "dtype", default = "default_dtype")]
    pub torch_dtype: String,
    /// `<|endoftext|>`'s id, where the tokenizer has it.
    pub bos_token_id: Option<u32>,
    /// `<|endoftext|>`'s id, where the tokenizer has it.
    pub eos_token_id: Option<u32>,
    /// Version of the folder layout (tensor names and keys): 1.
    #[serde(default = "default_format")]
    pub relation_format: u32,
}

impl HfConfig {
    /// The `config.json` of `model`, trained at `context` tokens, with weights in `torch_dtype`.
    ///
    /// # Errors
    /// [`HfError::Mixer`] for a layer other than F, L or A.
    pub fn from_model(
        model: &RelationLmConfig,
        context: usize,
        torch_dtype: &str,
        eot: Option<u32>,
    ) -> Result<Self, HfError> {
        check_mixers(model, Path::new("model.json"))?;
        let auto_map = BTreeMap::from([
            (
                "AutoConfig".to_string(),
                "configuration_relation.RelationConfig".to_string(),
            ),
            (
                "AutoModelForCausalLM".to_string(),
                "modeling_relation.RelationForCausalLM".to_string(),
            ),
        ]);
        Ok(Self {
            model_type: MODEL_TYPE.into(),
            architectures: vec!["RelationForCausalLM".into()],
            auto_map,
            vocab_size: model.vocab_size,
            hidden_size: model.d_model,
            num_hidden_layers: model.n_layers,
            num_attention_heads: model.n_heads,
            intermediate_size: model.d_ff,
            mixer_pattern: model
                .pattern
                .chars()
                .filter(|c| !c.is_whitespace())
                .collect(),
            tau: model.tau,
            lambda_init: model.lambda_init,
            lambda_trainable: model.lambda_trainable,
            rope_theta: model.rope_base,
            rms_norm_eps: model.norm_eps,
            gate_rank: model.gate_rank(),
            givens: model.givens,
            info_projection: model.info_projection,
            exchange_only: model.exchange_only,
            linear_mode: model.linear_mode.to_string(),
            max_position_embeddings: context,
            tie_word_embeddings: true,
            torch_dtype: torch_dtype.into(),
            bos_token_id: eot,
            eos_token_id: eot,
            relation_format: FORMAT,
        })
    }

    /// Reads `path`, refusing another `model_type` before anything else.
    ///
    /// # Errors
    /// [`HfError::ModelType`], [`HfError::Config`] for unreadable JSON or a missing key.
    pub fn load(path: &Path) -> Result<Self, HfError> {
        let bad = |reason: String| HfError::Config {
            path: path.into(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let model_type = value.get("model_type");
        if model_type.and_then(|v| v.as_str()) != Some(MODEL_TYPE) {
            return Err(HfError::ModelType {
                path: path.into(),
                found: model_type.map_or("null".into(), |v| v.to_string()),
            });
        }
        serde_json::from_value(value).map_err(|e| bad(e.to_string()))
    }

    /// The Rust model configuration; `validate`d, so a bad value is named here.
    ///
    /// # Errors
    /// [`HfError::Config`] for a value the model refuses or a bad `linear_mode`;
    /// [`HfError::Mixer`] for a layer other than F, L or A.
    pub fn model_config(&self, path: &Path) -> Result<RelationLmConfig, HfError> {
        let bad = |reason: String| HfError::Config {
            path: path.into(),
            reason,
        };
        let linear_mode = self
            .linear_mode
            .parse()
            .map_err(|e| bad(format!("linear_mode: {e}")))?;
        let heads = self.num_attention_heads.max(1);
        // 0 is the model's own spelling of "the head dimension" (what `model.json` holds for
        // the default), so a round trip gives back the configuration it started from.
        let gate_rank = if self.gate_rank == self.hidden_size / heads {
            0
        } else {
            self.gate_rank
        };
        let config = RelationLmConfig::new(
            self.vocab_size,
            self.hidden_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.intermediate_size,
        )
        .with_pattern(self.mixer_pattern.clone())
        .with_tau(self.tau)
        .with_lambda_init(self.lambda_init)
        .with_lambda_trainable(self.lambda_trainable)
        .with_rope_base(self.rope_theta)
        .with_norm_eps(self.rms_norm_eps)
        .with_gate_rank(gate_rank)
        .with_givens(self.givens)
        .with_info_projection(self.info_projection)
        .with_exchange_only(self.exchange_only)
        .with_linear_mode(linear_mode);
        config.validate().map_err(|e| bad(e.to_string()))?;
        if !self.tie_word_embeddings {
            return Err(bad(
                "tie_word_embeddings is false: Relation models share the embedding with the output projection".into(),
            ));
        }
        if self.relation_format != FORMAT {
            return Err(bad(format!(
                "relation_format {}: this build reads layout {FORMAT}",
                self.relation_format
            )));
        }
        if self.max_position_embeddings == 0 {
            return Err(bad("max_position_embeddings is 0".into()));
        }
        check_mixers(&config, path)?;
        Ok(config)
    }
}

/// [`HfError::Mixer`] for the first layer that is not F, L or A; `path` is the file the
/// configuration came from, named if its pattern cannot be read.
fn check_mixers(model: &RelationLmConfig, path: &Path) -> Result<(), HfError> {
    let mixers = model.mixers().map_err(|e| HfError::Config {
        path: path.into(),
        reason: e.to_string(),
    })?;
    for (layer, kind) in mixers.into_iter().enumerate() {
        let letter = match kind {
            MixerKind::Full | MixerKind::Linear | MixerKind::Attention => continue,
            MixerKind::RealFormer => 'R',
            MixerKind::Retention => 'N',
            MixerKind::Kda => 'K',
        };
        return Err(HfError::Mixer { layer, letter });
    }
    Ok(())
}
