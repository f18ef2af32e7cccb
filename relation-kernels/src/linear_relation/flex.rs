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
//! Every `(sequence, head)` is an independent task on the thread pool, each owning its output
//! slices, so the bits do not depend on the thread count; a sequence is a row of an unpacked
//! `[B, T, H, D]` call or one segment of a packed row, run from its own initial state exactly as
//! if it were alone (packed rows of many short documents cost what their tokens cost).
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

use crate::flex::{
    LANES, MulAdd, Vectorized, dims4, gather_heads, output, read_f32, scatter_heads, tensor,
    vectorized,
};
use crate::ops::{LinearArgs, LinearGrads, LinearParams};
use crate::sequence::{Sequence, sequences};

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

/// Where one `(sequence, head)` task of a call reads and writes: the sequence (its first row
/// among the `B·T`), its index `n` among the call's `N` sequences, its row `b` and its head.
#[derive(Clone, Copy)]
struct Task {
    seq: Sequence,
    n: usize,
    b: usize,
    h: usize,
}

impl Task {
    /// The task's rows in a heads-first `[B·H, T, D]` buffer.
    fn span(&self, t: usize, heads: usize, d: usize) -> std::ops::Range<usize> {
        let local = self.seq.start - self.b * t; // first row within the sequence's row b
        let start = ((self.b * heads + self.h) * t + local) * d;
        start..start + self.seq.len * d
    }

    /// The task's rows of the heads-first `[B·H, T, D]` inputs `[q, k, v, g]`.
    fn head<'a>(&self, [q, k, v, g]: [&'a [f32]; 4], t: usize, heads: usize, d: usize) -> Head<'a> {
        let span = self.span(t, heads, d);
        Head {
            q: &q[span.clone()],
            k: &k[span.clone()],
            v: &v[span.clone()],
            g: &g[span],
            d,
        }
    }

    /// The task's initial (or final-gradient) state in `[N, H, D, D]`.
    fn state(&self, heads: usize, d: usize) -> std::ops::Range<usize> {
        let start = (self.n * heads + self.h) * d * d;
        start..start + d * d
    }
}

/// The `(sequence, head)` tasks of a call, in the order of the bundled output: row by row, head
/// by head, sequence by sequence; and the sequences per row.
fn tasks(b: usize, t: usize, heads: usize, params: &LinearParams) -> (Vec<Task>, usize) {
    let seqs = sequences(b, t, params.segments.as_ref());
    let per_row = params.per_row();
    let mut tasks = Vec::with_capacity(seqs.len() * heads);
    for bi in 0..b {
        for h in 0..heads {
            for j in 0..per_row {
                let n = bi * per_row + j;
                tasks.push(Task {
                    seq: seqs[n],
                    n,
                    b: bi,
                    h,
                });
            }
        }
    }
    (tasks, per_row)
}

/// Cuts `buf` into consecutive pieces of the given lengths (disjoint borrows for the tasks).
fn cut(mut buf: &mut [f32], lens: impl IntoIterator<Item = usize>) -> Vec<&mut [f32]> {
    let mut pieces = Vec::new();
    for len in lens {
        let (piece, rest) = std::mem::take(&mut buf).split_at_mut(len);
        pieces.push(piece);
        buf = rest;
    }
    pieces
}

/// [`RelationOps::linear_relation`](crate::RelationOps::linear_relation) on Flex: the bundled
/// output `[B, H, T + n D, D]` (rows `0..T` are `y`, then the final state of each of the row's
/// `n` sequences: 1 unpacked, `N` packed), in `q`'s dtype. One task per `(sequence, head)`; every
/// mode runs the same scan (see the module docs); the mode only picks the launch counter.
///
/// # Shapes
/// - `q`, `k`, `v`, `g`: `[B, T, H, D]` (packed: `[1, total, H, D]`); `h0`: `[N, H, D, D]`
pub(crate) fn forward(args: LinearArgs<FlexTensor>) -> FlexTensor {
    let LinearArgs {
        q,
        k,
        v,
        g,
        h0,
        params,
    } = args;
    let [b, t, heads, d] = dims4(&q);
    let dtype = q.dtype();
    let (q, k, v, g) = (
        gather_heads(&q),
        gather_heads(&k),
        gather_heads(&v),
        gather_heads(&g),
    ); // [B·H, T, D]
    let h0 = read_f32(&h0); // [N, H, D, D]
    let (tasks, per_row) = tasks(b, t, heads, &params);
    let bundle = t + per_row * d; // rows per (b, h) of the output

    let mut out = output(b * heads * bundle * d); // [B, H, T + n D, D]
    // Per (b, h): the y rows of each sequence, then each sequence's final state.
    let mut ys = Vec::with_capacity(tasks.len());
    let mut states = Vec::with_capacity(tasks.len());
    for (bh, chunk) in out.chunks_exact_mut(bundle * d).enumerate() {
        let (y, state) = chunk.split_at_mut(t * d);
        let row = &tasks[bh * per_row..(bh + 1) * per_row];
        ys.extend(cut(y, row.iter().map(|task| task.seq.len * d)));
        states.extend(state.chunks_exact_mut(d * d));
    }
    tasks
        .into_par_iter()
        .zip(ys)
        .zip(states)
        .for_each(|((task, y), state)| {
            let head = task.head([&q, &k, &v, &g], t, heads, d);
            state.copy_from_slice(&h0[task.state(heads, d)]);
            vectorized(ForwardHead { head, state, y });
        });
    tensor(out, Shape::new([b, heads, bundle, d]), dtype)
}

/// Backward: `(dq, dk, dv, dg, dh0)` from the bundled output's gradient (see the module docs),
/// one task per `(sequence, head)` as in [`forward`].
///
/// # Shapes
/// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[N, H, D, D]`; `d_out`: `[B, H, T + n D, D]`
/// - outputs: like `q`, `k`, `v`, `g`, `h0`
pub(crate) fn backward(
    args: LinearArgs<FlexTensor>,
    _out: FlexTensor,
    d_out: FlexTensor,
) -> LinearGrads<Flex> {
    let LinearArgs {
        q,
        k,
        v,
        g,
        h0,
        params,
    } = args;
    let dims = dims4(&q);
    let [b, t, heads, d] = dims;
    let dtype = q.dtype();
    let h0_shape = Shape::new(dims4(&h0)); // [N, H, D, D]
    let (q, k, v, g) = (
        gather_heads(&q),
        gather_heads(&k),
        gather_heads(&v),
        gather_heads(&g),
    ); // [B·H, T, D]
    let h0 = read_f32(&h0); // [N, H, D, D]
    let d_out = read_f32(&d_out); // [B, H, T + n D, D]
    let (tasks, per_row) = tasks(b, t, heads, &params);
    let bundle = t + per_row * d;

    // dq, dk, dv, dg heads-first ([B·H, T, D]), dh0 [N, H, D, D]; each cut into the tasks'
    // pieces (tasks run row by row, head by head, sequence by sequence: the heads-first order).
    let lens = || tasks.iter().map(|task| task.seq.len * d);
    let mut grads: [Vec<f32>; 4] = std::array::from_fn(|_| output(b * heads * t * d));
    let mut dh0 = output(h0.len());
    let [dq, dk, dv, dg] = &mut grads;
    let pieces = cut(dq, lens())
        .into_iter()
        .zip(cut(dk, lens()))
        .zip(cut(dv, lens()))
        .zip(cut(dg, lens()));
    let mut dh0_of: Vec<Option<&mut [f32]>> = dh0.chunks_exact_mut(d * d).map(Some).collect();
    let work: Vec<_> = tasks
        .iter()
        .zip(pieces)
        .map(|(task, (((dq, dk), dv), dg))| {
            let dh0 = dh0_of[task.n * heads + task.h]
                .take()
                .expect("one task per (sequence, head)");
            (
                *task,
                HeadGrads {
                    dq,
                    dk,
                    dv,
                    dg,
                    dh0,
                },
            )
        })
        .collect();
    work.into_par_iter().for_each(|(task, grads)| {
        let head = task.head([&q, &k, &v, &g], t, heads, d);
        let j = task.n - task.b * per_row; // the sequence's index within its row
        let bh = (task.b * heads + task.h) * bundle * d; // the (b, h) block of the bundle
        let local = task.seq.start - task.b * t;
        let dy = &d_out[bh + local * d..bh + (local + task.seq.len) * d];
        let d_final = &d_out[bh + (t + j * d) * d..bh + (t + (j + 1) * d) * d];
        vectorized(BackwardHead {
            head,
            h0: &h0[task.state(heads, d)],
            dy,
            d_final,
            grads,
        });
    });

    let [dq, dk, dv, dg] = grads;
    (
        scatter_heads(&dq, dims, dtype),
        scatter_heads(&dk, dims, dtype),
        scatter_heads(&dv, dims, dtype),
        scatter_heads(&dg, dims, dtype),
        tensor(dh0, h0_shape, dtype),
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
    fn run<M: MulAdd>(self) {
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

/// The gradients of one `(sequence, head)`: `[len, D]` each, and `dh0` `[D, D]`.
struct HeadGrads<'a> {
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
    dg: &'a mut [f32],
    dh0: &'a mut [f32],
}

/// One head's backward, compiled for the CPU's vector extension ([`vectorized`]).
struct BackwardHead<'a> {
    head: Head<'a>,
    /// `C_0`, `[D, D]`.
    h0: &'a [f32],
    /// `dy`, `[len, D]`.
    dy: &'a [f32],
    /// `dC_T`, `[D, D]`.
    d_final: &'a [f32],
    grads: HeadGrads<'a>,
}

impl Vectorized for BackwardHead<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        backward_head(self.head, self.h0, self.dy, self.d_final, self.grads);
    }
}

/// One head's backward into `grads`.
#[inline(always)] // into `BackwardHead::run`
fn backward_head(head: Head<'_>, h0: &[f32], dy: &[f32], d_final: &[f32], grads: HeadGrads<'_>) {
    let d = head.d;
    let t = head.q.len() / d;
    let HeadGrads {
        dq,
        dk,
        dv,
        dg,
        dh0: d_state,
    } = grads;

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
