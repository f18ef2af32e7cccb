//! Flex tensors in and out of the kernels' f32 buffers: reading any float dtype and layout as
//! f32, the heads-first gather and its scatter, per-head transposes, and disjoint row borrows of
//! `[B, T, H, W]` outputs for the tasks that write them in place.

use std::borrow::Cow;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape, bf16, f16};

use super::buffers::output;
use crate::sequence::Sequence;

/// `[B, T, H, D]` of a rank-4 Flex tensor.
pub(crate) fn dims4(x: &FlexTensor) -> [usize; 4] {
    let s = x.layout().shape();
    [s[0], s[1], s[2], s[3]]
}

/// The elements of `x` in row-major order as f32: borrowed when `x` is already a contiguous
/// f32 tensor (the common case: no copy), converted once otherwise.
///
/// # Panics
/// On a non-float dtype (the Tensor-level entry points only pass float tensors).
pub(crate) fn f32_data(x: &FlexTensor) -> Cow<'_, [f32]> {
    const CONTIGUOUS: &str = "a contiguous tensor has a contiguous slice";
    if let Some(data) = x.as_slice::<f32>() {
        return Cow::Borrowed(data);
    }
    let x = x.to_contiguous();
    Cow::Owned(match x.dtype() {
        DType::F32 => x.as_slice::<f32>().expect(CONTIGUOUS).to_vec(),
        DType::F16 => {
            let s = x.as_slice::<f16>().expect(CONTIGUOUS);
            s.iter().map(|v| v.to_f32()).collect()
        }
        DType::BF16 => {
            let s = x.as_slice::<bf16>().expect(CONTIGUOUS);
            s.iter().map(|v| v.to_f32()).collect()
        }
        DType::F64 => {
            let s = x.as_slice::<f64>().expect(CONTIGUOUS);
            s.iter().map(|&v| v as f32).collect()
        }
        other => panic!("relation-kernels (flex): unsupported dtype {other:?}"),
    })
}

/// Calls `f` with the elements of `x` in row-major order as f32 ([`f32_data`]).
pub(crate) fn with_f32<R>(x: &FlexTensor, f: impl FnOnce(&[f32]) -> R) -> R {
    f(&f32_data(x))
}

/// The elements of `x` in row-major order, as f32.
pub(crate) fn read_f32(x: &FlexTensor) -> Vec<f32> {
    with_f32(x, <[f32]>::to_vec)
}

/// Swaps axes 1 and 2 of a row-major `[outer, a, b, d]` array: the result is `[outer, b, a, d]`.
///
/// Split over the thread pool by output slab `(o, j)` (`a` rows of `d`): a pure copy, so the
/// result does not depend on the split (serial, the other cores would wait on it).
fn swap_axes_12(src: &[f32], [_outer, a, b, d]: [usize; 4]) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = output(src.len());
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(a * d) // slab (o, j): [a, d] of the output
        .enumerate()
        .for_each(|(slab, rows)| {
            let (o, j) = (slab / b, slab % b);
            for (i, row) in rows.chunks_exact_mut(d).enumerate() {
                let from = ((o * a + i) * b + j) * d;
                row.copy_from_slice(&src[from..from + d]);
            }
        });
    out
}

/// `[B, T, H, D]` (any dtype, any layout) -> f32 `[B·H, T, D]`.
pub(crate) fn gather_heads(x: &FlexTensor) -> Vec<f32> {
    let dims = dims4(x);
    with_f32(x, |flat| swap_axes_12(flat, dims)) // [B, T, H, D] -> [B, H, T, D]
}

/// `Xᵀ` of every `(sequence, head)` of a `[B, T, H, D]` buffer: sequence `n`, head `h` becomes
/// `[D, len_n]` at offset `(start_n·H + h·len_n)·D` (heads of a sequence side by side; for `B`
/// unpacked sequences that is the `[B·H, D, T]` layout).
pub(crate) fn transpose_heads(x: &[f32], seqs: &[Sequence], h: usize, d: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = output(x.len());
    if out.is_empty() {
        return out;
    }
    // Rows are taken 16 at a time so that each of the D output rows gets 16 consecutive
    // values per block (a whole cache line) instead of one scattered store every T floats.
    // The block's rows are first copied whole into a small buffer: read in place, the 16
    // rows lie H·D apart, on a handful of L1 sets, and were reread D times, each value found
    // by a multiply and a bounds check.
    const ROWS: usize = 16;
    let mut heads: Vec<(&Sequence, usize, &mut [f32])> = Vec::with_capacity(seqs.len() * h);
    let mut rest = &mut out[..];
    for seq in seqs {
        for hi in 0..h {
            let (head, tail) = rest.split_at_mut(d * seq.len); // [D, len]
            heads.push((seq, hi, head));
            rest = tail;
        }
    }
    heads.into_par_iter().for_each(|(seq, hi, head)| {
        let t = seq.len;
        let mut block = vec![0.0f32; ROWS * d]; // [ROWS, D]: rows i0.. of this head
        for i0 in (0..t).step_by(ROWS) {
            let rows = ROWS.min(t - i0);
            for (ii, to) in block.chunks_exact_mut(d).take(rows).enumerate() {
                let from = ((seq.start + i0 + ii) * h + hi) * d;
                to.copy_from_slice(&x[from..from + d]);
            }
            // [D, t] from [rows, D]: output row c gets the block's column c.
            for (c, out_row) in head.chunks_exact_mut(t).enumerate() {
                for (ii, o) in out_row[i0..i0 + rows].iter_mut().enumerate() {
                    *o = block[ii * d + c];
                }
            }
        }
    });
    out
}

/// The rows of a `[B, T, H, W]` buffer grouped by `(sequence, head)`: `rows[n·H + h][i]` is the
/// `W` values of row `i` of sequence `n`, head `h`. The groups are disjoint borrows, so tasks of
/// the thread pool write one head of one sequence (or a block of its rows) straight into the
/// `[B, T, H, W]` output with no scatter pass.
pub(crate) fn head_rows<'a, T>(
    data: &'a mut [T],
    seqs: &[Sequence],
    h: usize,
    w: usize,
) -> Vec<Vec<&'a mut [T]>> {
    let mut rows: Vec<Vec<&mut [T]>> = seqs
        .iter()
        .flat_map(|seq| (0..h).map(|_| Vec::with_capacity(seq.len)))
        .collect();
    let mut chunks = data.chunks_exact_mut(w.max(1));
    // Sequences are in row order and cover every row: walk them in step with the rows.
    for (n, seq) in seqs.iter().enumerate() {
        for _ in 0..seq.len {
            for hi in 0..h {
                let row = chunks.next().expect("sequences cover the buffer's rows");
                rows[n * h + hi].push(row);
            }
        }
    }
    rows
}

/// f32 `[B·H, T, D]` -> `[B, T, H, D]` in `dtype`.
pub(crate) fn scatter_heads(data: &[f32], dims: [usize; 4], dtype: DType) -> FlexTensor {
    let [b, t, h, d] = dims;
    let flat = swap_axes_12(data, [b, h, t, d]); // [B, H, T, D] -> [B, T, H, D]
    tensor(flat, Shape::new(dims), dtype)
}

/// A contiguous Flex tensor holding `data` (row-major f32) converted to `dtype`.
pub(crate) fn tensor(data: Vec<f32>, shape: Shape, dtype: DType) -> FlexTensor {
    let bytes = match dtype {
        DType::F32 => Bytes::from_elems(data),
        DType::F16 => Bytes::from_elems(data.iter().map(|&v| f16::from_f32(v)).collect()),
        DType::BF16 => Bytes::from_elems(data.iter().map(|&v| bf16::from_f32(v)).collect()),
        DType::F64 => Bytes::from_elems(data.iter().map(|&v| v as f64).collect()),
        other => panic!("relation-kernels (flex): unsupported dtype {other:?}"),
    };
    FlexTensor::new(bytes, Layout::contiguous(shape), dtype)
}

/// The transpose of a row-major `[rows, cols]` array, row-major `[cols, rows]`.
///
/// Split over the thread pool by bands of `BLOCK` output rows (`BLOCK` input columns), so
/// that each input row is read `BLOCK` values at a time and the writes stay within `BLOCK`
/// output rows. A pure copy: the result does not depend on the split. [`swap_axes_12`] with
/// `d = 1` computes the same, one strided column read per output row: several times slower for
/// the wide arrays (`rows < cols`) that the dense product hands here.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    use rayon::prelude::*;
    const BLOCK: usize = 32;
    assert_eq!(src.len(), rows * cols, "transpose of a [rows, cols] array");
    let mut out = output(rows * cols);
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(BLOCK * rows) // output rows c0..c0 + BLOCK (input columns), [BLOCK, rows]
        .enumerate()
        .for_each(|(band, dst)| {
            let c0 = band * BLOCK;
            let width = dst.len() / rows; // BLOCK, or fewer in the last band
            // Input row r gives `width` consecutive reads; its writes land in the band's
            // `width` output rows at column r, so consecutive r fill the same cache lines.
            for r in 0..rows {
                let from = &src[r * cols + c0..r * cols + c0 + width];
                for (c, &v) in from.iter().enumerate() {
                    dst[c * rows + r] = v;
                }
            }
        });
    out
}
