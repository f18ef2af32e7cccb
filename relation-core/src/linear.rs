//! Linear Relation (`docs/maths.md#6-linear-relation`, `docs/maths.md#7-chunked-linear-relation`):
//! the token-by-token recurrence and the chunkwise-parallel algorithm.
//!
//! Per head, with state `C` (`D x D`; rows are key channels, columns value channels):
//!
//! ```text
//! S_t    = sigmoid(p1_t · p2_t / (tau_S sqrt(D)))     ask self (from p1, p2 after RoPE)
//! p̂_t    = p_t / sqrt(||p_t||² + eps)                 L2 norm, after S_t
//! C_t^-  = Diag(alpha_t) C_{t-1}                       retain   (alpha_t = exp(log_alpha_t))
//! E_t    = S_t (C_t^-)^T p̂1_t                          ask others: read BEFORE write
//! Y_t    = Ĩ_t + E_t                                   answer
//! C_t    = C_t^- + S_t p̂2_t Ĩ_t^T                      become others: write Ĩ_t, never Y_t
//! ```
//!
//! Both references take the raw projections: `S_t` and the L2 normalisation happen inside, so the
//! functions are the whole specification. The gates arrive in log space (`log_alpha <= 0`).
//!
//! # Shapes
//!
//! - `p1`, `p2`, `info`, `log_alpha`: `[B, T, H, D]`
//! - state `C`: `[B, H, D, D]`, `C[b, h, k, v]` (key channel `k`, value channel `v`)
//! - output `y`: `[B, T, H, D]`

use burn::tensor::{Bool, Tensor, activation};

use crate::check;
use crate::error::{RelationError, Result};
use crate::relation::naive_self_relation;
use crate::segments::Segments;

/// `eps` of the L2 normalisation `p / sqrt(||p||² + eps)`.
pub const L2_NORM_EPS: f64 = 1e-6;

/// The tensors Linear Relation reads, the state it starts from, and how its rows divide into
/// sequences.
///
/// Unpacked (`segments: None`), the `B` rows of `[B, T, H, D]` are `B` sequences, row `b`
/// starting from `initial_state[b]`. Packed, one `[1, total, H, D]` row holds `N` documents back
/// to back, document `n` starting from `initial_state[n]` and ending in the output's `state[n]`,
/// exactly as if run alone, with gradients to both: one launch covers every document, one task
/// (Flex) or cube (CubeCL) per `(document, head)` reading only its own rows, so a row of many
/// short documents costs what its tokens cost. As `cu_seqlens` is in flash-linear-attention. The
/// references and the kernels (`relation_kernels::linear_relation`) take the same inputs.
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha` (`<= 0`): `[B, T, H, D]`, or `[1, total, H, D]` with
///   `segments` ending at `total`
/// - `initial_state`: `[N, H, D, D]` with `N` = `B` (unpacked) or the document count (packed);
///   zeros when `None`
#[derive(Debug, Clone)]
pub struct LinearInputs {
    /// `P1`, the queries' side.
    pub p1: Tensor<4>,
    /// `P2`, the keys' side.
    pub p2: Tensor<4>,
    /// `Ĩ`, the information written into the state.
    pub info: Tensor<4>,
    /// The log retention gates, `<= 0`.
    pub log_alpha: Tensor<4>,
    /// The state each sequence starts from.
    pub initial_state: Option<Tensor<4>>,
    /// The documents of a packed row; `None`: every row of the batch is one sequence.
    pub segments: Option<Segments>,
}

impl LinearInputs {
    /// Unpacked inputs from zero states: `B` sequences of `T` tokens.
    pub fn new(p1: Tensor<4>, p2: Tensor<4>, info: Tensor<4>, log_alpha: Tensor<4>) -> Self {
        Self {
            p1,
            p2,
            info,
            log_alpha,
            initial_state: None,
            segments: None,
        }
    }

    /// The same inputs starting from `state` (`[N, H, D, D]`).
    pub fn with_state(self, state: Tensor<4>) -> Self {
        Self {
            initial_state: Some(state),
            ..self
        }
    }

    /// The same tensors as one packed row of these documents.
    pub fn packed(self, segments: Segments) -> Self {
        Self {
            segments: Some(segments),
            ..self
        }
    }
}

/// Output of the Linear Relation references.
#[derive(Debug, Clone)]
pub struct LinearRelationOutput {
    /// `Y`, `[B, T, H, D]`.
    pub y: Tensor<4>,
    /// Final state `C_T`, `[B, H, D, D]`.
    pub state: Tensor<4>,
}

/// `p / sqrt(||p||² + eps)` over the head dimension.
///
/// # Shapes
/// - `x`: `[B, T, H, D]`, output: same
pub fn l2_normalize(x: Tensor<4>) -> Tensor<4> {
    let norm = (x.clone().powi_scalar(2).sum_dim(3) + L2_NORM_EPS).sqrt(); // [B, T, H, 1]
    x / norm
}

/// The per-token quantities shared by both forms.
struct Prepared {
    /// `S_t`, `[B, T, H, 1]`.
    s: Tensor<4>,
    /// `p̂1`, `[B, T, H, D]`.
    q: Tensor<4>,
    /// `p̂2`, `[B, T, H, D]`.
    k: Tensor<4>,
}

fn prepare(
    p1: &Tensor<4>,
    p2: &Tensor<4>,
    info: &Tensor<4>,
    log_alpha: &Tensor<4>,
    tau_s: f64,
    initial_state: Option<&Tensor<4>>,
) -> Result<(check::Bthd, Prepared)> {
    let dims = check::relation_inputs(p1, p2, info, tau_s)?;
    check::same_bthd("log_alpha", log_alpha, "p1", &dims)?;
    check::same_device("log_alpha", log_alpha, p1)?;
    if let Some(state) = initial_state {
        let [b, _, h, d] = dims.dims();
        check::exact_shape("initial_state", state, "[B, H, D, D]", [b, h, d, d])?;
        check::same_device("initial_state", state, p1)?;
    }
    let s = naive_self_relation(p1.clone(), p2.clone(), tau_s)?.unsqueeze_dim::<4>(3);
    Ok((
        dims,
        Prepared {
            s,
            q: l2_normalize(p1.clone()),
            k: l2_normalize(p2.clone()),
        },
    ))
}

fn zero_state(dims: &check::Bthd, like: &Tensor<4>) -> Tensor<4> {
    let [b, _, h, d] = dims.dims();
    Tensor::zeros([b, h, d, d], (&like.device(), like.dtype()))
}

/// Linear Relation, one token at a time: the literal recurrence of `docs/maths.md#6-linear-relation`.
///
/// `initial_state` defaults to zeros; the final state is returned so that a sequence can be
/// continued (prefill, decoding, or splitting a long sequence).
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha`: `[B, T, H, D]`
/// - `initial_state`: `[B, H, D, D]`
/// - output: `y` `[B, T, H, D]`, `state` `[B, H, D, D]`
///
/// # Errors
/// Mismatched shapes or devices, empty dimensions, bad `tau_s`.
pub fn naive_recurrent_linear_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau_s: f64,
    initial_state: Option<Tensor<4>>,
) -> Result<LinearRelationOutput> {
    let (dims, Prepared { s, q, k }) =
        prepare(&p1, &p2, &info, &log_alpha, tau_s, initial_state.as_ref())?;
    let [b, t, h, d] = dims.dims();
    let mut state = initial_state.unwrap_or_else(|| zero_state(&dims, &info));

    // Token t of a [B, T, H, D] tensor as [B, H, D, 1] (column) or [B, H, 1, D] (row).
    let column = |x: &Tensor<4>, i: usize| x.clone().narrow(1, i, 1).reshape([b, h, d, 1]);
    let row = |x: &Tensor<4>, i: usize| x.clone().narrow(1, i, 1).reshape([b, h, 1, d]);

    let mut ys = Vec::with_capacity(t);
    for i in 0..t {
        let s_t = s.clone().narrow(1, i, 1).reshape([b, h, 1, 1]);
        state = state * column(&log_alpha, i).exp(); // C^- = Diag(alpha_t) C, [B, H, D, D]
        let read = row(&q, i).matmul(state.clone()) * s_t.clone(); // E_t, [B, H, 1, D]
        let v = row(&info, i); // Ĩ_t, [B, H, 1, D]
        ys.push((v.clone() + read).reshape([b, 1, h, d]));
        state = state + (column(&k, i) * s_t).matmul(v); // C += S_t p̂2_t Ĩ_t^T
    }
    Ok(LinearRelationOutput {
        y: Tensor::cat(ys, 1),
        state,
    })
}

/// Linear Relation, chunkwise parallel: the algorithm the chunk kernel implements.
///
/// Within a chunk `c0..c1` with carried state `C0` and inclusive cumulative log gates
/// `b_t = sum_{s=c0..t} log alpha_s`:
///
/// ```text
/// E_t   = S_t (p̂1_t ⊙ e^{b_t})^T C0                               inter-chunk
///       + S_t sum_{c0<=j<t} [(p̂1_t ⊙ e^{b_t - b_j}) · S_j p̂2_j] Ĩ_j   intra-chunk, strictly lower
/// C_end = Diag(e^{b_c1}) C0 + sum_{j} Diag(e^{b_c1 - b_j}) S_j p̂2_j Ĩ_j^T
/// ```
///
/// The pairwise decay `e^{b_t - b_j}` is formed directly from the difference (never as
/// `e^{b_t} e^{-b_j}`, which overflows under strong gates), and only for `j < t`, where the
/// exponent is `<= 0`. Any `chunk_size >= 1`; `T` need not be a multiple of it.
///
/// # Shapes
/// As [`naive_recurrent_linear_relation`].
///
/// # Errors
/// As [`naive_recurrent_linear_relation`], plus `chunk_size == 0`.
pub fn naive_chunk_linear_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau_s: f64,
    initial_state: Option<Tensor<4>>,
    chunk_size: usize,
) -> Result<LinearRelationOutput> {
    if chunk_size == 0 {
        return Err(RelationError::InvalidChunkSize { chunk_size });
    }
    let (dims, Prepared { s, q, k }) =
        prepare(&p1, &p2, &info, &log_alpha, tau_s, initial_state.as_ref())?;
    let [b, t, h, d] = dims.dims();
    let mut state = initial_state.unwrap_or_else(|| zero_state(&dims, &info));

    // Chunk [c0, c0 + n) of a [B, T, H, D] tensor, heads first: [B, H, n, D].
    let chunk = |x: &Tensor<4>, c0: usize, n: usize| x.clone().narrow(1, c0, n).swap_dims(1, 2);

    let mut ys = Vec::with_capacity(t.div_ceil(chunk_size));
    let mut c0 = 0;
    while c0 < t {
        let n = chunk_size.min(t - c0);
        let s_c = chunk(&s, c0, n); // [B, H, n, 1]
        let q_c = chunk(&q, c0, n); // [B, H, n, D]
        let k_c = chunk(&k, c0, n) * s_c.clone(); // S_j p̂2_j, [B, H, n, D]
        let v_c = chunk(&info, c0, n); // [B, H, n, D]
        let cum = chunk(&log_alpha, c0, n).cumsum(2); // b_t, [B, H, n, D]

        // Inter-chunk: S_t (p̂1_t ⊙ e^{b_t})^T C0.
        let inter = (q_c.clone() * cum.clone().exp()).matmul(state.clone()) * s_c.clone();

        // Intra-chunk: pairwise decays e^{b_t - b_j} for j < t, [B, H, n, n, D].
        let diff: Tensor<5> = cum.clone().unsqueeze_dim(3) - cum.clone().unsqueeze_dim(2);
        let outside = Tensor::<2, Bool>::tril_mask([n, n], -1, &diff.device())
            .reshape([1, 1, n, n, 1])
            .expand([b, h, n, n, d]);
        let decay = diff.mask_fill(outside, f64::NEG_INFINITY).exp(); // 0 where j >= t
        let scores = (q_c.unsqueeze_dim::<5>(3) * decay * k_c.clone().unsqueeze_dim::<5>(2))
            .sum_dim(4)
            .reshape([b, h, n, n]); // [B, H, n(t), n(j)]
        let intra = scores.matmul(v_c.clone()) * s_c; // [B, H, n, D]
        ys.push((v_c.clone() + inter + intra).swap_dims(1, 2)); // [B, n, H, D]

        // Carry: C_end = Diag(e^{b_last}) C0 + sum_j (e^{b_last - b_j} ⊙ S_j p̂2_j) Ĩ_j^T.
        let last = cum.clone().narrow(2, n - 1, 1); // [B, H, 1, D]
        let k_decayed = k_c * (last.clone() - cum).exp(); // [B, H, n, D]
        state = state * last.exp().swap_dims(2, 3) + k_decayed.swap_dims(2, 3).matmul(v_c);
        c0 += n;
    }
    Ok(LinearRelationOutput {
        y: Tensor::cat(ys, 1),
        state,
    })
}

/// KDA-style log retention gates from a pre-activation: `g = -exp(a_log) * softplus(r + dt_bias)`.
///
/// Provided here so that tests and models share the one parameterization of `docs/maths.md#6-linear-relation`.
///
/// # Shapes
/// - `pre`: `[B, T, H, D]` (the low-rank projection `W_up W_down x`)
/// - `a_log`: `[H]`, `dt_bias`: `[H * D]`
/// - output: `[B, T, H, D]`, all `<= 0`
pub fn kda_log_gates(pre: Tensor<4>, a_log: Tensor<1>, dt_bias: Tensor<1>) -> Tensor<4> {
    let [_, _, h, d] = pre.dims();
    let rate = a_log.exp().reshape([1, 1, h, 1]);
    let x = pre + dt_bias.reshape([1, 1, h, d]);
    -(rate * activation::softplus(x, 1.0))
}
