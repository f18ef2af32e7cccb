//! The language-model pieces around the mixers that have fused CPU kernels: the dense (fully
//! connected) product, RMS normalisation, the SwiGLU gate and the per-token cross-entropy. Written with tensor
//! operations (any device, differentiable by Burn); `relation-kernels` gives each a
//! multi-threaded Flex kernel.

use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::{DType, Int, Tensor};

use crate::error::{RelationError, Result};

/// The SwiGLU gate `SiLU(gate) ⊙ up = gate · sigmoid(gate) · up`, element-wise.
///
/// Gradients (what a fused backward must produce): with `s = sigmoid(gate)` and upstream `dy`,
/// `d up = dy · gate · s` and `d gate = dy · up · s · (1 + gate · (1 - s))`.
///
/// # Shapes
/// - `gate`, `up`: any shape `[..]`, the same for both; output: the same shape
///
/// # Errors
/// [`RelationError::ShapeMismatch`] when the shapes differ; [`RelationError::DeviceMismatch`].
pub fn naive_swiglu<const N: usize>(gate: Tensor<N>, up: Tensor<N>) -> Result<Tensor<N>> {
    check_swiglu(&gate, &up)?;
    Ok(silu(gate) * up)
}

/// RMS normalisation over the last dimension, `y = x / sqrt(mean(x²) + eps) ⊙ γ`, computed as
/// Burn's `RmsNorm` computes it (the mean of squares in f32): the model's pre-norms.
///
/// Gradients (what a fused backward must produce), per row with `r = 1 / sqrt(mean(x²) + eps)`,
/// `x̂ = x r` and `g = dy ⊙ γ`: `dx = r (g - x̂ mean(g ⊙ x̂))`, `dγ = Σ_rows dy ⊙ x̂`.
///
/// # Shapes
/// - `x`: `[.., d]`; `gamma`: `[d]`; output: the shape of `x`
///
/// # Errors
/// [`RelationError::EmptyDimension`], [`RelationError::ShapeMismatch`] when `gamma` is not
/// `[d]`, [`RelationError::InvalidEpsilon`], [`RelationError::DeviceMismatch`],
/// [`RelationError::DTypeMismatch`].
pub fn naive_rms_norm<const N: usize>(
    x: Tensor<N>,
    gamma: Tensor<1>,
    eps: f64,
) -> Result<Tensor<N>> {
    check_rms_norm(&x, &gamma, eps)?;
    let dtype = x.dtype();
    let rms = (x.clone().cast(DType::F32).square().mean_dim(N - 1) + eps).sqrt(); // [.., 1]
    Ok((x / rms.cast(dtype)) * gamma.unsqueeze())
}

/// Checks the inputs of [`naive_rms_norm`] (shared with the fused entry point).
///
/// # Errors
/// As [`naive_rms_norm`].
pub fn check_rms_norm<const N: usize>(x: &Tensor<N>, gamma: &Tensor<1>, eps: f64) -> Result<()> {
    let dims = x.dims();
    if let Some(dim) = dims.iter().position(|&n| n == 0) {
        return Err(RelationError::EmptyDimension {
            name: "x",
            dim: if dim + 1 == N { 'd' } else { 'N' },
            shape: dims.to_vec(),
        });
    }
    let d = dims[N - 1];
    if gamma.dims() != [d] {
        return Err(RelationError::ShapeMismatch {
            name: "gamma",
            expected: format!("[d] = [{d}] (the last dimension of `x`)"),
            got: gamma.dims().to_vec(),
        });
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(RelationError::InvalidEpsilon { eps });
    }
    crate::check::same_device_as("gamma", gamma, "x", x)?;
    crate::check::same_dtype("gamma", gamma, "x", x)
}

/// How a dense layer stores its weight `W`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[K, M]` (inputs by outputs), the product is `x W`: Burn's `Linear`.
    InOut,
    /// `[M, K]` (outputs by inputs), the product is `x Wᵀ`: a tied embedding used as the output
    /// head (`[V, d]`).
    OutIn,
}

impl WeightLayout {
    /// `(K, M)`, inputs and outputs, of a weight of shape `dims` stored this way.
    pub fn in_out(self, [rows, cols]: [usize; 2]) -> (usize, usize) {
        match self {
            Self::InOut => (rows, cols),
            Self::OutIn => (cols, rows),
        }
    }
}

/// The dense product `x W` (or `x Wᵀ`, see [`WeightLayout`]): every projection of the model and
/// its output head.
///
/// Gradients (what a fused backward must produce), with `W` as `[K, M]` and upstream `dy`:
/// `dx = dy Wᵀ`, `dW = xᵀ dy` (for [`WeightLayout::OutIn`], `dW = dyᵀ x`).
///
/// # Shapes
/// - `x`: `[N, K]`; `w`: `[K, M]` ([`WeightLayout::InOut`]) or `[M, K]` ([`WeightLayout::OutIn`])
/// - output: `[N, M]`
///
/// # Errors
/// [`RelationError::EmptyDimension`], [`RelationError::ShapeMismatch`] when `w`'s input dimension
/// is not `K`, [`RelationError::DeviceMismatch`], [`RelationError::DTypeMismatch`].
pub fn naive_dense(x: Tensor<2>, w: Tensor<2>, layout: WeightLayout) -> Result<Tensor<2>> {
    check_dense(&x, &w, layout)?;
    Ok(match layout {
        WeightLayout::InOut => x.matmul(w),
        WeightLayout::OutIn => x.matmul(w.transpose()),
    })
}

/// Checks the inputs of [`naive_dense`] (shared with the fused entry point).
///
/// # Errors
/// As [`naive_dense`].
pub fn check_dense(x: &Tensor<2>, w: &Tensor<2>, layout: WeightLayout) -> Result<()> {
    let [n, k] = x.dims();
    if n == 0 || k == 0 {
        return Err(RelationError::EmptyDimension {
            name: "x",
            dim: if n == 0 { 'N' } else { 'K' },
            shape: vec![n, k],
        });
    }
    let (w_in, w_out) = layout.in_out(w.dims());
    if w_in != k || w_out == 0 {
        return Err(RelationError::ShapeMismatch {
            name: "w",
            expected: match layout {
                WeightLayout::InOut => format!("[K, M] with K = {k} and M > 0"),
                WeightLayout::OutIn => format!("[M, K] with K = {k} and M > 0"),
            },
            got: w.dims().to_vec(),
        });
    }
    crate::check::same_device_as("w", w, "x", x)?;
    crate::check::same_dtype("w", w, "x", x)
}

/// Negative log-likelihood of each target under its row of logits, in nats:
/// `nll_n = logsumexp_v(logits_{n,v}) - logits_{n, target_n}`.
///
/// Gradient (what a fused backward must produce): `d logits_{n,v} = d nll_n · (softmax(logits_n)_v
/// - [v = target_n])`.
///
/// # Shapes
/// - `logits`: `[N, V]` (`N` tokens, vocabulary `V`), `targets`: `[N]` token ids
/// - output: `[N]`
///
/// # Errors
/// [`RelationError::EmptyDimension`], [`RelationError::ShapeMismatch`] when `targets` is not
/// `[N]`, [`RelationError::DeviceMismatch`], [`RelationError::TargetOutOfRange`] for an id outside
/// `0..V` (checked on the host: one read-back of `N` ids).
pub fn naive_cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Result<Tensor<1>> {
    check_cross_entropy(&logits, &targets)?;
    let [n, _] = logits.dims();
    let logp = log_softmax(logits, 1); // [N, V]
    Ok(logp
        .gather(1, targets.reshape([n, 1])) // [N, 1]
        .reshape([n]) // [N]
        .neg())
}

/// Checks the inputs of a cross-entropy: shapes, devices and the range of every target id.
///
/// # Errors
/// As [`naive_cross_entropy`].
pub fn check_cross_entropy(logits: &Tensor<2>, targets: &Tensor<1, Int>) -> Result<()> {
    let [n, vocab] = logits.dims();
    if n == 0 || vocab == 0 {
        return Err(RelationError::EmptyDimension {
            name: "logits",
            dim: if n == 0 { 'N' } else { 'V' },
            shape: vec![n, vocab],
        });
    }
    if targets.dims() != [n] {
        return Err(RelationError::ShapeMismatch {
            name: "targets",
            expected: format!("[N] = [{n}]"),
            got: targets.dims().to_vec(),
        });
    }
    crate::check::same_device_as("targets", targets, "logits", logits)?;
    let ids = targets.clone().into_data().convert::<i64>();
    let ids = ids.as_slice::<i64>().expect("converted to i64");
    if let Some((index, &value)) = ids
        .iter()
        .enumerate()
        .find(|&(_, &id)| id < 0 || id as usize >= vocab)
    {
        return Err(RelationError::TargetOutOfRange {
            index,
            value,
            vocab,
        });
    }
    Ok(())
}

/// Checks that `x` has the shape, device and dtype of `reference`.
pub(crate) fn check_same<const N: usize>(
    name: &'static str,
    x: &Tensor<N>,
    reference_name: &'static str,
    reference: &Tensor<N>,
) -> Result<()> {
    let want = reference.dims();
    if x.dims() != want {
        return Err(RelationError::ShapeMismatch {
            name,
            expected: format!("the shape of `{reference_name}`, {want:?}"),
            got: x.dims().to_vec(),
        });
    }
    crate::check::same_device_as(name, x, reference_name, reference)?;
    crate::check::same_dtype(name, x, reference_name, reference)
}

/// Checks the inputs of [`naive_swiglu`] (shared with the fused entry point).
///
/// # Errors
/// As [`naive_swiglu`].
pub fn check_swiglu<const N: usize>(gate: &Tensor<N>, up: &Tensor<N>) -> Result<()> {
    check_same("up", up, "gate", gate)
}
