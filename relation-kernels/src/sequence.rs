//! The independent sequences of a `[B, T, H, _]` input, batched or packed: what every kernel
//! loops over.

use relation_core::Segments;

/// One independent sequence of a `[B, T, H, _]` input: its first row among the `B·T` rows and
/// its length. Kernels loop over `(sequence, head)` and never look past a sequence's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sequence {
    /// First row, counted over the flattened `B·T` rows.
    pub start: usize,
    /// Rows.
    pub len: usize,
}

/// The sequences of a `[B, T, …]` input: `B` sequences of `T` rows, or, packed (`B = 1`), one per
/// segment.
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
