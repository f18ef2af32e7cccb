//! Shape and value checks shared by every entry point (and by the kernels crate).

use burn::tensor::Tensor;
use burn::tensor::kind::Basic;

use crate::error::{RelationError, Result};

/// The dimensions of one `[B, T, H, D]` problem.
///
/// `B` batch, `T` tokens, `H` heads, `D` head dimension (`d_h` in the spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bthd {
    /// Batch size `B`.
    pub batch: usize,
    /// Sequence length `T`.
    pub seq: usize,
    /// Head count `H`.
    pub heads: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
}

impl Bthd {
    /// The shape as an array in layout order.
    pub fn dims(&self) -> [usize; 4] {
        [self.batch, self.seq, self.heads, self.head_dim]
    }

    fn describe(&self) -> String {
        format!("[B, T, H, D] = {:?}", self.dims())
    }
}

/// Reads `[B, T, H, D]` from a tensor and refuses empty dimensions.
pub fn bthd(name: &'static str, x: &Tensor<4>) -> Result<Bthd> {
    let [batch, seq, heads, head_dim] = x.dims();
    for (size, letter) in [(batch, 'B'), (seq, 'T'), (heads, 'H'), (head_dim, 'D')] {
        if size == 0 {
            return Err(RelationError::EmptyDimension {
                name,
                dim: letter,
                shape: x.dims().to_vec(),
            });
        }
    }
    Ok(Bthd {
        batch,
        seq,
        heads,
        head_dim,
    })
}

/// Checks that `x` has exactly the `[B, T, H, D]` of `reference` (and lives on its device).
///
/// A difference in `D` alone is reported as [`RelationError::HeadDimMismatch`].
pub fn same_bthd(
    name: &'static str,
    x: &Tensor<4>,
    reference_name: &'static str,
    reference: &Bthd,
) -> Result<()> {
    let got = x.dims();
    let want = reference.dims();
    if got[..3] == want[..3] && got[3] != want[3] {
        return Err(RelationError::HeadDimMismatch {
            name,
            reference: reference_name,
            expected: want[3],
            got: got[3],
        });
    }
    if got != want {
        return Err(RelationError::ShapeMismatch {
            name,
            expected: reference.describe(),
            got: got.to_vec(),
        });
    }
    Ok(())
}

/// Checks an arbitrary shape, reporting it with its layout letters.
pub fn exact_shape<const N: usize>(
    name: &'static str,
    x: &Tensor<N>,
    letters: &str,
    want: [usize; N],
) -> Result<()> {
    let got = x.dims();
    if got != want {
        return Err(RelationError::ShapeMismatch {
            name,
            expected: format!("{letters} = {want:?}"),
            got: got.to_vec(),
        });
    }
    Ok(())
}

/// Checks that `x` lives on the same device as `p1`.
pub fn same_device<const N: usize>(
    name: &'static str,
    x: &Tensor<N>,
    p1: &Tensor<4>,
) -> Result<()> {
    same_device_as(name, x, "p1", p1)
}

/// Checks that `x` (float, int or bool) lives on the same device as the argument
/// `reference_name`.
pub fn same_device_as<const N: usize, const M: usize, K: Basic, L: Basic>(
    name: &'static str,
    x: &Tensor<N, K>,
    reference_name: &'static str,
    reference: &Tensor<M, L>,
) -> Result<()> {
    let (got, expected) = (x.device(), reference.device());
    if got != expected {
        return Err(RelationError::DeviceMismatch {
            name,
            reference: reference_name,
            expected: format!("{expected:?}"),
            got: format!("{got:?}"),
        });
    }
    Ok(())
}

/// Checks that the float tensor `x` has the element type of the argument `reference_name`.
pub fn same_dtype<const N: usize, const M: usize>(
    name: &'static str,
    x: &Tensor<N>,
    reference_name: &'static str,
    reference: &Tensor<M>,
) -> Result<()> {
    let (got, expected) = (x.dtype(), reference.dtype());
    if got != expected {
        return Err(RelationError::DTypeMismatch {
            name,
            reference: reference_name,
            expected: format!("{expected:?}"),
            got: format!("{got:?}"),
        });
    }
    Ok(())
}

/// Checks the Self temperature `tau_S`.
pub fn tau(tau: f64) -> Result<()> {
    if tau.is_finite() && tau > 0.0 {
        Ok(())
    } else {
        Err(RelationError::NonPositiveTau { tau })
    }
}

/// Checks the common inputs of a Relation mixer: `p1`, `p2`, `info` all `[B, T, H, D]`.
pub fn relation_inputs(
    p1: &Tensor<4>,
    p2: &Tensor<4>,
    info: &Tensor<4>,
    tau_s: f64,
) -> Result<Bthd> {
    let dims = bthd("p1", p1)?;
    same_bthd("p2", p2, "p1", &dims)?;
    same_bthd("info", info, "p1", &dims)?;
    same_device("p2", p2, p1)?;
    same_device("info", info, p1)?;
    same_dtype("p2", p2, "p1", p1)?;
    same_dtype("info", info, "p1", p1)?;
    tau(tau_s)?;
    Ok(dims)
}
