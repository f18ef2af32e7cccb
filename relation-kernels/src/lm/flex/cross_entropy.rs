//! The per-token cross-entropy on Flex: one pass per row forward, one backward.

use std::mem::MaybeUninit;

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use crate::flex::{MulAdd, Uninit, Vectorized, exp, max_of, output, tensor, vectorized, with_f32};

use super::{ELEMS_PER_TASK, dims2, read_ids};

/// Rows per parallel task of the cross-entropy (each row is `V` elements).
fn rows_per_task(vocab: usize) -> usize {
    (ELEMS_PER_TASK / vocab.max(1)).max(1)
}

/// `(nll, lse)`, `[N]` each: `nll` in the logits' dtype, `lse` in f32.
pub(crate) fn cross_entropy_fwd(
    logits: FlexTensor,
    targets: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    let [n, v] = dims2(&logits);
    let dtype = logits.dtype();
    let ids = read_ids(&targets);
    let (mut nll, mut lse) = (output(n), output(n));
    let rows = rows_per_task(v);
    with_f32(&logits, |x| {
        // [N, V]
        nll.par_chunks_mut(rows)
            .zip(lse.par_chunks_mut(rows))
            .zip(x.par_chunks(rows * v))
            .zip(ids.par_chunks(rows))
            .for_each(|(((nll, lse), x), ids)| {
                vectorized(CrossEntropyFwd {
                    nll,
                    lse,
                    x,
                    ids,
                    v,
                });
            });
    });
    (
        tensor(nll, Shape::new([n]), dtype),
        tensor(lse, Shape::new([n]), DType::F32),
    )
}

/// `sum_v e^{x_v - m}`, in [`crate::flex::LANES`] partial sums (fixed order: deterministic).
#[inline(always)]
fn sum_exp<M: MulAdd>(x: &[f32], m: f32) -> f32 {
    use crate::flex::LANES;
    let mut lanes = [0.0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += exp::<M>(x - m);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&x| exp::<M>(x - m)).sum();
    lanes.iter().sum::<f32>() + tail
}

/// `d logits = d_nll (e^{logits - lse} - onehot(targets))`, `[N, V]` in the logits' dtype.
pub(crate) fn cross_entropy_bwd(
    logits: FlexTensor,
    targets: FlexTensor,
    lse: FlexTensor,
    d_nll: FlexTensor,
) -> FlexTensor {
    let [n, v] = dims2(&logits);
    let dtype = logits.dtype();
    let ids = read_ids(&targets);
    let rows = rows_per_task(v);
    let mut dx = Uninit::new(n * v);
    with_f32(&logits, |x| {
        with_f32(&lse, |lse| {
            with_f32(&d_nll, |d| {
                // Every row written needs its logits, `L`, `d` and target.
                assert_eq!(
                    (lse.len(), d.len(), ids.len()),
                    (n, n, n),
                    "cross-entropy backward input shapes"
                );
                dx.room()
                    .par_chunks_mut(rows * v)
                    .zip(x.par_chunks(rows * v))
                    .zip(lse.par_chunks(rows).zip(d.par_chunks(rows)))
                    .zip(ids.par_chunks(rows))
                    .for_each(|(((dx, x), (lse, d)), ids)| {
                        vectorized(CrossEntropyBwd {
                            dx,
                            x,
                            lse,
                            d,
                            ids,
                            v,
                        });
                    });
            })
        })
    });
    // SAFETY: the tasks cover `dx` whole (the logits are as long) and write every element.
    #[allow(unsafe_code)]
    let dx = unsafe { dx.assume_init() };
    tensor(dx, Shape::new([n, v]), dtype)
}

/// `(nll, lse)` of a block of rows (`x`: rows of `v` logits).
struct CrossEntropyFwd<'a> {
    nll: &'a mut [f32],
    lse: &'a mut [f32],
    x: &'a [f32],
    ids: &'a [usize],
    v: usize,
}

impl Vectorized for CrossEntropyFwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let Self {
            nll,
            lse,
            x,
            ids,
            v,
        } = self;
        for (((nll, lse), x), &id) in nll.iter_mut().zip(lse.iter_mut()).zip(x.chunks(v)).zip(ids) {
            let m = max_of(x, f32::NEG_INFINITY);
            let sum = sum_exp::<M>(x, m);
            let l = m + sum.ln();
            *lse = l;
            *nll = l - x[id];
        }
    }
}

/// `d logits` of a block of rows.
struct CrossEntropyBwd<'a> {
    dx: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    lse: &'a [f32],
    d: &'a [f32],
    ids: &'a [usize],
    v: usize,
}

impl Vectorized for CrossEntropyBwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let Self {
            dx,
            x,
            lse,
            d,
            ids,
            v,
        } = self;
        for ((((dx, x), &l), &d), &id) in dx.chunks_mut(v).zip(x.chunks(v)).zip(lse).zip(d).zip(ids)
        {
            for (dx, &x) in dx.iter_mut().zip(x) {
                dx.write(d * exp::<M>(x - l));
            }
            // The target's entry again, minus `d` (the same value as subtracting in place).
            dx[id].write(d * exp::<M>(x[id] - l) - d);
        }
    }
}
