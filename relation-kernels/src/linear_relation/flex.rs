//! Linear Relation on Flex: forward and exact backward of `docs/maths.md#6-linear-relation` on the CPU, over the prepared
//! vectors of the Tensor-level entry points (`q = S p̂1`, `k = S p̂2`, `v = Ĩ`, `g = log alpha`):
//!
//! ```text
//! C_t^- = Diag(e^{g_t}) C_{t-1};   E_t = (C_t^-)ᵀ q_t;   y_t = v_t + E_t;   C_t = C_t^- + k_t v_tᵀ
//! ```
//!
//! # Why a scan, not the chunked (GLA) form, on the CPU
//!
//! On a GPU the chunk form exists to feed matrix units. On a CPU core the `D x D` state of one
//! head (9 KiB at `D = 48`) lives in L1, and one token costs one pass over it: three fused
//! multiply-adds per state element (decay, read, write), vectorised across the value channels.
//! The chunk form would instead pay `L^2 D` pairwise decays `e^{b_t - b_j}` per chunk (they
//! cannot be factored without overflow under strong gates) on top of the same `L D^2` state
//! products. So every [`LinearRelationMode`] runs this scan on Flex; the result does not depend
//! on the chunk size (beyond the reference's rounding).
//! Heads `(b, h)` are independent tasks on the thread pool, each owning its output slice, so the
//! bits do not depend on the thread count.
//!
//! # Backward
//!
//! Per head, in reverse time with `dC = ∂L/∂C_t` (from the final state's gradient `dC_T`):
//!
//! ```text
//! dv_t = dy_t + dCᵀ k_t          dk_t = dC v_t           dC^- = dC + q_t dy_tᵀ
//! dq_t = e^{g_t} ⊙ (C_{t-1} dy_t)     dg_t = e^{g_t} ⊙ rowsum(dC^- ⊙ C_{t-1})
//! dC  <- Diag(e^{g_t}) dC^-       and finally  dh0 = dC
//! ```
//!
//! The states `C_{t-1}` are needed in reverse order: a forward pass keeps one every `K ≈ √T`
//! tokens, then each stretch of `K` tokens is recomputed into a buffer before it is walked back,
//! so memory is `O(√T D^2)` per head and the work one extra forward pass.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::LinearRelationMode;
use crate::launches;
use crate::ops::{LinearArgs, LinearGrads};
use crate::tile::flex::{
    LANES, Vectorized, dims4, gather_heads, output, read_f32, scatter_heads, tensor, vectorized,
};

/// The inputs of one head, heads-first `[T, D]` each, and `D`.
#[derive(Clone, Copy)]
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    d: usize,
}

impl Head<'_> {
    fn row<'b>(&self, x: &'b [f32], t: usize) -> &'b [f32] {
        &x[t * self.d..(t + 1) * self.d]
    }

    /// Advance `state` (`C_{t-1}` -> `C_t`) over token `t`; with `read`, also `E_t` into it.
    #[inline(always)]
    fn step(&self, state: &mut [f32], t: usize, read: Option<&mut [f32]>) {
        let d = self.d;
        let (q, k, v, g) = (
            self.row(self.q, t),
            self.row(self.k, t),
            self.row(self.v, t),
            self.row(self.g, t),
        );
        match read {
            Some(e) => {
                e.fill(0.0);
                for kk in 0..d {
                    let (alpha, qk, kv) = (g[kk].exp(), q[kk], k[kk]);
                    let row = &mut state[kk * d..(kk + 1) * d];
                    for ((c, e), &v) in row.iter_mut().zip(e.iter_mut()).zip(v) {
                        let retained = *c * alpha; // C^- = Diag(alpha) C
                        *e += qk * retained; // E = (C^-)ᵀ q, before the write
                        *c = retained + kv * v; // C = C^- + k vᵀ
                    }
                }
            }
            None => {
                for kk in 0..d {
                    let (alpha, kv) = (g[kk].exp(), k[kk]);
                    let row = &mut state[kk * d..(kk + 1) * d];
                    for (c, &v) in row.iter_mut().zip(v) {
                        *c = *c * alpha + kv * v;
                    }
                }
            }
        }
    }
}

/// [`RelationOps::linear_relation`](crate::RelationOps::linear_relation) on Flex: the bundled
/// output `[B, H, T + D, D]` (rows `0..T` are `y`, rows `T..` the final state), in `q`'s dtype.
/// Every mode runs the same scan (see the module docs); the mode only picks the launch counter.
///
/// # Shapes
/// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[B, H, D, D]`
pub(crate) fn forward(
    (q, k, v, g, h0): LinearArgs<FlexTensor>,
    mode: LinearRelationMode,
) -> FlexTensor {
    launches::record(match mode {
        LinearRelationMode::Recurrent => &launches::LINEAR_RELATION_FWD,
        LinearRelationMode::Chunked { .. } => &launches::CHUNK_LINEAR_RELATION_FWD,
    });
    let [b, t, h, d] = dims4(&q);
    let dtype = q.dtype();
    let (q, k, v, g) = (
        gather_heads(&q),
        gather_heads(&k),
        gather_heads(&v),
        gather_heads(&g),
    ); // [B·H, T, D]
    let h0 = read_f32(&h0); // [B·H, D, D]

    let mut out = output(b * h * (t + d) * d); // [B·H, T + D, D]
    out.par_chunks_mut((t + d) * d)
        .enumerate()
        .for_each(|(bh, out)| {
            let span = bh * t * d..(bh + 1) * t * d;
            let head = Head {
                q: &q[span.clone()],
                k: &k[span.clone()],
                v: &v[span.clone()],
                g: &g[span],
                d,
            };
            let (y, state) = out.split_at_mut(t * d);
            state.copy_from_slice(&h0[bh * d * d..(bh + 1) * d * d]);
            vectorized(ForwardHead { head, state, y });
        });
    tensor(out, Shape::new([b, h, t + d, d]), dtype)
}

/// Backward: `(dq, dk, dv, dg, dh0)` from the bundled output's gradient (see the module docs).
///
/// # Shapes
/// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[B, H, D, D]`; `d_out`: `[B, H, T + D, D]`
/// - outputs: like `q`, `k`, `v`, `g`, `h0`
pub(crate) fn backward(
    (q, k, v, g, h0): LinearArgs<FlexTensor>,
    _out: FlexTensor,
    d_out: FlexTensor,
    mode: LinearRelationMode,
) -> LinearGrads<Flex> {
    launches::record(match mode {
        LinearRelationMode::Recurrent => &launches::LINEAR_RELATION_BWD,
        LinearRelationMode::Chunked { .. } => &launches::CHUNK_LINEAR_RELATION_BWD,
    });
    let dims = dims4(&q);
    let [b, t, h, d] = dims;
    let dtype = q.dtype();
    let (q, k, v, g) = (
        gather_heads(&q),
        gather_heads(&k),
        gather_heads(&v),
        gather_heads(&g),
    ); // [B·H, T, D]
    let h0 = read_f32(&h0); // [B·H, D, D]
    let d_out = read_f32(&d_out); // [B·H, T + D, D]

    // Per head: dq, dk, dv, dg ([T, D] each), then dh0 ([D, D]).
    let per_head = (4 * t + d) * d;
    let mut grads = output(b * h * per_head);
    grads
        .par_chunks_mut(per_head)
        .enumerate()
        .for_each(|(bh, grads)| {
            let span = bh * t * d..(bh + 1) * t * d;
            let head = Head {
                q: &q[span.clone()],
                k: &k[span.clone()],
                v: &v[span.clone()],
                g: &g[span],
                d,
            };
            let d_out = &d_out[bh * (t + d) * d..(bh + 1) * (t + d) * d];
            let h0 = &h0[bh * d * d..(bh + 1) * d * d];
            vectorized(BackwardHead {
                head,
                h0,
                d_out,
                grads,
            });
        });

    // Split the per-head blocks into the five gradients.
    let part = |index: usize, len: usize| -> Vec<f32> {
        let mut out = Vec::with_capacity(b * h * len);
        for bh in 0..b * h {
            let start = bh * per_head + index * t * d;
            out.extend_from_slice(&grads[start..start + len]);
        }
        out
    };
    let heads = |index: usize| scatter_heads(&part(index, t * d), dims, dtype);
    (
        heads(0),
        heads(1),
        heads(2),
        heads(3),
        tensor(part(4, d * d), Shape::new([b, h, d, d]), dtype),
    )
}

/// One head's forward, compiled for the CPU's vector extension ([`vectorized`]): the recurrence
/// token by token, `y = v + E` into `y` (`[T, D]`), the state carried in `state` (`[D, D]`).
struct ForwardHead<'a> {
    head: Head<'a>,
    state: &'a mut [f32],
    y: &'a mut [f32],
}

impl Vectorized for ForwardHead<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Self { head, state, y } = self;
        let d = head.d;
        for (ti, e) in y.chunks_exact_mut(d).enumerate() {
            head.step(state, ti, Some(&mut *e));
            for (e, &v) in e.iter_mut().zip(head.row(head.v, ti)) {
                *e += v; // y = v + E
            }
        }
    }
}

/// One head's backward, compiled for the CPU's vector extension ([`vectorized`]).
struct BackwardHead<'a> {
    head: Head<'a>,
    h0: &'a [f32],
    d_out: &'a [f32],
    grads: &'a mut [f32],
}

impl Vectorized for BackwardHead<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        backward_head(self.head, self.h0, self.d_out, self.grads);
    }
}

/// One head's backward into `grads = [dq | dk | dv | dg | dh0]`.
#[inline(always)] // into `BackwardHead::run`
fn backward_head(head: Head<'_>, h0: &[f32], d_out: &[f32], grads: &mut [f32]) {
    let d = head.d;
    let t = head.q.len() / d;
    let (dq, rest) = grads.split_at_mut(t * d);
    let (dk, rest) = rest.split_at_mut(t * d);
    let (dv, rest) = rest.split_at_mut(t * d);
    let (dg, d_state) = rest.split_at_mut(t * d);
    let (dy, d_final) = d_out.split_at(t * d);

    // Checkpoints: the state before every `stretch`-th token.
    let stretch = ((t as f64).sqrt().ceil() as usize).max(1);
    let stretches = t.div_ceil(stretch);
    let mut checkpoints = vec![0.0f32; stretches * d * d];
    let mut state = h0.to_vec();
    for ti in 0..t {
        if ti % stretch == 0 {
            let c = ti / stretch;
            checkpoints[c * d * d..(c + 1) * d * d].copy_from_slice(&state);
        }
        head.step(&mut state, ti, None);
    }

    d_state.copy_from_slice(d_final); // dC_T
    let mut before = vec![0.0f32; stretch * d * d]; // C_{t-1} for the tokens of one stretch
    for c in (0..stretches).rev() {
        let (t0, t1) = (c * stretch, ((c + 1) * stretch).min(t));
        state.copy_from_slice(&checkpoints[c * d * d..(c + 1) * d * d]);
        for ti in t0..t1 {
            let slot = (ti - t0) * d * d;
            before[slot..slot + d * d].copy_from_slice(&state);
            head.step(&mut state, ti, None);
        }
        for ti in (t0..t1).rev() {
            let prev = &before[(ti - t0) * d * d..(ti - t0 + 1) * d * d];
            let row = ti * d..(ti + 1) * d;
            token_backward(
                head,
                ti,
                prev,
                &dy[row.clone()],
                d_state,
                Token {
                    dq: &mut dq[row.clone()],
                    dk: &mut dk[row.clone()],
                    dv: &mut dv[row.clone()],
                    dg: &mut dg[row],
                },
            );
        }
    }
}

/// The gradients of one token's inputs.
struct Token<'a> {
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
    dg: &'a mut [f32],
}

/// Token `t` of the reverse pass: reads `C_{t-1}` (`prev`) and `dC = ∂L/∂C_t` (`d_state`),
/// writes the token's gradients and leaves `∂L/∂C_{t-1}` in `d_state`.
#[inline(always)]
fn token_backward(
    head: Head<'_>,
    t: usize,
    prev: &[f32],
    dy: &[f32],
    d_state: &mut [f32],
    out: Token<'_>,
) {
    let d = head.d;
    let (q, k, v, g) = (
        head.row(head.q, t),
        head.row(head.k, t),
        head.row(head.v, t),
        head.row(head.g, t),
    );
    out.dv.copy_from_slice(dy);
    for kk in 0..d {
        let (alpha, qk, kv) = (g[kk].exp(), q[kk], k[kk]);
        let (c_row, dc_row) = (
            &prev[kk * d..(kk + 1) * d],
            &mut d_state[kk * d..(kk + 1) * d],
        );
        // Three dot products over the value channels, split in LANES partial sums so they
        // vectorise; the order is fixed, so the result is deterministic.
        let mut acc_k = [0.0f32; LANES]; // dC v
        let mut acc_q = [0.0f32; LANES]; // C_{t-1} dy
        let mut acc_g = [0.0f32; LANES]; // rowsum(dC^- ⊙ C_{t-1})
        let full = d / LANES * LANES;
        for c0 in (0..full).step_by(LANES) {
            for l in 0..LANES {
                let c = c0 + l;
                let dc = dc_row[c];
                out.dv[c] += dc * kv; // dv = dy + dCᵀ k
                acc_k[l] += dc * v[c];
                let dc_minus = dc + qk * dy[c]; // dC^- = dC + q dyᵀ
                acc_q[l] += c_row[c] * dy[c];
                acc_g[l] += dc_minus * c_row[c];
                dc_row[c] = alpha * dc_minus; // dC_{t-1} = Diag(alpha) dC^-
            }
        }
        let (mut sum_k, mut sum_q, mut sum_g) = (0.0f32, 0.0f32, 0.0f32);
        for c in full..d {
            let dc = dc_row[c];
            out.dv[c] += dc * kv;
            sum_k += dc * v[c];
            let dc_minus = dc + qk * dy[c];
            sum_q += c_row[c] * dy[c];
            sum_g += dc_minus * c_row[c];
            dc_row[c] = alpha * dc_minus;
        }
        out.dk[kk] = acc_k.iter().sum::<f32>() + sum_k;
        out.dq[kk] = alpha * (acc_q.iter().sum::<f32>() + sum_q);
        out.dg[kk] = alpha * (acc_g.iter().sum::<f32>() + sum_g);
    }
}
