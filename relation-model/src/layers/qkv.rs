//! The projections of the attention-like mixers (`A` attention, `R` RealFormer, `N` retention):
//! `Q = rope(X W_Q)`, `K = rope(X W_K)`, `V = X W_V`.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use relation_core::RopePositions;

use super::{dense, linear, rope_heads, split_heads};

heads_config! {
    /// Configuration of a [`QkvProjection`].
    QkvProjectionConfig
}

impl QkvProjectionConfig {
    /// Builds the three bias-free `d x d` projections.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<QkvProjection> {
        crate::config::check_heads(self.d_model, self.n_heads, false)?;
        let d = self.d_model;
        // Burn draws the weights lazily at first use; a forward and a visit of the fields both
        // read them as wq, wk, wv.
        Ok(QkvProjection {
            wq: linear(d, d, device),
            wk: linear(d, d, device),
            wv: linear(d, d, device),
            heads: self.n_heads,
            rope_base: self.rope_base,
        })
    }
}

/// `(rope(X W_Q), rope(X W_K), X W_V)`: RoPE on queries and keys makes their products depend on
/// relative positions only; values are not rotated. Built by [`QkvProjectionConfig`].
#[derive(Module, Debug)]
pub struct QkvProjection {
    /// Queries.
    pub wq: Linear,
    /// Keys.
    pub wk: Linear,
    /// Values.
    pub wv: Linear,
    /// Heads `H`.
    pub heads: usize,
    /// RoPE base.
    pub rope_base: f64,
}

impl QkvProjection {
    /// The projections of tokens at positions `offset..` (`offset` > 0 when decoding on from a
    /// cache: RoPE needs absolute positions).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`; output: `(Q, K, V)`, `[B, T, H, D]` each
    ///
    /// # Errors
    /// A bad RoPE base.
    pub fn forward(
        &self,
        x: Tensor<3>,
        offset: usize,
    ) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
        self.forward_at(x, &RopePositions::From(offset))
    }

    /// The projections with RoPE at `positions`: `From(offset)` as [`QkvProjection::forward`],
    /// or a packed row's local positions (every segment from 0).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]` (`[1, total, d]` when packed); output: `(Q, K, V)`, `[B, T, H, D]` each
    ///
    /// # Errors
    /// A bad RoPE base; segments that do not cover the row.
    pub fn forward_at(
        &self,
        x: Tensor<3>,
        positions: &RopePositions,
    ) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
        let q = rope_heads(&self.wq, x.clone(), self.heads, positions, self.rope_base)?;
        let k = rope_heads(&self.wk, x.clone(), self.heads, positions, self.rope_base)?;
        Ok((q, k, split_heads(dense(&self.wv, x)?, self.heads)))
    }
}
