//! Givens head mixing (`docs/maths.md#5-multi-head-relation-and-givens-mixing`): rotate pairs of information heads before transport.
//!
//! ```text
//! [Ĩ_a]   [cos θ  -sin θ] [I_a]
//! [Ĩ_b] = [sin θ   cos θ] [I_b]        (the same θ for every channel of the pair)
//! ```
//!
//! Pairings alternate with the layer index (zero-based heads, H = 8 shown):
//! pairing A `(0,1) (2,3) (4,5) (6,7)` on layers 0, 2, 4, …; pairing B `(1,2) (3,4) (5,6) (7,0)`
//! on layers 1, 3, 5, …. Over depth every head reaches every other head. H must be even; a
//! layer has H/2 angles, angle `m` rotating the `m`-th pair in the order listed.
//!
//! # Shapes
//! - `info`: `[B, T, H, D]`, `angles`: `[H / 2]`, output: `[B, T, H, D]`

use burn::tensor::Tensor;

use crate::check;
use crate::error::{RelationError, Result};

/// Which heads a Givens layer pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum GivensPairing {
    /// `(0,1), (2,3), …, (H-2, H-1)`: even layers.
    A,
    /// `(1,2), (3,4), …, (H-1, 0)`: odd layers.
    B,
}

impl GivensPairing {
    /// The pairing used by layer `layer` (zero-based): A on even layers, B on odd ones.
    pub fn for_layer(layer: usize) -> Self {
        if layer.is_multiple_of(2) {
            Self::A
        } else {
            Self::B
        }
    }

    /// The `(a, b)` head pairs, zero-based, in angle order.
    ///
    /// # Errors
    /// [`RelationError::OddHeads`] if `heads` is odd (or zero).
    pub fn pairs(self, heads: usize) -> Result<Vec<(usize, usize)>> {
        check_heads(heads)?;
        let shift = match self {
            Self::A => 0,
            Self::B => 1,
        };
        Ok((0..heads / 2)
            .map(|m| ((2 * m + shift) % heads, (2 * m + 1 + shift) % heads))
            .collect())
    }
}

fn check_heads(heads: usize) -> Result<()> {
    if heads == 0 || heads % 2 == 1 {
        Err(RelationError::OddHeads { heads })
    } else {
        Ok(())
    }
}

/// Mixes information heads with the Givens rotations of layer `layer` (`docs/maths.md#5-multi-head-relation-and-givens-mixing`).
///
/// # Shapes
/// - `info`: `[B, T, H, D]`
/// - `angles`: `[H / 2]`, angle `m` for pair `m` of [`GivensPairing::pairs`]
/// - output: `[B, T, H, D]`
///
/// # Errors
/// Odd or zero `H`, wrong angle count, empty dimensions.
pub fn givens_mix(info: Tensor<4>, angles: Tensor<1>, layer: usize) -> Result<Tensor<4>> {
    let dims = check::bthd("info", &info)?;
    let [b, t, h, d] = dims.dims();
    check_heads(h)?;
    let [count] = angles.dims();
    if count != h / 2 {
        return Err(RelationError::AngleCount {
            heads: h,
            expected: h / 2,
            got: count,
        });
    }
    check::same_device_as("angles", &angles, "info", &info)?;

    // Pairing B is pairing A on the heads rolled by one: rolled head r is head (r + 1) mod H,
    // so rolled pairs (0,1), …, (H-2, H-1) are heads (1,2), …, (H-1, 0).
    let pairing = GivensPairing::for_layer(layer);
    let rolled = match pairing {
        GivensPairing::A => info,
        GivensPairing::B => Tensor::cat(
            vec![info.clone().narrow(2, 1, h - 1), info.narrow(2, 0, 1)],
            2,
        ),
    };
    let paired = rolled.reshape([b, t, h / 2, 2, d]); // [B, T, H/2, (a, b), D]
    let first = paired.clone().narrow(3, 0, 1); // I_a, [B, T, H/2, 1, D]
    let second = paired.narrow(3, 1, 1); // I_b, [B, T, H/2, 1, D]
    let angles = angles.cast(first.dtype()).reshape([1, 1, h / 2, 1, 1]);
    let (cos, sin) = (angles.clone().cos(), angles.sin());
    let mixed_a = first.clone() * cos.clone() - second.clone() * sin.clone();
    let mixed_b = first * sin + second * cos;
    let mixed = Tensor::cat(vec![mixed_a, mixed_b], 3).reshape([b, t, h, d]); // [B, T, H, D]
    Ok(match pairing {
        GivensPairing::A => mixed,
        // Undo the roll: head 0 is the last rolled head.
        GivensPairing::B => Tensor::cat(
            vec![mixed.clone().narrow(2, h - 1, 1), mixed.narrow(2, 0, h - 1)],
            2,
        ),
    })
}
