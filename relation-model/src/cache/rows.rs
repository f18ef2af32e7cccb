//! The two per-token buffers of a Full Relation or attention layer's cache ([`CachedPair`]):
//! appending a token's rows in place, growing the buffers, and moving kept rows down when
//! sequences leave ([`compact`]).

use burn::tensor::{DType, IndexingUpdateOp, Int, Tensor, TensorData};

/// Two per-token buffers cached side by side (`P2` and `Ĩ`, or `K` and `V`): rows `0..lens[b]`
/// of sequence `b` of `[B, C, H, D]` each, `C >= lens[b]`.
#[derive(Debug, Clone)]
pub(crate) struct CachedPair {
    /// `P2` or `K`.
    pub a: Tensor<4>,
    /// `Ĩ` or `V`.
    pub b: Tensor<4>,
    /// Filled rows per sequence.
    pub lens: Vec<usize>,
}

impl CachedPair {
    /// The rows up to the longest sequence's length, `[B, max len, H, D]` each (views of the
    /// buffers; a shorter sequence's rows past its length are not its own: mask them).
    pub(crate) fn filled(&self) -> (Tensor<4>, Tensor<4>) {
        let len = self.lens.iter().copied().max().unwrap_or(0);
        (
            self.a.clone().narrow(1, 0, len),
            self.b.clone().narrow(1, 0, len),
        )
    }

    /// [`filled`](Self::filled) in `dtype` (the compute dtype, for a cache kept in another).
    pub(crate) fn filled_as(&self, dtype: DType) -> (Tensor<4>, Tensor<4>) {
        let (a, b) = self.filled();
        if a.dtype() == dtype {
            (a, b)
        } else {
            (a.cast(dtype), b.cast(dtype))
        }
    }

    /// `new` (`[B, n, H, D]` each) written into rows `len..len + n`, the buffers grown first
    /// when they are full (to an eighth more than needed, at least 64 rows: an append costs a
    /// bounded number of row copies on average, and the spare room stays small at long
    /// contexts). The write is in place when the buffers are held by this value alone (the cache
    /// hands them over for the append), so a token costs its own rows.
    ///
    /// Sequences of different lengths (a ragged batch) each get their token at their own row,
    /// one write per sequence; the caller passes one token per sequence then.
    pub(super) fn push(self, a_new: Tensor<4>, b_new: Tensor<4>) -> Self {
        let [batch, n, heads, d] = a_new.dims();
        // New rows take the buffers' dtype (a cache kept in half precision).
        let (a_new, b_new) = if a_new.dtype() == self.a.dtype() {
            (a_new, b_new)
        } else {
            (a_new.cast(self.a.dtype()), b_new.cast(self.b.dtype()))
        };
        let capacity = self.a.dims()[1];
        let longest = self.lens.iter().copied().max().unwrap_or(0);
        let len = longest + n;
        let grow = |t: Tensor<4>| {
            if len <= capacity {
                return t;
            }
            let spare = len + (len / 8).max(64) - capacity;
            let zeros = Tensor::zeros([batch, spare, heads, d], (&t.device(), t.dtype()));
            Tensor::cat(vec![t, zeros], 1) // [B, C', H, D]
        };
        let lens = self.lens.iter().map(|&l| l + n).collect();
        if !self.lens.iter().any(|&l| l != longest) {
            let rows = [0..batch, longest..len, 0..heads, 0..d];
            return Self {
                a: grow(self.a).slice_assign(rows.clone(), a_new),
                b: grow(self.b).slice_assign(rows, b_new),
                lens,
            };
        }
        // Ragged: token `t` of sequence `r` goes to row `lens[r] + t` of that sequence. One
        // indexed write per buffer, viewed as `[B·C, H·D]` (row `r·C + lens[r] + t`), rather
        // than one write per sequence.
        let (a, b) = (grow(self.a), grow(self.b));
        let c = a.dims()[1];
        let at: Vec<i64> = self
            .lens
            .iter()
            .enumerate()
            .flat_map(|(row, &at)| (0..n).map(move |t| (row * c + at + t) as i64))
            .collect();
        let at = Tensor::<1, Int>::from_data(TensorData::new(at, [batch * n]), &a.device());
        let write = |buffer: Tensor<4>, new: Tensor<4>| {
            buffer
                .reshape([batch * c, heads * d]) // [B, C, H, D] -> [B·C, H·D]
                .select_assign(
                    0,
                    at.clone(),
                    new.reshape([batch * n, heads * d]), // [B, n, H, D] -> [B·n, H·D]
                    IndexingUpdateOp::Assign,
                )
                .reshape([batch, c, heads, d])
        };
        Self {
            a: write(a, a_new),
            b: write(b, b_new),
            lens,
        }
    }
}

/// Rows `keep` (increasing) of `t` along the batch dimension, moved down in place: row
/// `keep[j]` is copied to row `j` (ascending, so a row is read before it is overwritten), then
/// `t` is narrowed to the first `keep.len()` rows.
///
/// # Shapes
/// - `t`: `[B, C, H, D]`, output: `[keep.len(), C, H, D]`
pub(super) fn compact(mut t: Tensor<4>, keep: &[usize]) -> Tensor<4> {
    let [_, c, h, d] = t.dims();
    for (j, &k) in keep.iter().enumerate() {
        if j != k {
            // A copy of the row, so that `t` is held once when it is written.
            let row = t.clone().narrow(0, k, 1).mul_scalar(1.0); // [1, C, H, D]
            t = t.slice_assign([j..j + 1, 0..c, 0..h, 0..d], row);
        }
    }
    t.narrow(0, 0, keep.len())
}
