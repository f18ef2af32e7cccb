//! Tensor-level entry points of Linear Relation.

pub(crate) mod autodiff;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "cube")]
mod cube_chunk;
#[cfg(feature = "cube")]
mod cube_chunk_states_tiles;
#[cfg(feature = "cube")]
mod cube_chunk_tiles;
#[cfg(all(feature = "testing", feature = "cuda"))]
pub(crate) use cube_chunk_states_tiles::{
    states_definition as chunk_states_definition, states_for_limits as chunk_states_for_limits,
};
#[cfg(all(feature = "testing", feature = "cuda"))]
pub(crate) use cube_chunk_tiles::{
    output_definition as chunk_output_definition, tiles_for_limits as chunk_tiles_for_limits,
};
#[cfg(feature = "cube")]
mod cube_chunk_backward;
#[cfg(feature = "cube")]
mod cube_recurrent;
#[cfg(feature = "flex")]
pub(crate) mod flex;
#[cfg(any(feature = "flex", feature = "cube"))]
pub(crate) mod step;

use burn::backend::Dispatch;
use burn::tensor::Tensor;
use relation_core::{
    LinearForm, LinearInputs, LinearRelationOutput, check, l2_normalize,
    naive_packed_linear_relation, naive_recurrent_linear_relation, naive_self_relation,
};

pub use crate::linear_mode::{CHUNK_SIZES, LinearRelationMode, REFERENCE_CHUNK};

use crate::error::{KernelError, Result};
use crate::ops::{LinearParams, RelationOps};
use crate::strategy::Strategy;

/// Largest head dimension of the fused Linear Relation kernels (one unit per state row/column).
pub const MAX_LINEAR_HEAD_DIM: usize = 256;

/// Checks `x` and returns its dimensions.
fn check_inputs(x: &LinearInputs, tau: f64) -> Result<check::Bthd> {
    let dims = check::relation_inputs(&x.p1, &x.p2, &x.info, tau)?;
    check::same_bthd("log_alpha", &x.log_alpha, "p1", &dims)?;
    check::same_device("log_alpha", &x.log_alpha, &x.p1)?;
    let [b, _, h, d] = dims.dims();
    let n = match &x.segments {
        Some(segments) => {
            segments.check_packed("p1", &x.p1.dims())?;
            segments.count()
        }
        None => b,
    };
    if let Some(state) = &x.initial_state {
        check::exact_shape("initial_state", state, "[N, H, D, D]", [n, h, d, d])?;
        check::same_device("initial_state", state, &x.p1)?;
    }
    Ok(dims)
}

/// The fused path: prepare `q = S p̂1`, `k = S p̂2` with tensor ops (differentiable), run the
/// kernel over the `N` sequences of the call (`B` rows, or the segments of one packed row), split
/// the bundled output.
fn fused(
    x: LinearInputs,
    tau: f64,
    dims: check::Bthd,
    mode: LinearRelationMode,
) -> Result<LinearRelationOutput> {
    let [b, t, h, d] = dims.dims();
    if d > MAX_LINEAR_HEAD_DIM {
        return Err(KernelError::HeadDimTooLarge {
            op: mode.op_name(),
            head_dim: d,
            max: MAX_LINEAR_HEAD_DIM,
        });
    }
    let LinearInputs {
        p1,
        p2,
        info,
        log_alpha,
        initial_state,
        segments,
    } = x;
    let params = LinearParams { mode, segments };
    let per_row = params.per_row();
    let s = naive_self_relation(p1.clone(), p2.clone(), tau)?.unsqueeze_dim::<4>(3); // [B, T, H, 1]
    let q = l2_normalize(p1) * s.clone(); // S_t p̂1_t
    let k = l2_normalize(p2) * s; // S_t p̂2_t
    let n = b * per_row; // sequences
    let state =
        initial_state.unwrap_or_else(|| Tensor::zeros([n, h, d, d], (&q.device(), q.dtype())));
    let (q, k, v, g, h0) = (
        q.into_dispatch(),
        k.into_dispatch(),
        info.into_dispatch(),
        log_alpha.into_dispatch(),
        state.into_dispatch(),
    );
    let out = Tensor::<4>::from_dispatch(Dispatch::linear_relation(q, k, v, g, h0, params)); // [B, H, T + per_row D, D]
    let state = out
        .clone()
        .narrow(2, t, per_row * d) // [B, H, per_row D, D]
        .reshape([b, h, per_row, d, d])
        .swap_dims(1, 2) // [B, per_row, H, D, D]
        .reshape([n, h, d, d]); // [N, H, D, D]
    Ok(LinearRelationOutput {
        y: out.narrow(2, 0, t).swap_dims(1, 2), // [B, T, H, D]
        state,
    })
}

/// One token per sequence through [`step::LinearStepOps`]: one launch.
#[cfg(any(feature = "flex", feature = "cube"))]
fn one_step(x: LinearInputs, tau: f64, dims: check::Bthd) -> Result<LinearRelationOutput> {
    let [_, _, _, d] = dims.dims();
    let params = step::StepParams {
        scale: (1.0 / ((d as f64).sqrt() * tau)) as f32,
        eps: relation_core::linear::L2_NORM_EPS as f32,
    };
    let LinearInputs {
        p1,
        p2,
        info,
        log_alpha,
        initial_state,
        ..
    } = x;
    let state = initial_state.expect("the caller checked that a state is given");
    use step::LinearStepOps;
    let out = Tensor::<1>::from_dispatch(Dispatch::linear_relation_one_step(
        p1.into_dispatch(),
        p2.into_dispatch(),
        info.into_dispatch(),
        log_alpha.into_dispatch(),
        state.into_dispatch(),
        params,
    )); // [B·H·D·D + B·H·D]: the new state, then y
    let [b, _, h, _] = dims.dims();
    let states = b * h * d * d;
    Ok(LinearRelationOutput {
        y: out
            .clone()
            .narrow(0, states, b * h * d)
            .reshape([b, 1, h, d]),
        state: out.narrow(0, 0, states).reshape([b, h, d, d]),
    })
}

/// The reference for `x`: chunked with `chunk` (packed: document by document).
fn reference(x: LinearInputs, tau: f64, chunk: usize) -> Result<LinearRelationOutput> {
    Ok(naive_packed_linear_relation(
        x,
        tau,
        LinearForm::Chunked(chunk),
    )?)
}

/// Linear Relation (`docs/maths.md#6-linear-relation`) over a sequence, token by token, carrying
/// a state in and out, on any device.
///
/// On Flex and CubeCL devices the fused recurrent kernels run (state in cache or registers,
/// `O(T D)` memory, a fused backward for `p1`, `p2`, `info`, `log_alpha` and `initial_state`
/// under autodiff). `S_t` and the L2 normalisation are computed here with tensor ops, so their
/// gradients come from Burn's autodiff. Elsewhere (or with [`Strategy::Reference`]) it is
/// `relation_core::naive_chunk_linear_relation` with chunks of [`REFERENCE_CHUNK`] (packed:
/// `naive_packed_linear_relation`).
///
/// # Shapes
/// - `x`: as [`LinearInputs`]
/// - output: `y` as `x.info`, `state` `[N, H, D, D]`
///
/// # Errors
/// Everything the references refuse, segments that do not cover a packed row (or a batch other
/// than 1), an `initial_state` that is not `[N, H, D, D]`, plus
/// [`KernelError::FusedUnavailable`] and [`KernelError::HeadDimTooLarge`] on the fused path.
pub fn fused_recurrent_linear_relation(
    x: LinearInputs,
    tau: f64,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    let dims = check_inputs(&x, tau)?;
    if strategy.use_fused("fused_recurrent_linear_relation", &x.p1)? {
        fused(x, tau, dims, LinearRelationMode::Recurrent)
    } else {
        reference(x, tau, REFERENCE_CHUNK)
    }
}

/// Decoding: advance a Linear Relation state by one token (or a few), returning their outputs
/// and the new state. One token with nothing to differentiate is one launch (`step.rs`: `S_t`,
/// the L2 normalisations and the state update in one kernel on CubeCL runtimes, one pass on
/// Flex); otherwise the same fused kernel as [`fused_recurrent_linear_relation`]. The reference
/// is the token loop `naive_recurrent_linear_relation`. Prefill with [`linear_relation`] in any
/// mode, then advance the returned state with this.
///
/// # Shapes
/// - `x`: as [`LinearInputs`], unpacked, usually `T = 1`, with `initial_state` `[B, H, D, D]`
/// - output: `y` `[B, T, H, D]`, `state` `[B, H, D, D]`
///
/// # Errors
/// As [`fused_recurrent_linear_relation`], plus [`KernelError::BadInputs`] without an
/// `initial_state` or with `segments`.
pub fn linear_relation_step(
    x: LinearInputs,
    tau: f64,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    const OP: &str = "linear_relation_step";
    if x.initial_state.is_none() {
        return Err(KernelError::BadInputs {
            op: OP,
            what: "a decoding step needs the state to advance (`initial_state`)",
        });
    }
    if x.segments.is_some() {
        return Err(KernelError::BadInputs {
            op: OP,
            what: "a decoding step takes one sequence per row, not a packed row",
        });
    }
    let dims = check_inputs(&x, tau)?;
    if strategy.use_fused(OP, &x.p1)? {
        // The one-launch step exists only where the kernels do (`use_fused` is false elsewhere).
        #[cfg(any(feature = "flex", feature = "cube"))]
        {
            let needs_grad = [&x.p1, &x.p2, &x.info, &x.log_alpha]
                .into_iter()
                .chain(&x.initial_state)
                .any(Tensor::is_require_grad);
            if dims.seq == 1 && !needs_grad {
                return one_step(x, tau, dims);
            }
        }
        fused(x, tau, dims, LinearRelationMode::Recurrent)
    } else {
        let LinearInputs {
            p1,
            p2,
            info,
            log_alpha,
            initial_state,
            ..
        } = x;
        Ok(naive_recurrent_linear_relation(
            p1,
            p2,
            info,
            log_alpha,
            tau,
            initial_state,
        )?)
    }
}

/// Linear Relation (`docs/maths.md#7-chunked-linear-relation`) with the chunked
/// (chunkwise-parallel, GLA-style) algorithm, carrying a state in and out, on any device.
///
/// On CubeCL devices two fused kernels run (`cube::chunk_linear_relation`): a sequential pass
/// over the chunks that stores each chunk-start state, then one cube per chunk for the
/// inter-chunk term (`q_t ⊙ e^{b_t}` against the chunk-start state) plus the strictly-lower
/// intra-chunk term (scores `sum_k q_t[k] k_j[k] e^{b_t[k] - b_j[k]}`, `j < t`), with cumulative
/// log gates formed per chunk in f32 so that no exponent is positive. Under autodiff the
/// gradients of `p1`, `p2`, `info`, `log_alpha` and `initial_state` come from the chunked
/// backward kernels (a reverse pass over the chunks for the state gradients, then one cube per
/// chunk for `dq`, `dk`, `dv`); `S_t` and the L2 normalisation are tensor ops here, as in
/// [`fused_recurrent_linear_relation`]. CubeCL's chunked kernels take equal rows, so a packed
/// call launches them once per document, on its rows (chunks restart at every document start).
/// Flex runs its chunk-checkpointed scan. Elsewhere (or with [`Strategy::Reference`]) it is
/// `relation_core::naive_chunk_linear_relation` with the same `chunk_size`.
///
/// `chunk_size` must be one of [`CHUNK_SIZES`] (16, 32, 64) on every device. The result does not
/// depend on it beyond rounding; `T` need not be a multiple of it.
///
/// # Shapes
/// - `x`: as [`LinearInputs`], `D <= 256`
/// - output: `y` as `x.info`, `state` `[N, H, D, D]`
///
/// # Errors
/// [`KernelError::UnsupportedChunkSize`], then as [`fused_recurrent_linear_relation`].
pub fn chunk_linear_relation(
    x: LinearInputs,
    tau: f64,
    chunk_size: usize,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    let mode = LinearRelationMode::Chunked { chunk_size }.check()?;
    let dims = check_inputs(&x, tau)?;
    if strategy.use_fused("chunk_linear_relation", &x.p1)? {
        fused(x, tau, dims, mode)
    } else {
        reference(x, tau, chunk_size)
    }
}

/// Linear Relation (`docs/maths.md#6-linear-relation`) over a sequence in the given
/// [`LinearRelationMode`]: the entry point the model uses. [`LinearRelationMode::Recurrent`] is
/// [`fused_recurrent_linear_relation`], [`LinearRelationMode::Chunked`] is
/// [`chunk_linear_relation`] with its chunk size.
///
/// # Shapes
/// - `x`: as [`LinearInputs`]
/// - output: `y` as `x.info`, `state` `[N, H, D, D]`
///
/// # Errors
/// As the entry point the mode names.
pub fn linear_relation(
    x: LinearInputs,
    tau: f64,
    mode: LinearRelationMode,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    match mode {
        LinearRelationMode::Recurrent => fused_recurrent_linear_relation(x, tau, strategy),
        LinearRelationMode::Chunked { chunk_size } => {
            chunk_linear_relation(x, tau, chunk_size, strategy)
        }
    }
}
