//! Several new rows against a cache on Flex: the fused forward's tasks (`flex.rs`) with their
//! queries taken from the new rows and their keys from the cache's filled rows.
//!
//! Sequence `b`'s `n` new rows sit at positions `len_b - n .. len_b`; each task owns up to
//! `BLOCK_Q` of them and streams the key tiles `0 .. i1` of its sequence, as the causal forward
//! does for its own last rows. Where `len_b - n` is a multiple of the tile width (a prompt
//! prefilled from an empty cache, or in chunks of a multiple of 64), the tiles line up with the
//! rows and the diagonal tiles skip their upper half, as in training; elsewhere every tile is
//! computed whole and the rows mask what they must not see. The filled rows are first copied
//! back to back in f32 (`[Σ len, H, D]`, the layout of a packed call; f16/bf16 caches widened
//! on the way) and their `P2ᵀ` per head taken from that copy: one pass over the cache per call,
//! against `n` rows' products with it.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape, bf16, f16};

use super::STATS;
use super::flex::{Head, Scalars, first_row, run_tasks};
use crate::decode::DecodeParams;
use crate::flex::{Uninit, dims4, f32_data, read_f32, tensor, transpose_heads};
use crate::sequence::{Sequence, sequences};

/// The output rows of the new rows `p1` against the cache buffers `p2`, `info` (see the module
/// docs and [`crate::flash_relation_decode`]).
///
/// # Shapes
/// - `p1`: `[B, n, H, D]` with `n <= lens[b]`; `p2`, `info`: `[B, C, H, D]` (f32, f16, bf16);
///   `lambda`: `[1]`; output `[B, n, H, D]` in `p1`'s dtype
pub(crate) fn rows(
    p1: FlexTensor,
    p2: FlexTensor,
    info: FlexTensor,
    lambda: FlexTensor,
    params: &DecodeParams,
) -> FlexTensor {
    let dims = dims4(&p1);
    let [b, n, h, d] = dims;
    let c = dims4(&p2)[1];
    let dtype = p1.dtype();
    let lambda = read_f32(&lambda)[0];
    let q = f32_data(&p1); // [B, n, H, D]
    let lens = &params.lens;
    let (k, v) = (filled(&p2, c, lens, h * d), filled(&info, c, lens, h * d)); // [Σ len, H, D]
    let keys: Vec<Sequence> = lens
        .iter()
        .scan(0, |start, &len| {
            *start += len;
            Some(Sequence {
                start: *start - len,
                len,
            })
        })
        .collect();
    let queries = sequences(b, n, None);
    let kt = transpose_heads(&k, &keys, h, d); // per (sequence, head): [D, len]

    let mut y = Uninit::new(b * n * h * d); // [B, n, H, D]
    // The tasks' accumulators and statistics, which this call does not return.
    let mut ibar = Uninit::new(b * n * h * d);
    let mut stats = Uninit::new(b * n * h * STATS);
    let scalars = Scalars {
        lambda,
        scale: params.scale,
        inv_tau: params.inv_tau,
        mixer: params.mixer,
    };
    run_tasks(
        [y.room(), ibar.room(), stats.room()],
        &queries,
        [h, d],
        scalars,
        |bh| {
            let (bi, hi) = (bh / h, bh % h);
            let q0 = lens[bi] - n;
            let head = Head::new(keys[bi], hi, h, [&k, &k, &v, &kt], d)
                .with_queries(&q[first_row(queries[bi], hi, h) * d..], q0);
            (head, q0)
        },
    );
    // SAFETY: `run_tasks` wrote every value of `y`.
    #[allow(unsafe_code)]
    let y = unsafe { y.assume_init() };
    tensor(y, Shape::new(dims), dtype)
}

/// The first `lens[b]` rows of each sequence of a `[B, C, H, D]` cache buffer (`row` values
/// per position), back to back in f32.
fn filled(x: &FlexTensor, c: usize, lens: &[usize], row: usize) -> Vec<f32> {
    let total: usize = lens.iter().sum();
    let ranges = || {
        lens.iter()
            .enumerate()
            .map(move |(bi, &len)| bi * c * row..(bi * c + len) * row)
    };
    let mut out = Vec::with_capacity(total * row);
    match x.dtype() {
        DType::F16 if x.as_slice::<f16>().is_some() => {
            let all = x.as_slice::<f16>().expect("checked");
            out.resize(total * row, 0.0);
            let mut at = 0;
            for range in ranges() {
                let len = range.len();
                crate::decode::widen_f16(&all[range], &mut out[at..at + len]);
                at += len;
            }
        }
        DType::BF16 if x.as_slice::<bf16>().is_some() => {
            let all = x.as_slice::<bf16>().expect("checked");
            for range in ranges() {
                // bf16 is f32's upper half.
                out.extend(
                    all[range]
                        .iter()
                        .map(|s| f32::from_bits(u32::from(s.to_bits()) << 16)),
                );
            }
        }
        _ => {
            let all = f32_data(x);
            for range in ranges() {
                out.extend_from_slice(&all[range]);
            }
        }
    }
    out
}
