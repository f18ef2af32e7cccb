//! The Relation projections shared by the Full (`F`) and Linear (`L`) Relation layers:
//! `P1 = rope(X W1)`, `P2 = rope(X W2)`, `Ĩ = Givens_l(X W_I)` (`docs/maths.md#5-multi-head-relation-and-givens-mixing`).

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use relation_core::RopePositions;

use super::{dense, dense_with, linear, rope_heads, split_heads};

/// Configuration of a [`RelationProjection`].
#[derive(Config, Debug)]
pub struct RelationProjectionConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Heads `H` (`d / H` even; `H` even with Givens mixing).
    pub n_heads: usize,
    /// Index of the layer in its stack: chooses the Givens pairing (A on even layers, B on odd
    /// ones). Default: 0.
    #[config(default = 0)]
    pub layer: usize,
    /// RoPE base. Default: [`relation_core::DEFAULT_ROPE_BASE`] (1e4).
    #[config(default = "relation_core::DEFAULT_ROPE_BASE")]
    pub rope_base: f64,
    /// Givens mixing of the information heads; `false` is the "no Givens" ablation. Default: true.
    #[config(default = true)]
    pub givens: bool,
    /// The information projection `I = X W_I`; `false` is the `I = X` ablation: no `W_I`, the
    /// layer's input itself (split into heads, then Givens-mixed) is transported. Default: true.
    #[config(default = true)]
    pub info_projection: bool,
}

impl RelationProjectionConfig {
    /// Builds the projections: three bias-free `d x d` matrices and, with Givens mixing, `H / 2`
    /// angles initialised to 0 (so `Ĩ = I` at the start of training).
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<RelationProjection> {
        crate::config::check_heads(self.d_model, self.n_heads, self.givens)?;
        let d = self.d_model;
        // Burn draws the weights from the device RNG lazily, at first use: a forward reads them
        // as w1, w2, wi, and so does a visit of the fields (saving, counting). Keep both orders, or
        // a seeded model gets other initial weights.
        Ok(RelationProjection {
            w1: linear(d, d, device),
            w2: linear(d, d, device),
            wi: self.info_projection.then(|| linear(d, d, device)),
            angles: self
                .givens
                .then(|| Param::from_tensor(Tensor::zeros([self.n_heads / 2], device))),
            layer: self.layer,
            heads: self.n_heads,
            rope_base: self.rope_base,
        })
    }
}

/// `(P1, P2, Ĩ) = (rope(X W1), rope(X W2), Givens_l(X W_I))`: RoPE turns the evidence
/// `P1_i · P2_j` into a function of `i - j`, while the information `Ĩ` is never rotated; its
/// heads are mixed pairwise by learned Givens rotations instead (angles `[H / 2]`, pairing by
/// layer index). Built by [`RelationProjectionConfig`].
#[derive(Module, Debug)]
pub struct RelationProjection {
    /// `P1 = X W1`.
    pub w1: Linear,
    /// `P2 = X W2`.
    pub w2: Linear,
    /// `I = X W_I`; `None` in the `I = X` ablation.
    pub wi: Option<Linear>,
    /// Givens angles, `[H / 2]`, f32; `None` without Givens mixing (then `Ĩ = I`).
    pub angles: Option<Param<Tensor<1>>>,
    /// Layer index (chooses the Givens pairing).
    pub layer: usize,
    /// Heads `H`.
    pub heads: usize,
    /// RoPE base.
    pub rope_base: f64,
}

impl RelationProjection {
    /// The projections of tokens at positions `offset..` (`offset` > 0 when decoding on from a
    /// cache: RoPE needs absolute positions).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`; output: `(P1, P2, Ĩ)`, `[B, T, H, D]` each
    ///
    /// # Errors
    /// A bad RoPE base; Givens angles that do not match the head count.
    pub fn forward(
        &self,
        x: Tensor<3>,
        offset: usize,
    ) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
        self.forward_at(x, &RopePositions::From(offset))
    }

    /// [`forward`](Self::forward) with RoPE at any positions (a packed row: every segment from
    /// position 0).
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    ///
    /// # Errors
    /// As [`forward`](Self::forward), plus segments that do not cover the packed rows.
    pub fn forward_at(
        &self,
        x: Tensor<3>,
        positions: &RopePositions,
    ) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
        let p1 = rope_heads(&self.w1, x.clone(), self.heads, positions, self.rope_base)?;
        let p2 = rope_heads(&self.w2, x.clone(), self.heads, positions, self.rope_base)?;
        let [b, t, _] = x.dims();
        let info = match (&self.wi, &self.angles) {
            // Mix whichever has fewer rows: `W_I` (`d_in`) or the tokens (`B·T`; one when
            // decoding). See `mix_rows`.
            (Some(wi), Some(angles)) if b * t >= wi.weight.dims()[0] => {
                let weight = self.mix_rows(wi.weight.val(), angles)?;
                let bias = match &wi.bias {
                    Some(bias) => {
                        let bias = bias.val().unsqueeze_dim(0); // [d] -> [1, d]
                        Some(self.mix_rows(bias, angles)?.squeeze_dim(0)) // [1, d] -> [d]
                    }
                    None => None,
                };
                split_heads(dense_with(weight, bias, x)?, self.heads) // [B, T, H, D]
            }
            (wi, angles) => {
                let info = match wi {
                    Some(wi) => dense(wi, x)?,
                    None => x, // I = X
                };
                let info = split_heads(info, self.heads); // [B, T, H, D]
                match angles {
                    Some(angles) => relation_core::givens_mix(info, angles.val(), self.layer)?,
                    None => info,
                }
            }
        };
        Ok((p1, p2, info))
    }

    /// The Givens mixing of this layer applied to every row of `w` as if each were one token's
    /// `[H·D]` features.
    ///
    /// Why the information projection mixes its weight rather than its output: the mixing
    /// rotates pairs of heads of one token, feature `j` of head `a` with feature `j` of head
    /// `b`, which is a linear map `G` on each token's row alone, so `Givens(X W_I) = (X W_I) G =
    /// X (W_I G)`, and `W_I G` is `W_I` with each of its `d_in` rows mixed as a token would be.
    /// The mixing (forward and backward, with the angles' gradient) then costs `O(d_in · d)`
    /// per step instead of `O(B·T · d)` passes over the activations (for the 3.7M model's
    /// 4,096-token step, 256 rows instead of 4,096), so the forward takes this route whenever
    /// `B·T >= d_in` and mixes the tokens otherwise (decoding, one token at a time). Only
    /// rounding differs: each element of `Ĩ` is one sum over `d_in` either way, with the
    /// rotation applied to its terms instead of its result.
    ///
    /// # Shapes
    /// - `w`: `[rows, H·D]`, output: same
    fn mix_rows(&self, w: Tensor<2>, angles: &Param<Tensor<1>>) -> crate::Result<Tensor<2>> {
        let [rows, d] = w.dims();
        let heads = self.heads;
        let w = w.reshape([1, rows, heads, d / heads]); // [rows, H·D] -> [1, rows, H, D]
        let mixed = relation_core::givens_mix(w, angles.val(), self.layer)?;
        Ok(mixed.reshape([rows, d])) // [1, rows, H, D] -> [rows, H·D]
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Param;
    use burn::tensor::{DType, Device, Tensor};
    use relation_core::givens_mix;
    use relation_core::testing::uniform;

    use super::super::{dense, dense_with, split_heads};
    use super::RelationProjectionConfig;

    /// The route `forward` takes, bit for bit: `W_I`'s rows mixed once `B·T >= d_in` (here at
    /// `B·T` = 32 = `d_in`, the boundary), every token's `X W_I` mixed below it (`B·T` = 10). The
    /// two routes round differently, so each output matches one of them only. (That both routes
    /// agree with the specification is `givens_mixed_weight_matches_mixing_every_token`.)
    #[test]
    fn mixes_the_weight_only_with_at_least_as_many_tokens_as_rows() {
        let device = Device::flex();
        let (d, heads, layer) = (32, 4, 1);
        let mut projection = RelationProjectionConfig::new(d, heads)
            .with_layer(layer)
            .init(&device)
            .unwrap();
        projection.angles = Some(Param::from_tensor(Tensor::<1>::from_data(
            [0.3, -1.1],
            &device,
        )));
        let (wi, angles) = (
            projection.wi.as_ref().unwrap(),
            projection.angles.as_ref().unwrap(),
        );
        for t in [5, 16] {
            let x = uniform([2, t, d], 7, 1.0, &device, DType::F32);
            let (_, _, info) = projection.forward(x.clone(), 0).unwrap();
            let weight = projection.mix_rows(wi.weight.val(), angles).unwrap();
            let by_weight = split_heads(dense_with(weight, None, x.clone()).unwrap(), heads);
            let by_token = split_heads(dense(wi, x).unwrap(), heads);
            let by_token = givens_mix(by_token, angles.val(), layer).unwrap();
            let (by_weight, by_token) = (by_weight.into_data(), by_token.into_data());
            assert_ne!(
                by_weight, by_token,
                "T {t}: the routes should round differently"
            );
            let expected = if 2 * t >= d { by_weight } else { by_token };
            assert_eq!(info.into_data(), expected, "T {t}");
        }
    }
}
