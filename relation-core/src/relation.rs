//! Self-Exchange Relation (`docs/maths.md#1-the-self-exchange-relation`): the materialized and the factorized references.
//!
//! One head, positions `i, j = 1..T` (one-based in the maths, zero-based in code):
//!
//! ```text
//! U_ij = p1_i · p2_j / sqrt(D)                    evidence
//! S_i  = sigmoid(U_ii / tau_S)                    Self (bounded)
//! E_ij = SiLU(U_ij)                               Exchange (open positive tail)
//! R_ij = S_i                  if j = i
//!      = E_ij - lambda log i  if j < i            count calibration
//!      = -inf                 if j > i            causal
//! Y_i  = sum_j softmax(R_i)_j Ĩ_j
//! ```
//!
//! The factorized form (`docs/maths.md#2-the-factorized-form`) splits the softmax into the Self share `1 - g_i` and the
//! Exchange allocation `pi_ij = softmax_{j<i}(E_ij)`:
//!
//! ```text
//! L_i = logsumexp_{j<i} E_ij,   A_i = L_i - lambda log i,   g_i = sigmoid(A_i - S_i)
//! Y_i = Ĩ_i + g_i (sum_{j<i} pi_ij Ĩ_j - Ĩ_i)
//! ```
//!
//! Row 1 has no history: `g_1 = 0` and `Y_1 = Ĩ_1` exactly; `L_1 = A_1 = -inf`.
//!
//! Both references materialize `T x T` matrices: they are the specification and the test oracle,
//! not the fast path (that is `relation-kernels`' FlashRelation).
//!
//! # Shapes
//!
//! Every function here takes `p1`, `p2`, `info` (Ĩ, already Givens-mixed) as `[B, T, H, D]`
//! and `lambda` as a one-element `[1]` tensor (so it can be learned); outputs are `[B, T, H, D]`
//! and per-row statistics `[B, T, H]`.

use burn::tensor::{Bool, Int, Tensor, activation};

use crate::check;
use crate::error::Result;

/// Per-row statistics of the factorized form, all `[B, T, H]`.
///
/// These are what the fused kernel's backward saves (`docs/maths.md#4-flashrelation-backward`).
#[derive(Debug, Clone)]
pub struct RelationStats {
    /// `S_i = sigmoid(U_ii / tau_S)`, the Self relation.
    pub self_score: Tensor<3>,
    /// `L_i = logsumexp_{j<i} E_ij`, the Exchange log-mass before calibration (`-inf` on row 1).
    pub exchange_lse: Tensor<3>,
    /// `A_i = L_i - lambda log i`, the calibrated Exchange log-mass (`-inf` on row 1).
    pub log_mass: Tensor<3>,
    /// `g_i = sigmoid(A_i - S_i)`, the Exchange share; `F_ii = 1 - g_i` (`0` on row 1).
    pub exchange_share: Tensor<3>,
}

/// Output of [`naive_factorized_relation`].
#[derive(Debug, Clone)]
pub struct FactorizedRelation {
    /// `Y`, `[B, T, H, D]`.
    pub y: Tensor<4>,
    /// Per-row statistics.
    pub stats: RelationStats,
}

/// `[B, T, H, D]` -> `[B, H, T, D]`: heads become a batch dimension for the `T x T` matmuls.
fn heads_first(x: Tensor<4>) -> Tensor<4> {
    x.swap_dims(1, 2)
}

/// Evidence `U = p1 p2^T / sqrt(D)` per head.
///
/// # Shapes
/// - `p1`, `p2`: `[B, T, H, D]`
/// - output: `[B, H, T, T]`, `U[b, h, i, j] = p1_i · p2_j / sqrt(D)`
pub fn naive_evidence(p1: Tensor<4>, p2: Tensor<4>) -> Tensor<4> {
    let head_dim = p1.dims()[3];
    let q = heads_first(p1); // [B, H, T, D]
    let k = heads_first(p2); // [B, H, T, D]
    q.matmul(k.swap_dims(2, 3)) / (head_dim as f64).sqrt()
}

/// Self relation `S_i = sigmoid(p1_i · p2_i / (tau_S sqrt(D)))`, without building `U`.
///
/// # Shapes
/// - `p1`, `p2`: `[B, T, H, D]`
/// - output: `[B, T, H]`
pub fn naive_self_relation(p1: Tensor<4>, p2: Tensor<4>, tau_s: f64) -> Result<Tensor<3>> {
    let dims = check::bthd("p1", &p1)?;
    check::same_bthd("p2", &p2, "p1", &dims)?;
    check::tau(tau_s)?;
    let scale = 1.0 / ((dims.head_dim as f64).sqrt() * tau_s);
    let diag = (p1 * p2).sum_dim(3) * scale; // [B, T, H, 1]
    Ok(activation::sigmoid(diag).squeeze_dim::<3>(3))
}

/// `log i` for one-based rows `i = 1..T`, shaped to broadcast over `[B, H, T, T]` rows.
///
/// # Shapes
/// - output: `[1, 1, T, 1]`
fn log_row_index(seq: usize, like: &Tensor<4>) -> Tensor<4> {
    let rows = Tensor::<1, Int>::arange(1..seq as i64 + 1, &like.device());
    rows.float()
        .cast(like.dtype())
        .log()
        .reshape([1, 1, seq, 1])
}

/// Mask that is `true` strictly below the diagonal (`j < i`), for `[B, H, T, T]`.
fn strictly_lower(seq: usize, like: &Tensor<4>) -> Tensor<4, Bool> {
    // tril_mask marks the *outside* of the lower triangle; offset -1 excludes the diagonal.
    let outside = Tensor::<2, Bool>::tril_mask([seq, seq], -1, &like.device());
    outside.bool_not().reshape([1, 1, seq, seq])
}

/// Mask that is `true` on row 1 only (the row without history), shaped `[1, 1, T, 1]`.
fn first_row(seq: usize, like: &Tensor<4>) -> Tensor<4, Bool> {
    Tensor::<1, Int>::arange(0..seq as i64, &like.device())
        .equal_elem(0)
        .reshape([1, 1, seq, 1])
}

/// The relation weights `F = softmax(R)` of the materialized form.
///
/// # Shapes
/// - `p1`, `p2`: `[B, T, H, D]`; `lambda`: `[1]`
/// - output: `[B, H, T, T]`, rows sum to 1, zero above the diagonal
pub fn naive_relation_weights(
    p1: Tensor<4>,
    p2: Tensor<4>,
    lambda: Tensor<1>,
    tau_s: f64,
) -> Result<Tensor<4>> {
    let dims = check::bthd("p1", &p1)?;
    check::same_bthd("p2", &p2, "p1", &dims)?;
    check::exact_shape("lambda", &lambda, "[1]", [1])?;
    check::tau(tau_s)?;
    let [b, t, h, _] = dims.dims();

    let self_score = naive_self_relation(p1.clone(), p2.clone(), tau_s)?; // [B, T, H]
    let self_score = self_score.swap_dims(1, 2).reshape([b, h, t, 1]); // [B, H, T, 1]
    let u = naive_evidence(p1, p2); // [B, H, T, T]

    let calibration = lambda.reshape([1, 1, 1, 1]) * log_row_index(t, &u); // [1, 1, T, 1]
    let exchange = activation::silu(u) - calibration; // [B, H, T, T]

    let lower = strictly_lower(t, &exchange).expand([b, h, t, t]);
    let diagonal = Tensor::<2, Bool>::diag_mask([t, t], 0, &exchange.device())
        .bool_not()
        .reshape([1, 1, t, t])
        .expand([b, h, t, t]);
    // R: Exchange below the diagonal, Self on it, -inf above (every row keeps a finite entry).
    let relation = exchange
        .mask_fill(lower.bool_not(), f64::NEG_INFINITY)
        .mask_where(diagonal, self_score.expand([b, h, t, t]));
    Ok(activation::softmax(relation, 3))
}

/// Materialized Self-Exchange Relation (`docs/maths.md#1-the-self-exchange-relation`): build `R`, softmax, multiply by Ĩ.
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[B, T, H, D]` (`p1`/`p2` after RoPE, `info` after Givens mixing)
/// - `lambda`: `[1]`
/// - output `Y`: `[B, T, H, D]`
///
/// # Errors
/// Mismatched shapes or devices, empty dimensions, `lambda` not `[1]`, `tau_s` not finite and
/// positive.
pub fn naive_parallel_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau_s: f64,
) -> Result<Tensor<4>> {
    check::relation_inputs(&p1, &p2, &info, tau_s)?;
    let weights = naive_relation_weights(p1, p2, lambda, tau_s)?; // [B, H, T, T]
    let y = weights.matmul(heads_first(info)); // [B, H, T, D]
    Ok(y.swap_dims(1, 2)) // [B, T, H, D]
}

/// Factorized Self-Exchange Relation (`docs/maths.md#2-the-factorized-form`): Self share and Exchange allocation apart.
///
/// Returns `Y` and the per-row statistics `(S, L, A, g)` that the fused kernel saves for its
/// backward pass. Numerically stable for large `|U|`: the Exchange log-sum-exp subtracts the row
/// maximum (detached, as it cancels), and row 1, whose Exchange set is empty, is handled by masks
/// rather than by `log 0` so that gradients stay finite.
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[B, T, H, D]`; `lambda`: `[1]`
/// - output `y`: `[B, T, H, D]`; statistics: `[B, T, H]`
///
/// # Errors
/// As [`naive_parallel_relation`].
pub fn naive_factorized_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau_s: f64,
) -> Result<FactorizedRelation> {
    let dims = check::relation_inputs(&p1, &p2, &info, tau_s)?;
    check::exact_shape("lambda", &lambda, "[1]", [1])?;
    let [b, t, h, _] = dims.dims();

    let self_score = naive_self_relation(p1.clone(), p2.clone(), tau_s)?; // [B, T, H]
    let s = self_score.clone().swap_dims(1, 2).reshape([b, h, t, 1]); // [B, H, T, 1]
    let e = activation::silu(naive_evidence(p1, p2)); // [B, H, T, T]

    let history = strictly_lower(t, &e).expand([b, h, t, t]);
    let row1 = first_row(t, &e); // [1, 1, T, 1]
    let e = e.mask_fill(history.bool_not(), f64::NEG_INFINITY);

    // Online-softmax statistics written out in full: m = max, l = sum exp(E - m).
    let m = e.clone().detach().max_dim(3); // [B, H, T, 1], -inf on row 1
    let m = m.mask_fill(row1.clone().expand([b, h, t, 1]), 0.0);
    let w = (e - m.clone()).exp(); // [B, H, T, T], 0 off the history
    let l = w.clone().sum_dim(3); // [B, H, T, 1], 0 on row 1
    // Row 1: l = 0. Use 1 there so log/div stay finite; its g is forced to 0 below.
    let l = l + row1.clone().float().cast(w.dtype()); // [B, H, T, 1]
    let lse = m + l.clone().log(); // [B, H, T, 1]
    let allocation = w / l; // pi, [B, H, T, T]
    let info_h = heads_first(info); // [B, H, T, D]
    let ibar = allocation.matmul(info_h.clone()); // [B, H, T, D]

    let log_mass = lse.clone() - lambda.reshape([1, 1, 1, 1]) * log_row_index(t, &s);
    let share = activation::sigmoid(log_mass.clone() - s) // [B, H, T, 1]
        .mask_fill(row1.clone().expand([b, h, t, 1]), 0.0);
    let y = info_h.clone() + share.clone() * (ibar - info_h); // [B, H, T, D]

    // [B, H, T, 1] -> [B, T, H]
    let per_row = |x: Tensor<4>| x.reshape([b, h, t]).swap_dims(1, 2);
    let no_history = row1.expand([b, h, t, 1]);
    Ok(FactorizedRelation {
        y: y.swap_dims(1, 2),
        stats: RelationStats {
            self_score,
            exchange_lse: per_row(lse.mask_fill(no_history.clone(), f64::NEG_INFINITY)),
            log_mass: per_row(log_mass.mask_fill(no_history, f64::NEG_INFINITY)),
            exchange_share: per_row(share),
        },
    })
}

/// The last `n` rows of the materialized relation, with keys and values for all `T` positions:
/// the reference of incremental decoding with a Relation Cache (`docs/maths.md#8-the-relation-cache`).
///
/// Queries `p1` are positions `T - n .. T`; `p2` (after RoPE) and `info` (Ĩ) cover `0 .. T`.
/// With `n = T` this is [`naive_parallel_relation`]; with `n = 1` it is one decoding step, which
/// needs nothing of the past but its rotated `P2` and `Ĩ`.
///
/// # Shapes
/// - `p1`: `[B, n, H, D]`; `p2`, `info`: `[B, T, H, D]` with `n <= T`; `lambda`: `[1]`
/// - output: `[B, n, H, D]`
///
/// # Errors
/// Mismatched shapes (including `n > T`) or devices, empty dimensions, bad `tau_s`.
pub fn naive_relation_rows(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau_s: f64,
) -> Result<Tensor<4>> {
    check::exact_shape("lambda", &lambda, "[1]", [1])?;
    check::tau(tau_s)?;
    relation_rows(p1, p2, info, Transport::SelfExchange { lambda, tau_s })
}

/// How a row's information is transported: the Self-Exchange Relation, or its Exchange-only
/// ablation. (Built once per call: the size of the tensor handle does not matter.)
#[allow(clippy::large_enum_variant)]
enum Transport {
    /// `R_ii = S_i`, `R_ij = E_ij - λ log i` below the diagonal.
    SelfExchange { lambda: Tensor<1>, tau_s: f64 },
    /// No Self term: `softmax_{j<i} E_ij` (λ cancels); row 1 keeps its own information.
    ExchangeOnly,
    /// Softmax attention: `softmax_{j<=i} U_ij`, no activation, the row's own position included.
    Attention,
}

/// Materialized **Exchange-only** transport (`docs/maths.md#11-ablations`), the paper's
/// ablation without the Self term: row `i > 1` is `Y_i = Σ_{j<i} softmax_{j<i}(E_ij) Ĩ_j` —
/// every row hands its whole mass to its history — and the first row, which has no history,
/// keeps its own information, `Y_1 = Ĩ_1`. The count calibration `- λ log i` is the same for
/// every entry of a row and cancels in this softmax, so there is no `λ` (and no `τ_S`).
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[B, T, H, D]`; output `Y`: `[B, T, H, D]`
///
/// # Errors
/// Mismatched shapes, dtypes or devices, empty dimensions.
pub fn naive_exchange_only_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
) -> Result<Tensor<4>> {
    let dims = check::bthd("p1", &p1)?;
    check::same_bthd("p2", &p2, "p1", &dims)?;
    relation_rows(p1, p2, info, Transport::ExchangeOnly)
}

/// The last `n` rows of [`naive_exchange_only_relation`] against all `T` keys: its decoding
/// reference (as [`naive_relation_rows`] is for the Self-Exchange Relation).
///
/// # Shapes
/// - `p1`: `[B, n, H, D]`; `p2`, `info`: `[B, T, H, D]` with `n <= T`; output: `[B, n, H, D]`
///
/// # Errors
/// As [`naive_relation_rows`].
pub fn naive_exchange_only_rows(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
) -> Result<Tensor<4>> {
    relation_rows(p1, p2, info, Transport::ExchangeOnly)
}

/// The last `n` rows of causal softmax attention (the baseline mixer, `MHA`) against all `T`
/// keys: row `i` is `Σ_{j<=i} softmax_{j<=i}(q_i · k_j / √D) v_j`, the query rows at positions
/// `T - n .. T`. The decoding reference of attention with a K/V cache, as
/// [`naive_relation_rows`] is for the Relation; unlike it, every row includes its own position
/// in the softmax, and nothing else is added.
///
/// # Shapes
/// - `q`: `[B, n, H, D]`; `k`, `v`: `[B, T, H, D]` with `n <= T`; output: `[B, n, H, D]`
///
/// # Errors
/// As [`naive_relation_rows`] (the names `p1`, `p2`, `info` stand for `q`, `k`, `v`).
pub fn naive_attention_rows(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Result<Tensor<4>> {
    relation_rows(q, k, v, Transport::Attention)
}

/// Causal softmax attention over whole sequences (the baseline mixer, `MHA`), materialized:
/// row `i` is `Σ_{j<=i} softmax_{j<=i}(q_i · k_j / √D) v_j`. The reference of the fused
/// attention (`relation_kernels::flash_attention`) and its fallback: [`naive_attention_rows`]
/// with every row a query.
///
/// # Shapes
/// - `q`, `k`, `v`: `[B, T, H, D]`; output: `[B, T, H, D]`
///
/// # Errors
/// As [`naive_attention_rows`], plus `q` of another shape than `k`.
pub fn naive_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>) -> Result<Tensor<4>> {
    let keys = check::bthd("k", &k)?;
    check::same_bthd("q", &q, "k", &keys)?;
    naive_attention_rows(q, k, v)
}

/// Rows `T - n .. T` of the materialized relation under `transport`.
fn relation_rows(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    transport: Transport,
) -> Result<Tensor<4>> {
    let keys = check::bthd("p2", &p2)?;
    check::same_bthd("info", &info, "p2", &keys)?;
    let [b, t, h, d] = keys.dims();
    let [qb, n, qh, qd] = p1.dims();
    if qb != b || qh != h || qd != d || n == 0 || n > t {
        return Err(crate::RelationError::ShapeMismatch {
            name: "p1",
            expected: format!("[B, n, H, D] = [{b}, 1..={t}, {h}, {d}]"),
            got: p1.dims().to_vec(),
        });
    }
    check::same_device("p2", &p2, &p1)?;
    check::same_device("info", &info, &p1)?;
    check::same_dtype("p2", &p2, "p1", &p1)?;
    check::same_dtype("info", &info, "p1", &p1)?;
    let offset = t - n;
    let device = p1.device();
    let u =
        heads_first(p1.clone()).matmul(heads_first(p2.clone()).swap_dims(2, 3)) / (d as f64).sqrt(); // [B, H, n, T]

    // Absolute positions: query row r is i = offset + r, key column is j.
    let rows = Tensor::<1, Int>::arange(offset as i64..t as i64, &device).reshape([1, 1, n, 1]);
    let cols = Tensor::<1, Int>::arange(0..t as i64, &device).reshape([1, 1, 1, t]);
    let rows = rows.expand([b, h, n, t]);
    let cols = cols.expand([b, h, n, t]);
    let history = cols.clone().lower(rows.clone()); // j < i
    let diagonal = cols.clone().equal(rows); // j == i
    let relation = match transport {
        Transport::SelfExchange { lambda, tau_s } => {
            // Self of the query rows: p1_i · p2_i, with p2_i the last n keys.
            let s = naive_self_relation(p1, p2.narrow(1, offset, n), tau_s)?; // [B, n, H]
            let s = s.swap_dims(1, 2).reshape([b, h, n, 1]); // [B, H, n, 1]
            let log_i = Tensor::<1, Int>::arange(offset as i64 + 1..t as i64 + 1, &device)
                .float()
                .cast(u.dtype())
                .log()
                .reshape([1, 1, n, 1]);
            let exchange = activation::silu(u) - lambda.reshape([1, 1, 1, 1]) * log_i; // [B, H, n, T]
            exchange
                .mask_fill(history.bool_not(), f64::NEG_INFINITY)
                .mask_where(diagonal, s.expand([b, h, n, t]))
        }
        Transport::ExchangeOnly => {
            // The diagonal is open only on the first row (no history): weight 1 on itself.
            let first_diagonal = diagonal.bool_and(cols.equal_elem(0)); // [B, H, n, T]
            activation::silu(u)
                .mask_fill(history.bool_not(), f64::NEG_INFINITY)
                .mask_fill(first_diagonal, 0.0)
        }
        // j <= i: the history and the row's own position.
        Transport::Attention => {
            u.mask_fill(history.bool_or(diagonal).bool_not(), f64::NEG_INFINITY)
        }
    };
    let y = activation::softmax(relation, 3).matmul(heads_first(info)); // [B, H, n, D]
    Ok(y.swap_dims(1, 2))
}
