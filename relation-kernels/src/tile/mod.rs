//! What the kernels of every operation share, per backend: [`cube`] for the CubeCL kernels
//! (tiling from device limits, tile loads, state lanes, output allocation) and [`flex`] for the
//! Flex kernels (heads-first f32 tiles, the tile GEMM, vectorised element-wise maths).

#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "flex")]
pub(crate) mod flex;
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
pub(crate) mod gemm512;

#[cfg(any(feature = "flex", feature = "cube"))]
use relation_core::Segments;

/// One independent sequence of a `[B, T, H, _]` input: its first row among the `B·T` rows and
/// its length. Kernels loop over `(sequence, head)` and never look past a sequence's rows.
#[cfg(any(feature = "flex", feature = "cube"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sequence {
    /// First row, counted over the flattened `B·T` rows.
    pub start: usize,
    /// Rows.
    pub len: usize,
}

/// The sequences of a `[B, T, …]` input: `B` sequences of `T` rows, or, packed (`B = 1`), one per
/// segment.
#[cfg(any(feature = "flex", feature = "cube"))]
pub(crate) fn sequences(b: usize, t: usize, segments: Option<&Segments>) -> Vec<Sequence> {
    match segments {
        Some(segments) => segments
            .bounds()
            .map(|(start, end)| Sequence {
                start,
                len: end - start,
            })
            .collect(),
        None => (0..b)
            .map(|bi| Sequence {
                start: bi * t,
                len: t,
            })
            .collect(),
    }
}
