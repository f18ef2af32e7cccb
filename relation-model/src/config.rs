//! Model configuration, validation and the paper's presets.

use burn::config::Config;
use relation_kernels::LinearRelationMode;
use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The mixer of one layer, from a pattern letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MixerKind {
    /// `F`: Full (Self-Exchange) Relation, `docs/maths.md#5-multi-head-relation-and-givens-mixing`.
    Full,
    /// `L`: Linear Relation, `docs/maths.md#6-linear-relation`.
    Linear,
    /// `A`: causal multi-head softmax attention with RoPE (the paper's MHA baseline).
    Attention,
    /// `R`: RealFormer residual attention (reference path).
    RealFormer,
    /// `N`: RetNet multi-scale retention (reference path).
    Retention,
    /// `K`: Kimi Delta Attention, gated delta rule (reference path).
    Kda,
}

impl MixerKind {
    /// The mixer for a pattern letter.
    pub fn from_letter(letter: char) -> Option<Self> {
        match letter {
            'F' => Some(Self::Full),
            'L' => Some(Self::Linear),
            'A' => Some(Self::Attention),
            'R' => Some(Self::RealFormer),
            'N' => Some(Self::Retention),
            'K' => Some(Self::Kda),
            _ => None,
        }
    }
}

/// Configuration of a [`RelationLm`](crate::RelationLm).
///
/// Saved as JSON beside checkpoints (`config.save(path)`, `RelationLmConfig::load(path)`, or
/// `serde_json`). Built like a Burn config: `RelationLmConfig::new(vocab, d, layers, heads, d_ff)`
/// then `with_…` for any default; the defaults are the paper's (`docs/maths.md#10-rope-rmsnorm-and-the-model`).
///
/// Burn's `#[derive(Config)]` would make every field required in JSON; this struct derives serde
/// itself so that a field added later ([`linear_mode`](Self::linear_mode)) takes its default
/// when a `model.json` written before it lacks it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelationLmConfig {
    /// Vocabulary size (4096 in the paper's TinyStories runs).
    pub vocab_size: usize,
    /// Model width `d`.
    pub d_model: usize,
    /// Number of layers.
    pub n_layers: usize,
    /// Heads `H` (8 in every paper run; even, for Givens mixing).
    pub n_heads: usize,
    /// SwiGLU hidden width `d_ff`.
    pub d_ff: usize,
    /// Mixer letters, repeated to `n_layers`: `F` Full Relation, `L` Linear Relation, `A`
    /// attention, `R` RealFormer, `N` RetNet retention, `K` Kimi Delta Attention. `"F"` is all
    /// Full Relation, `"LLLF"` the paper's Hybrid, `"A"` the MHA baseline. Default: `"F"`.
    pub pattern: String,
    /// Self temperature `tau_S`. Default: [`relation_core::DEFAULT_TAU`] (2, fixed, not learned).
    pub tau: f64,
    /// Initial count-calibration `lambda` of every Full Relation layer. Default:
    /// [`relation_core::DEFAULT_LAMBDA`] (0.5).
    pub lambda_init: f64,
    /// RoPE base. Default: [`relation_core::DEFAULT_ROPE_BASE`] (1e4).
    pub rope_base: f64,
    /// RMSNorm epsilon. Default: 1e-6.
    pub norm_eps: f64,
    /// Rank of the Linear Relation retention projection `W_up W_down`. Default: 0 = head dim.
    pub gate_rank: usize,
    /// Whether the count-calibration `lambda` of the Full Relation layers is learned. `false`
    /// keeps it at [`lambda_init`](Self::lambda_init) (with `lambda_init = 0`, the ablation
    /// "no count calibration"). Default: true.
    pub lambda_trainable: bool,
    /// Givens mixing of the information heads (`docs/maths.md#5-multi-head-relation-and-givens-mixing`) in the Full and Linear Relation layers.
    /// `false` is the ablation "no Givens"; it also lifts the even-head rule, so `n_heads = 1`
    /// is the single-head Relation. Default: true.
    pub givens: bool,
    /// How the Linear Relation (`L`) layers run: `recurrent` or `chunked:N` (N in 16, 32, 64);
    /// the same function, other speed and rounding. Default: [`LinearRelationMode::Recurrent`]
    /// (also when a saved `model.json` has no such field).
    #[serde(default)]
    pub linear_mode: LinearRelationMode,
    /// The information projection `I = X W_I` of the Full Relation layers; `false` is the
    /// paper's `I = X` ablation (no `W_I`: the layer's input itself, split into heads and
    /// Givens-mixed, is transported; `d²` fewer parameters per layer). Default: true (also when
    /// a saved `model.json` has no such field).
    #[serde(default = "default_true")]
    pub info_projection: bool,
    /// The paper's Exchange-only ablation in the Full Relation layers: no Self term, every row
    /// with history gives its whole mass to it, the first row keeps its own information
    /// (`docs/maths.md#11-ablations`). Default: false (also when a saved `model.json` has no such
    /// field).
    #[serde(default)]
    pub exchange_only: bool,
}

fn default_true() -> bool {
    true
}

/// `with_…` setters for the fields that have defaults, in the style of Burn's config builders.
macro_rules! with_fields {
    ($($setter:ident => $field:ident: $ty:ty),* $(,)?) => {
        impl RelationLmConfig {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                pub fn $setter(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

with_fields! {
    with_pattern => pattern: String,
    with_tau => tau: f64,
    with_lambda_init => lambda_init: f64,
    with_rope_base => rope_base: f64,
    with_norm_eps => norm_eps: f64,
    with_gate_rank => gate_rank: usize,
    with_lambda_trainable => lambda_trainable: bool,
    with_givens => givens: bool,
    with_linear_mode => linear_mode: LinearRelationMode,
    with_info_projection => info_projection: bool,
    with_exchange_only => exchange_only: bool,
}

impl Config for RelationLmConfig {}

impl std::fmt::Display for RelationLmConfig {
    /// The JSON form, as saved.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&burn::config::config_to_json(self))
    }
}

impl RelationLmConfig {
    /// A configuration with the required sizes and every other field at its default.
    pub fn new(
        vocab_size: usize,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        d_ff: usize,
    ) -> Self {
        Self {
            vocab_size,
            d_model,
            n_layers,
            n_heads,
            d_ff,
            pattern: String::from("F"),
            tau: relation_core::DEFAULT_TAU,
            lambda_init: relation_core::DEFAULT_LAMBDA,
            rope_base: relation_core::DEFAULT_ROPE_BASE,
            norm_eps: 1e-6,
            gate_rank: 0,
            lambda_trainable: true,
            givens: true,
            linear_mode: LinearRelationMode::default(),
            info_projection: true,
            exchange_only: false,
        }
    }
}

impl RelationLmConfig {
    /// Head dimension `d / H`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Rank of the retention projection.
    pub fn gate_rank(&self) -> usize {
        if self.gate_rank == 0 {
            self.head_dim()
        } else {
            self.gate_rank
        }
    }

    /// The mixer of every layer.
    ///
    /// # Errors
    /// [`ModelError::UnknownMixer`] for a letter that names no mixer; [`ModelError::Zero`] for an
    /// empty pattern.
    pub fn mixers(&self) -> crate::Result<Vec<MixerKind>> {
        let letters: Vec<char> = self
            .pattern
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if letters.is_empty() {
            return Err(ModelError::Zero { name: "pattern" });
        }
        let kinds = letters
            .iter()
            .enumerate()
            .map(|(position, &letter)| {
                MixerKind::from_letter(letter).ok_or_else(|| ModelError::UnknownMixer {
                    letter,
                    position,
                    pattern: self.pattern.clone(),
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        Ok((0..self.n_layers).map(|l| kinds[l % kinds.len()]).collect())
    }

    /// Checks every field; called by `init`.
    ///
    /// # Errors
    /// The first rule the configuration breaks.
    pub fn validate(&self) -> crate::Result<()> {
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("d_ff", self.d_ff),
        ] {
            if value == 0 {
                return Err(ModelError::Zero { name });
            }
        }
        check_heads(self.d_model, self.n_heads, self.givens)?;
        relation_core::check::tau(self.tau)?;
        crate::layers::check_linear_mode(self.linear_mode)?;
        self.mixers().map(|_| ())
    }

    /// The paper's configurations (`docs/maths.md#10-rope-rmsnorm-and-the-model`) and small CPU presets, by name:
    /// `cpu` (the trainer's default: minutes on two CPU cores), `tiny`, `small` (CPU, minutes),
    /// `10m`, `30m`, `100m`, `hybrid-32m`; append `-mha` for the attention baseline of the same
    /// backbone (e.g. `10m-mha`).
    pub fn preset(name: &str) -> Option<Self> {
        let (base, mha) = match name.strip_suffix("-mha") {
            Some(base) => (base, true),
            None => (name, false),
        };
        let config = match base {
            // Small enough for a few minutes of training on two CPU cores with Flex: 4 layers,
            // d = 128, 4 heads of 32 (Givens pairs heads, RoPE pairs channels).
            "cpu" => Self::new(4096, 128, 4, 4, 384),
            "tiny" => Self::new(4096, 128, 4, 8, 256),
            "small" => Self::new(4096, 256, 6, 8, 512),
            "10m" => Self::new(4096, 384, 6, 8, 768),
            "30m" => Self::new(4096, 512, 10, 8, 1024),
            "100m" => Self::new(32768, 640, 20, 8, 1280),
            "hybrid-32m" => Self::new(4096, 480, 12, 8, 960).with_pattern("LLLF".into()),
            _ => return None,
        };
        Some(if mha {
            config.with_pattern("A".into())
        } else {
            config
        })
    }

    /// Every preset name.
    pub const PRESETS: &'static [&'static str] =
        &["cpu", "tiny", "small", "10m", "30m", "100m", "hybrid-32m"];
}

/// Checks that `d_model` splits into heads of even width (RoPE pairs channels), an even number of
/// them when `paired_heads` (Givens mixing pairs heads).
///
/// # Errors
/// [`ModelError::Zero`], [`ModelError::IndivisibleWidth`], [`ModelError::OddHeads`],
/// [`ModelError::OddHeadDim`].
pub fn check_heads(d_model: usize, n_heads: usize, paired_heads: bool) -> crate::Result<()> {
    if d_model == 0 {
        return Err(ModelError::Zero { name: "d_model" });
    }
    if n_heads == 0 {
        return Err(ModelError::Zero { name: "n_heads" });
    }
    if !d_model.is_multiple_of(n_heads) {
        return Err(ModelError::IndivisibleWidth {
            d_model,
            heads: n_heads,
        });
    }
    if paired_heads && n_heads % 2 == 1 {
        return Err(ModelError::OddHeads { heads: n_heads });
    }
    if (d_model / n_heads) % 2 == 1 {
        return Err(ModelError::OddHeadDim {
            head_dim: d_model / n_heads,
        });
    }
    Ok(())
}
