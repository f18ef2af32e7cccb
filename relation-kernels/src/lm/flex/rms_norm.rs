//! RMSNorm on Flex: one pass forward, one backward, `dγ` summed in a fixed order.

use std::mem::MaybeUninit;

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use crate::flex::{MulAdd, Uninit, Vectorized, output, tensor, vectorized, with_f32};

/// Rows per parallel task of RMSNorm: fixed, so the `dγ` partial sums (one per task, added in
/// task order) are the same for any thread count.
const RMS_ROWS_PER_TASK: usize = 64;

/// RMSNorm forward: `(y, r)` with `y = (x / rms) ⊙ γ` in `x`'s dtype and `r = 1 / rms` per row
/// (`[rows]`, f32), `rms = sqrt(mean(x²) + eps)`. `x` is `[.., d]`, taken as `[rows, d]`.
pub(crate) fn rms_norm_fwd(x: FlexTensor, gamma: FlexTensor, eps: f64) -> (FlexTensor, FlexTensor) {
    let shape = x.layout().shape().clone();
    let dtype = x.dtype();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d;
    let (mut y, mut r) = (Uninit::new(rows * d), Uninit::new(rows));
    with_f32(&x, |x| {
        with_f32(&gamma, |gamma| {
            // Every row written needs a whole row of x and one γ per column.
            assert_eq!(
                (x.len(), gamma.len()),
                (rows * d, d),
                "RMSNorm input shapes"
            );
            y.room()
                .par_chunks_mut(RMS_ROWS_PER_TASK * d)
                .zip(r.room().par_chunks_mut(RMS_ROWS_PER_TASK))
                .zip(x.par_chunks(RMS_ROWS_PER_TASK * d))
                .for_each(|((y, r), x)| {
                    vectorized(RmsNormFwd {
                        y,
                        r,
                        x,
                        gamma,
                        eps: eps as f32,
                    })
                });
        })
    });
    // SAFETY: the tasks cover `y` and `r` whole (`x` is as long as `y`, one `r` per row of it),
    // and each writes all of its rows and their `r`.
    #[allow(unsafe_code)]
    let (y, r) = unsafe { (y.assume_init(), r.assume_init()) };
    (
        tensor(y, shape, dtype),
        tensor(r, Shape::new([rows]), DType::F32),
    )
}

/// Sum of squares of a row, in eight interleaved partial sums (vectorisable; the order is
/// fixed, so the result is too).
#[inline(always)]
fn sum_of_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&v| v * v).sum();
    acc.iter().sum::<f32>() + tail
}

/// Sum of `a ⊙ b` over a row, in the same fixed order as [`sum_of_squares`].
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&p, &q)| p * q)
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// Rows of the RMSNorm forward.
struct RmsNormFwd<'a> {
    y: &'a mut [MaybeUninit<f32>],
    r: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    gamma: &'a [f32],
    eps: f32,
}

impl Vectorized for RmsNormFwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Self::Output {
        let Self {
            y,
            r,
            x,
            gamma,
            eps,
        } = self;
        let d = gamma.len();
        for ((y, r), x) in y
            .chunks_exact_mut(d)
            .zip(r.iter_mut())
            .zip(x.chunks_exact(d))
        {
            let rms = (sum_of_squares(x) / d as f32 + eps).sqrt();
            r.write(1.0 / rms);
            for ((y, &x), &g) in y.iter_mut().zip(x).zip(gamma) {
                y.write((x / rms) * g);
            }
        }
    }
}

/// RMSNorm backward: `(dx, dγ)` from `x`, `γ`, the saved `r` and `dy`, in `x`'s dtype.
///
/// ```text
/// x̂ = x r,  g = dy ⊙ γ,  dx = r (g - x̂ mean(g ⊙ x̂)),  dγ = Σ_rows dy ⊙ x̂
/// ```
pub(crate) fn rms_norm_bwd(
    x: FlexTensor,
    gamma: FlexTensor,
    r: FlexTensor,
    dy: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    let shape = x.layout().shape().clone();
    let dtype = x.dtype();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d;
    let tasks = rows.div_ceil(RMS_ROWS_PER_TASK);
    // One dγ partial per task, [tasks, d], summed in task order below.
    let mut partial = output(tasks * d);
    let mut dx = Uninit::new(rows * d);
    with_f32(&x, |x| {
        with_f32(&gamma, |gamma| {
            with_f32(&r, |r| {
                with_f32(&dy, |dy| {
                    // Every row written needs whole rows of x and dy, its r, and one γ per
                    // column.
                    assert_eq!(
                        (x.len(), dy.len(), r.len(), gamma.len()),
                        (rows * d, rows * d, rows, d),
                        "RMSNorm backward input shapes"
                    );
                    dx.room()
                        .par_chunks_mut(RMS_ROWS_PER_TASK * d)
                        .zip(partial.par_chunks_mut(d))
                        .zip(x.par_chunks(RMS_ROWS_PER_TASK * d))
                        .zip(dy.par_chunks(RMS_ROWS_PER_TASK * d))
                        .zip(r.par_chunks(RMS_ROWS_PER_TASK))
                        .for_each(|((((dx, dgamma), x), dy), r)| {
                            vectorized(RmsNormBwd {
                                dx,
                                dgamma,
                                x,
                                dy,
                                r,
                                gamma,
                            })
                        });
                })
            })
        })
    });
    // SAFETY: the tasks cover `dx` whole (`x` is as long), and each writes all of its rows.
    #[allow(unsafe_code)]
    let dx = unsafe { dx.assume_init() };
    let mut dgamma = vec![0.0f32; d];
    for p in partial.chunks_exact(d) {
        for (s, &v) in dgamma.iter_mut().zip(p) {
            *s += v;
        }
    }
    (
        tensor(dx, shape, dtype),
        tensor(dgamma, Shape::new([d]), gamma.dtype()),
    )
}

/// Rows of the RMSNorm backward; `dgamma` receives this run's `Σ dy ⊙ x̂`.
struct RmsNormBwd<'a> {
    dx: &'a mut [MaybeUninit<f32>],
    dgamma: &'a mut [f32],
    x: &'a [f32],
    dy: &'a [f32],
    r: &'a [f32],
    gamma: &'a [f32],
}

impl Vectorized for RmsNormBwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Self::Output {
        let Self {
            dx,
            dgamma,
            x,
            dy,
            r,
            gamma,
        } = self;
        let d = gamma.len();
        dgamma.fill(0.0);
        let mut g = vec![0.0f32; d];
        let mut xhat = vec![0.0f32; d];
        let rows = dx
            .chunks_exact_mut(d)
            .zip(x.chunks_exact(d))
            .zip(dy.chunks_exact(d));
        for (((dx, x), dy), &r) in rows.zip(r) {
            for ((((g, xhat), &x), &dy), &gamma) in
                g.iter_mut().zip(xhat.iter_mut()).zip(x).zip(dy).zip(gamma)
            {
                *xhat = x * r;
                *g = dy * gamma;
            }
            let c = dot(&g, &xhat) / d as f32;
            for (((dx, &g), &xhat), (dgamma, &dy)) in dx
                .iter_mut()
                .zip(&g)
                .zip(&xhat)
                .zip(dgamma.iter_mut().zip(dy))
            {
                dx.write(r * (g - xhat * c));
                *dgamma += dy * xhat;
            }
        }
    }
}
