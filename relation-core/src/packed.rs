//! References of the packed (variable-length) operations: each segment cut out, run through the
//! unpacked reference alone, and the results put back in place.
//!
//! That is the definition of packing (see [`crate::segments`]), written as plainly as it can be:
//! these functions are the test oracle of the packed kernels, not a fast path (each segment is a
//! separate `T x T` reference call).
//!
//! # Shapes
//!
//! Packed inputs are `[1, total, H, D]` with [`Segments`] of `N` segments ending at `total`;
//! per-segment states are `[N, H, D, D]`; per-row statistics `[1, total, H]`.

use burn::tensor::Tensor;

use crate::error::Result;
use crate::linear::{
    LinearInputs, LinearRelationOutput, naive_chunk_linear_relation,
    naive_recurrent_linear_relation,
};
use crate::relation::{
    FactorizedRelation, RelationStats, naive_attention, naive_exchange_only_relation,
    naive_factorized_relation, naive_parallel_relation,
};
use crate::rope::naive_rope;
use crate::{Segments, check};

/// Rows `start..end` of a packed `[1, total, …]` tensor.
fn rows<const N: usize>(x: &Tensor<N>, (start, end): (usize, usize)) -> Tensor<N> {
    x.clone().narrow(1, start, end - start)
}

/// Checks the packed inputs of a Relation mixer against `segments`.
fn packed_inputs(
    p1: &Tensor<4>,
    p2: &Tensor<4>,
    info: &Tensor<4>,
    tau_s: f64,
    segments: &Segments,
) -> Result<()> {
    check::relation_inputs(p1, p2, info, tau_s)?;
    segments.check_packed("p1", &p1.dims())
}

/// Checks the packed Relation inputs, then runs `f` on each segment's rows of `(p1, p2, info)`,
/// in order.
fn per_segment<T>(
    [p1, p2, info]: [Tensor<4>; 3],
    tau_s: f64,
    segments: &Segments,
    f: impl Fn([Tensor<4>; 3]) -> Result<T>,
) -> Result<Vec<T>> {
    packed_inputs(&p1, &p2, &info, tau_s, segments)?;
    segments
        .bounds()
        .map(|seg| f([rows(&p1, seg), rows(&p2, seg), rows(&info, seg)]))
        .collect()
}

/// Self-Exchange Relation over packed segments: [`naive_parallel_relation`] of each segment alone.
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[1, total, H, D]`; `lambda`: `[1]`
/// - output: `[1, total, H, D]`
///
/// # Errors
/// As [`naive_parallel_relation`], plus segments that do not cover the packed rows.
pub fn naive_packed_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau_s: f64,
    segments: &Segments,
) -> Result<Tensor<4>> {
    let ys = per_segment([p1, p2, info], tau_s, segments, |[p1, p2, info]| {
        naive_parallel_relation(p1, p2, info, lambda.clone(), tau_s)
    })?;
    Ok(Tensor::cat(ys, 1))
}

/// [`naive_exchange_only_relation`] over packed segments: each segment alone (its first row
/// keeps its own information).
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[1, total, H, D]`; output: `[1, total, H, D]`
///
/// # Errors
/// As [`naive_exchange_only_relation`], plus segments that do not cover the packed rows.
pub fn naive_packed_exchange_only_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    segments: &Segments,
) -> Result<Tensor<4>> {
    // No Self term, so no temperature: any valid one passes the shared input checks.
    let ys = per_segment([p1, p2, info], 1.0, segments, |[p1, p2, info]| {
        naive_exchange_only_relation(p1, p2, info)
    })?;
    Ok(Tensor::cat(ys, 1))
}

/// [`naive_attention`] over packed segments: each segment alone (block-diagonal causal
/// attention).
///
/// # Shapes
/// - `q`, `k`, `v`: `[1, total, H, D]`; output: `[1, total, H, D]`
///
/// # Errors
/// As [`naive_attention`], plus segments that do not cover the packed rows.
pub fn naive_packed_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    segments: &Segments,
) -> Result<Tensor<4>> {
    // No temperature: any valid one passes the shared input checks.
    let ys = per_segment([q, k, v], 1.0, segments, |[q, k, v]| {
        naive_attention(q, k, v)
    })?;
    Ok(Tensor::cat(ys, 1))
}

/// [`naive_factorized_relation`] over packed segments: `Y` and the per-row statistics, each
/// segment alone (its first row has `L = A = -inf`, `g = 0`).
///
/// # Shapes
/// As [`naive_packed_relation`]; statistics are `[1, total, H]`.
///
/// # Errors
/// As [`naive_packed_relation`].
pub fn naive_packed_factorized_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau_s: f64,
    segments: &Segments,
) -> Result<FactorizedRelation> {
    let parts = per_segment([p1, p2, info], tau_s, segments, |[p1, p2, info]| {
        naive_factorized_relation(p1, p2, info, lambda.clone(), tau_s)
    })?;
    let cat = |f: fn(&FactorizedRelation) -> Tensor<3>| {
        Tensor::cat(parts.iter().map(f).collect(), 1) // [1, total, H]
    };
    Ok(FactorizedRelation {
        y: Tensor::cat(parts.iter().map(|p| p.y.clone()).collect(), 1),
        stats: RelationStats {
            self_score: cat(|p| p.stats.self_score.clone()),
            exchange_lse: cat(|p| p.stats.exchange_lse.clone()),
            log_mass: cat(|p| p.stats.log_mass.clone()),
            exchange_share: cat(|p| p.stats.exchange_share.clone()),
        },
    })
}

/// Which Linear Relation reference runs each segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearForm {
    /// [`naive_recurrent_linear_relation`], token by token.
    Recurrent,
    /// [`naive_chunk_linear_relation`] with this chunk size; chunks restart at every segment
    /// start, so no chunk straddles a boundary.
    Chunked(usize),
}

/// Linear Relation over the sequences of `x` in `form`: over packed segments (`x.segments`),
/// segment `n` starts from `initial_state[n]` (zero when `None`) and ends in `state[n]`, exactly
/// as if run alone; unpacked, the batch rows are the sequences, as in the unpacked references.
///
/// # Shapes
/// - `x`: as [`LinearInputs`]
/// - output: `y` as `x.info`, `state` `[N, H, D, D]`
///
/// # Errors
/// As the unpacked references, plus segments that do not cover the packed rows and an
/// `initial_state` that is not `[N, H, D, D]`.
pub fn naive_packed_linear_relation(
    x: LinearInputs,
    tau_s: f64,
    form: LinearForm,
) -> Result<LinearRelationOutput> {
    let LinearInputs {
        p1,
        p2,
        info,
        log_alpha,
        initial_state,
        segments,
    } = x;
    let Some(segments) = segments else {
        return match form {
            LinearForm::Recurrent => {
                naive_recurrent_linear_relation(p1, p2, info, log_alpha, tau_s, initial_state)
            }
            LinearForm::Chunked(c) => {
                naive_chunk_linear_relation(p1, p2, info, log_alpha, tau_s, initial_state, c)
            }
        };
    };
    let segments = &segments;
    packed_inputs(&p1, &p2, &info, tau_s, segments)?;
    check::same_bthd("log_alpha", &log_alpha, "p1", &check::bthd("p1", &p1)?)?;
    let [_, _, h, d] = p1.dims();
    if let Some(state) = &initial_state {
        let n = segments.count();
        check::exact_shape("initial_state", state, "[N, H, D, D]", [n, h, d, d])?;
        check::same_device("initial_state", state, &p1)?;
    }
    let mut ys = Vec::with_capacity(segments.count());
    let mut states = Vec::with_capacity(segments.count());
    for (n, seg) in segments.bounds().enumerate() {
        let h0 = initial_state.as_ref().map(|s| s.clone().narrow(0, n, 1)); // [1, H, D, D]
        let (q, k, v, g) = (
            rows(&p1, seg),
            rows(&p2, seg),
            rows(&info, seg),
            rows(&log_alpha, seg),
        );
        let out = match form {
            LinearForm::Recurrent => naive_recurrent_linear_relation(q, k, v, g, tau_s, h0)?,
            LinearForm::Chunked(c) => naive_chunk_linear_relation(q, k, v, g, tau_s, h0, c)?,
        };
        ys.push(out.y);
        states.push(out.state);
    }
    Ok(LinearRelationOutput {
        y: Tensor::cat(ys, 1),
        state: Tensor::cat(states, 0),
    })
}

/// RoPE over packed segments: every segment rotated from position 0.
///
/// # Shapes
/// - `x`: `[1, total, H, D]`, output: same
///
/// # Errors
/// As [`naive_rope`], plus segments that do not cover the packed rows.
pub fn naive_packed_rope(x: Tensor<4>, segments: &Segments, base: f64) -> Result<Tensor<4>> {
    segments.check_packed("x", &x.dims())?;
    let parts = segments
        .bounds()
        .map(|seg| naive_rope(rows(&x, seg), 0, base))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(parts, 1))
}
