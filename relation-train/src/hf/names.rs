//! The one table of a model's weights in a Hugging Face folder: each parameter's name there
//! and its layout. [`slots`] lists them in a fixed order; export reads each slot, import
//! fills each slot, so the two directions cannot drift apart.
//!
//! ```text
//! model.embed_tokens.weight                          [V, d]
//! model.norm.weight                                  [d]
//! model.layers.{i}.input_layernorm.weight            [d]        RMSNorm before the mixer
//! model.layers.{i}.post_attention_layernorm.weight   [d]        RMSNorm before the FFN
//! model.layers.{i}.mlp.{gate,up}_proj.weight         [d_ff, d]
//! model.layers.{i}.mlp.down_proj.weight              [d, d_ff]
//! F, L: model.layers.{i}.mixer.{p1,p2,o}_proj.weight [d, d]
//!       model.layers.{i}.mixer.info_proj.weight      [d, d]     (not in the I = X ablation)
//!       model.layers.{i}.mixer.givens_angles         [H / 2]    (not without Givens mixing)
//! F:    model.layers.{i}.mixer.count_lambda          [1]
//! L:    model.layers.{i}.mixer.gate.down_proj.weight [r, d]
//!       model.layers.{i}.mixer.gate.up_proj.weight   [d, r]
//!       model.layers.{i}.mixer.gate.A_log            [H]
//!       model.layers.{i}.mixer.gate.dt_bias          [d]
//! A:    model.layers.{i}.mixer.{q,k,v,o}_proj.weight [d, d]
//! ```
//!
//! Linear weights are PyTorch's `[out, in]` (`y = x Wᵀ`); Burn keeps them `[in, out]`, so they
//! are transposed on the way out and back. The output projection is the embedding (tied) and
//! is not stored, as transformers expects of tied weights. No layer has a bias.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use relation_model::{Mixer, RelationLm};

use super::HfError;

/// Where a weight lives in the model and how it is laid out.
pub(super) enum Slot<'a> {
    /// A bias-free Burn `Linear`: `[in, out]` in the model, `[out, in]` in the folder.
    Linear(&'a mut Linear),
    /// A matrix stored as the model holds it (the embedding, `[V, d]`).
    Matrix(&'a mut Param<Tensor<2>>),
    /// A vector (norm gains, Givens angles, `λ`, the gate's `A_log` and `dt_bias`).
    Vector(&'a mut Param<Tensor<1>>),
}

impl Slot<'_> {
    /// The weight's shape in the folder.
    pub(super) fn shape(&self) -> Vec<usize> {
        match self {
            Self::Linear(l) => {
                let [d_in, d_out] = l.weight.shape().dims();
                vec![d_out, d_in]
            }
            Self::Matrix(p) => p.shape().dims::<2>().to_vec(),
            Self::Vector(p) => p.shape().dims::<1>().to_vec(),
        }
    }
}

/// Every weight of `model` with its name in the folder, in a fixed order (the table above).
///
/// # Errors
/// [`HfError::Mixer`] for an `R`, `N` or `K` layer.
pub(super) fn slots(model: &mut RelationLm) -> Result<Vec<(String, Slot<'_>)>, HfError> {
    let mut out: Vec<(String, Slot<'_>)> = Vec::new();
    out.push((
        "model.embed_tokens.weight".into(),
        Slot::Matrix(&mut model.embedding.weight),
    ));
    for (i, block) in model.blocks.iter_mut().enumerate() {
        let at = |name: &str| format!("model.layers.{i}.{name}");
        out.push((
            at("input_layernorm.weight"),
            Slot::Vector(&mut block.norm_mixer.gamma),
        ));
        out.push((
            at("post_attention_layernorm.weight"),
            Slot::Vector(&mut block.norm_ffn.gamma),
        ));
        out.push((
            at("mlp.gate_proj.weight"),
            Slot::Linear(&mut block.ffn.gate),
        ));
        out.push((at("mlp.up_proj.weight"), Slot::Linear(&mut block.ffn.up)));
        out.push((
            at("mlp.down_proj.weight"),
            Slot::Linear(&mut block.ffn.down),
        ));
        let (projection, wo) = match &mut block.mixer {
            Mixer::Full(m) => {
                out.push((at("mixer.count_lambda"), Slot::Vector(&mut m.lambda)));
                (&mut m.projection, &mut m.wo)
            }
            Mixer::Linear(m) => {
                let gate = &mut m.gate;
                out.push((
                    at("mixer.gate.down_proj.weight"),
                    Slot::Linear(&mut gate.down),
                ));
                out.push((at("mixer.gate.up_proj.weight"), Slot::Linear(&mut gate.up)));
                out.push((at("mixer.gate.A_log"), Slot::Vector(&mut gate.a_log)));
                out.push((at("mixer.gate.dt_bias"), Slot::Vector(&mut gate.dt_bias)));
                (&mut m.projection, &mut m.wo)
            }
            Mixer::Attention(m) => {
                out.push((at("mixer.q_proj.weight"), Slot::Linear(&mut m.qkv.wq)));
                out.push((at("mixer.k_proj.weight"), Slot::Linear(&mut m.qkv.wk)));
                out.push((at("mixer.v_proj.weight"), Slot::Linear(&mut m.qkv.wv)));
                out.push((at("mixer.o_proj.weight"), Slot::Linear(&mut m.wo)));
                continue;
            }
            Mixer::RealFormer(_) => {
                return Err(HfError::Mixer {
                    layer: i,
                    letter: 'R',
                });
            }
            Mixer::Retention(_) => {
                return Err(HfError::Mixer {
                    layer: i,
                    letter: 'N',
                });
            }
            Mixer::Kda(_) => {
                return Err(HfError::Mixer {
                    layer: i,
                    letter: 'K',
                });
            }
        };
        out.push((at("mixer.p1_proj.weight"), Slot::Linear(&mut projection.w1)));
        out.push((at("mixer.p2_proj.weight"), Slot::Linear(&mut projection.w2)));
        if let Some(wi) = &mut projection.wi {
            out.push((at("mixer.info_proj.weight"), Slot::Linear(wi)));
        }
        if let Some(angles) = &mut projection.angles {
            out.push((at("mixer.givens_angles"), Slot::Vector(angles)));
        }
        out.push((at("mixer.o_proj.weight"), Slot::Linear(wo)));
    }
    out.push((
        "model.norm.weight".into(),
        Slot::Vector(&mut model.norm.gamma),
    ));
    Ok(out)
}

/// `[rows, cols]` row-major to `[cols, rows]` row-major.
pub(super) fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = values[r * cols + c];
        }
    }
    out
}
