//! Packed variable-length sequences: many documents in one row, kept apart.
//!
//! A packed batch holds `N` segments (documents) back to back in one `[1, total, H, D]` tensor.
//! `cu_seqlens` are their cumulative offsets, `[N + 1]` values `0 = c_0 < c_1 < … < c_N = total`,
//! as FlashAttention's `cu_seqlens_q/k` and flash-linear-attention's `cu_seqlens` define them:
//! segment `n` is rows `c_n .. c_{n+1}`.
//!
//! Every operation of this workspace computes each segment **as if it were alone**: local
//! positions restart at 0 (the RoPE angle and the count-calibration index `i` of
//! `− λ log i`), the first row of every segment is pure Self, no row reads another segment, and
//! Linear Relation starts every segment from its own initial state and returns one final state
//! per segment. See `docs/maths.md`, "Packed sequences".
//!
//! [`Segments`] is the validated host copy of `cu_seqlens`: checked once, then shared (`Arc`) by
//! every layer of a forward pass and read by the kernels without touching the device.

use std::sync::Arc;

use burn::tensor::{DType, Int, Tensor};

use crate::error::{RelationError, Result};

/// Validated segment boundaries (`cu_seqlens`) of a packed sequence: `[N + 1]` offsets, strictly
/// increasing from `0` to `total`.
///
/// Cheap to clone (the offsets are shared).
///
/// ```
/// use relation_core::Segments;
///
/// let segments = Segments::new(&[0, 3, 4, 9], 9)?;
/// assert_eq!(segments.count(), 3);
/// assert_eq!(segments.bounds().collect::<Vec<_>>(), [(0, 3), (3, 4), (4, 9)]);
/// assert_eq!(segments.max_len(), 5);
/// assert_eq!(segments.local_positions(), [0, 1, 2, 0, 0, 1, 2, 3, 4]);
/// // Not increasing, or not ending at `total`: a typed error naming the value.
/// assert!(Segments::new(&[0, 3, 3, 9], 9).is_err());
/// assert!(Segments::new(&[0, 3, 8], 9).is_err());
/// # Ok::<(), relation_core::RelationError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Segments {
    offsets: Arc<[usize]>,
}

impl Segments {
    /// Checks `cu_seqlens` against the packed length `total`.
    ///
    /// # Errors
    /// [`RelationError::InvalidSegments`] when `cu_seqlens` has fewer than two values, does not
    /// start at 0, is not strictly increasing (an empty segment), or does not end at `total`.
    pub fn new(cu_seqlens: &[usize], total: usize) -> Result<Self> {
        let invalid = |reason: String| RelationError::InvalidSegments {
            reason,
            total,
            len: cu_seqlens.len(),
        };
        match cu_seqlens {
            [] | [_] => {
                return Err(invalid(format!(
                    "needs at least two offsets [0, …, total], got {cu_seqlens:?}"
                )));
            }
            [first, ..] if *first != 0 => {
                return Err(invalid(format!("must start at 0, starts at {first}")));
            }
            _ => {}
        }
        if let Some(n) = cu_seqlens.windows(2).position(|w| w[1] <= w[0]) {
            return Err(invalid(format!(
                "must be strictly increasing (no empty segment), but cu_seqlens[{}] = {} <= cu_seqlens[{n}] = {}",
                n + 1,
                cu_seqlens[n + 1],
                cu_seqlens[n]
            )));
        }
        let last = cu_seqlens[cu_seqlens.len() - 1];
        if last != total {
            return Err(invalid(format!(
                "must end at the packed length {total}, ends at {last}"
            )));
        }
        Ok(Self {
            offsets: cu_seqlens.into(),
        })
    }

    /// [`Segments::new`] from `i32`/`i64` offsets as other libraries store them (negative values
    /// are refused like any other malformed offset).
    ///
    /// # Errors
    /// As [`Segments::new`]; a negative offset is [`RelationError::InvalidSegments`] too.
    pub fn from_i64(cu_seqlens: &[i64], total: usize) -> Result<Self> {
        let offsets = cu_seqlens
            .iter()
            .enumerate()
            .map(|(n, &c)| {
                usize::try_from(c).map_err(|_| RelationError::InvalidSegments {
                    reason: format!("cu_seqlens[{n}] = {c} is negative"),
                    total,
                    len: cu_seqlens.len(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(&offsets, total)
    }

    /// [`Segments::new`] from a device tensor `[N + 1]` of integers (read back to the host once:
    /// prefer the host constructors in a hot loop). `like` is the packed input whose device the
    /// offsets must share.
    ///
    /// # Errors
    /// As [`Segments::new`]; a tensor on another device than `like` is
    /// [`RelationError::DeviceMismatch`].
    pub fn from_tensor<const N: usize>(
        cu_seqlens: &Tensor<1, Int>,
        like: &Tensor<N>,
        total: usize,
    ) -> Result<Self> {
        crate::check::same_device_as("cu_seqlens", cu_seqlens, "the packed input", like)?;
        let data = cu_seqlens.to_data();
        let values: Vec<i64> = match data.dtype() {
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U64 | DType::U32 => data
                .try_to_vec_as::<i64>()
                .map_err(|e| RelationError::InvalidSegments {
                    reason: format!("cannot read the offsets: {e:?}"),
                    total,
                    len: cu_seqlens.dims()[0],
                })?,
            other => {
                return Err(RelationError::InvalidSegments {
                    reason: format!("offsets must be integers, got dtype {other:?}"),
                    total,
                    len: cu_seqlens.dims()[0],
                });
            }
        };
        Self::from_i64(&values, total)
    }

    /// One segment covering `total` rows (the unpacked case).
    ///
    /// # Errors
    /// [`RelationError::InvalidSegments`] when `total` is 0.
    pub fn whole(total: usize) -> Result<Self> {
        Self::new(&[0, total], total)
    }

    /// Segments from their lengths (each at least 1).
    ///
    /// # Errors
    /// [`RelationError::InvalidSegments`] when `lengths` is empty or holds a 0.
    pub fn from_lengths(lengths: &[usize]) -> Result<Self> {
        let mut offsets = Vec::with_capacity(lengths.len() + 1);
        offsets.push(0);
        for &len in lengths {
            offsets.push(offsets[offsets.len() - 1] + len);
        }
        let total = offsets[offsets.len() - 1];
        Self::new(&offsets, total)
    }

    /// The offsets `[0, …, total]` (`cu_seqlens`).
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Number of segments `N`.
    pub fn count(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Packed length `total`.
    pub fn total(&self) -> usize {
        self.offsets[self.offsets.len() - 1]
    }

    /// `(start, end)` of every segment, in order.
    pub fn bounds(&self) -> impl ExactSizeIterator<Item = (usize, usize)> + '_ {
        self.offsets.windows(2).map(|w| (w[0], w[1]))
    }

    /// Length of every segment.
    pub fn lengths(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.bounds().map(|(s, e)| e - s)
    }

    /// The longest segment.
    pub fn max_len(&self) -> usize {
        self.lengths().max().unwrap_or(0)
    }

    /// The position of every row inside its own segment (`0` at each segment start): what RoPE
    /// and the count calibration see.
    pub fn local_positions(&self) -> Vec<usize> {
        self.bounds().flat_map(|(s, e)| 0..e - s).collect()
    }

    /// Checks that these segments cover the `T = dim 1` rows of a packed `[1, T, …]` input.
    ///
    /// # Errors
    /// [`RelationError::ShapeMismatch`] when the batch is not 1 (packed inputs have one row) and
    /// [`RelationError::InvalidSegments`] when `total` differs from `T`.
    pub fn check_packed(&self, name: &'static str, shape: &[usize]) -> Result<()> {
        if shape.first() != Some(&1) {
            return Err(RelationError::ShapeMismatch {
                name,
                expected: format!("[1, total, …] (packed: batch 1), total = {}", self.total()),
                got: shape.to_vec(),
            });
        }
        let t = shape.get(1).copied().unwrap_or(0);
        if t != self.total() {
            return Err(RelationError::InvalidSegments {
                reason: format!(
                    "`{name}` packs {t} rows but the offsets end at {}",
                    self.total()
                ),
                total: t,
                len: self.offsets.len(),
            });
        }
        Ok(())
    }
}
