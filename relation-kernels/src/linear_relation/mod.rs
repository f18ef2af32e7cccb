//! Tensor-level entry points of Linear Relation.

pub(crate) mod autodiff;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "cube")]
mod cube_chunk;
#[cfg(feature = "cube")]
mod cube_chunk_backward;
#[cfg(feature = "cube")]
mod cube_recurrent;
#[cfg(feature = "flex")]
pub(crate) mod flex;

use burn::backend::Dispatch;
use burn::tensor::Tensor;
use relation_core::{
    LinearForm, LinearRelationOutput, Segments, check, l2_normalize, naive_chunk_linear_relation,
    naive_packed_linear_relation, naive_recurrent_linear_relation, naive_self_relation,
};

use crate::ops::LinearParams;
use crate::{KernelError, RelationOps, Result, Strategy};

/// Largest head dimension of the fused Linear Relation kernels (one unit per state row/column).
pub const MAX_LINEAR_HEAD_DIM: usize = 256;

/// Chunk size of the reference fallback (`naive_chunk_linear_relation`) of
/// [`fused_recurrent_linear_relation`].
pub const REFERENCE_CHUNK: usize = 64;

/// Chunk sizes [`chunk_linear_relation`] accepts (on every device, so that a program behaves the
/// same everywhere): powers of two from 16 to 64. Larger chunks would cost the kernel
/// `O(L^2)` scores per chunk for no gain without matrix units; smaller ones are the recurrent
/// kernel's job.
pub const CHUNK_SIZES: &[usize] = &[16, 32, 64];

/// How Linear Relation runs over a sequence: the kernel [`linear_relation`] picks.
///
/// Both compute the same function (`docs/maths.md#6-linear-relation`) and carry the same state; they differ in speed and
/// rounding only. Measured (`examples/linear_relation_bench`, `docs/bench/cpu-ops.md` and
/// `docs/bench/cube-cpu.md`, B 1 H 8 D 64): on Flex the chunk size does not change the algorithm
/// and the recurrent form is as fast or faster at every T from 256 to 4096 (training 0.92x to
/// 1.08x of chunked, forward 0.44x to 1.03x); on CubeCL's CPU runtime the recurrent kernels train
/// 0.65x to 0.92x the chunked time. So [`Recurrent`](Self::Recurrent) is the default. GPUs with
/// matrix units are where the chunked form should win at long T: measure it there with
/// `scripts/gpu/run.sh` before choosing it.
///
/// Written in configs and on the command line as `recurrent`, `chunked` (chunk 64) or
/// `chunked:N` with `N` one of [`CHUNK_SIZES`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LinearRelationMode {
    /// Token by token ([`fused_recurrent_linear_relation`]): state in registers (GPU) or cache
    /// (CPU), `O(T D)` memory.
    #[default]
    Recurrent,
    /// Chunkwise parallel, GLA-style ([`chunk_linear_relation`]) with this many tokens per chunk,
    /// one of [`CHUNK_SIZES`].
    Chunked {
        /// Tokens per chunk.
        chunk_size: usize,
    },
}

impl LinearRelationMode {
    /// The chunked mode with the largest chunk (64).
    pub const CHUNKED: Self = Self::Chunked { chunk_size: 64 };

    /// Checks the chunk size.
    ///
    /// # Errors
    /// [`KernelError::UnsupportedChunkSize`] for a chunk size outside [`CHUNK_SIZES`].
    pub fn check(self) -> Result<Self> {
        match self {
            Self::Chunked { chunk_size } if !CHUNK_SIZES.contains(&chunk_size) => {
                Err(KernelError::UnsupportedChunkSize {
                    op: "chunk_linear_relation",
                    chunk_size,
                    allowed: CHUNK_SIZES,
                })
            }
            mode => Ok(mode),
        }
    }

    /// The entry point this mode runs, for messages and logs.
    pub fn op_name(self) -> &'static str {
        match self {
            Self::Recurrent => "fused_recurrent_linear_relation",
            Self::Chunked { .. } => "chunk_linear_relation",
        }
    }
}

impl std::fmt::Display for LinearRelationMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Recurrent => f.write_str("recurrent"),
            Self::Chunked { chunk_size } => write!(f, "chunked:{chunk_size}"),
        }
    }
}

impl std::str::FromStr for LinearRelationMode {
    type Err = KernelError;

    /// `recurrent`, `chunked` (= `chunked:64`) or `chunked:N`.
    fn from_str(s: &str) -> Result<Self> {
        let mode = match s.split_once(':') {
            None if s == "recurrent" => Self::Recurrent,
            None if s == "chunked" => Self::CHUNKED,
            Some(("chunked", n)) => Self::Chunked {
                chunk_size: n.parse().map_err(|_| KernelError::BadMode {
                    given: s.to_string(),
                })?,
            },
            _ => {
                return Err(KernelError::BadMode {
                    given: s.to_string(),
                });
            }
        };
        mode.check()
    }
}

fn check_inputs(
    p1: &Tensor<4>,
    p2: &Tensor<4>,
    info: &Tensor<4>,
    log_alpha: &Tensor<4>,
    tau: f64,
    state: Option<&Tensor<4>>,
) -> Result<check::Bthd> {
    let dims = check::relation_inputs(p1, p2, info, tau)?;
    check::same_bthd("log_alpha", log_alpha, "p1", &dims)?;
    check::same_device("log_alpha", log_alpha, p1)?;
    if let Some(state) = state {
        let [b, _, h, d] = dims.dims();
        check::exact_shape("initial_state", state, "[B, H, D, D]", [b, h, d, d])?;
        check::same_device("initial_state", state, p1)?;
    }
    Ok(dims)
}

/// The fused path: prepare `q = S p̂1`, `k = S p̂2` with tensor ops (differentiable), run the
/// kernel over the `N` sequences of the call (`B` rows, or the segments of one packed row), split
/// the bundled output.
#[allow(clippy::too_many_arguments)]
fn fused(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau: f64,
    state: Option<Tensor<4>>,
    dims: check::Bthd,
    params: LinearParams,
) -> Result<LinearRelationOutput> {
    let [b, t, h, d] = dims.dims();
    if d > MAX_LINEAR_HEAD_DIM {
        return Err(KernelError::HeadDimTooLarge {
            op: params.mode.op_name(),
            head_dim: d,
            max: MAX_LINEAR_HEAD_DIM,
        });
    }
    let per_row = params.per_row();
    let s = naive_self_relation(p1.clone(), p2.clone(), tau)?.unsqueeze_dim::<4>(3); // [B, T, H, 1]
    let q = l2_normalize(p1) * s.clone(); // S_t p̂1_t
    let k = l2_normalize(p2) * s; // S_t p̂2_t
    let n = b * per_row; // sequences
    let state = state.unwrap_or_else(|| Tensor::zeros([n, h, d, d], (&q.device(), q.dtype())));
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

/// [`fused`] for one unpacked call in `mode`.
fn fused_rows(
    [p1, p2, info, log_alpha]: [Tensor<4>; 4],
    tau: f64,
    state: Option<Tensor<4>>,
    dims: check::Bthd,
    mode: LinearRelationMode,
) -> Result<LinearRelationOutput> {
    let params = LinearParams {
        mode,
        segments: None,
    };
    fused(p1, p2, info, log_alpha, tau, state, dims, params)
}

/// Linear Relation (`docs/maths.md#6-linear-relation`) over a sequence, token by token, carrying a state in and out, on any
/// device.
///
/// On CubeCL devices the fused recurrent kernels run (state in registers, `O(T D)` memory, a
/// fused backward for `p1`, `p2`, `info`, `log_alpha` and `initial_state` under autodiff).
/// `S_t` and the L2 normalisation are computed here with tensor ops, so their gradients come
/// from Burn's autodiff. Elsewhere (or with [`Strategy::Reference`]) it is
/// `relation_core::naive_chunk_linear_relation` with chunks of [`REFERENCE_CHUNK`].
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha`: `[B, T, H, D]` (`log_alpha <= 0`)
/// - `initial_state`: `[B, H, D, D]` (zeros when `None`)
/// - output: `y` `[B, T, H, D]`, `state` `[B, H, D, D]`
///
/// # Errors
/// Everything the references refuse, plus [`KernelError::FusedUnavailable`] and
/// [`KernelError::HeadDimTooLarge`] on the fused path.
pub fn fused_recurrent_linear_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau: f64,
    initial_state: Option<Tensor<4>>,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    let dims = check_inputs(&p1, &p2, &info, &log_alpha, tau, initial_state.as_ref())?;
    if strategy.use_fused("fused_recurrent_linear_relation", &p1)? {
        fused_rows(
            [p1, p2, info, log_alpha],
            tau,
            initial_state,
            dims,
            LinearRelationMode::Recurrent,
        )
    } else {
        Ok(naive_chunk_linear_relation(
            p1,
            p2,
            info,
            log_alpha,
            tau,
            initial_state,
            REFERENCE_CHUNK,
        )?)
    }
}

/// Decoding: advance a Linear Relation state by one token (or a few), returning their outputs
/// and the new state. The same fused kernel as [`fused_recurrent_linear_relation`]; the reference
/// is the token loop `naive_recurrent_linear_relation`. Prefill with [`linear_relation`] in any
/// mode, then advance the returned state with this.
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha`: `[B, T, H, D]`, usually `T = 1`
/// - `state`: `[B, H, D, D]`
/// - output: `y` `[B, T, H, D]`, `state` `[B, H, D, D]`
///
/// # Errors
/// As [`fused_recurrent_linear_relation`].
pub fn linear_relation_step(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau: f64,
    state: Tensor<4>,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    let dims = check_inputs(&p1, &p2, &info, &log_alpha, tau, Some(&state))?;
    if strategy.use_fused("linear_relation_step", &p1)? {
        fused_rows(
            [p1, p2, info, log_alpha],
            tau,
            Some(state),
            dims,
            LinearRelationMode::Recurrent,
        )
    } else {
        Ok(naive_recurrent_linear_relation(
            p1,
            p2,
            info,
            log_alpha,
            tau,
            Some(state),
        )?)
    }
}

/// Linear Relation (`docs/maths.md#7-chunked-linear-relation`) with the chunked (chunkwise-parallel, GLA-style) algorithm, carrying
/// a state in and out, on any device.
///
/// On CubeCL devices two fused kernels run (`cube::chunk_linear_relation`): a sequential pass
/// over the chunks that stores each chunk-start state, then one cube per chunk for the
/// inter-chunk term (`q_t ⊙ e^{b_t}` against the chunk-start state) plus the strictly-lower
/// intra-chunk term (scores `sum_k q_t[k] k_j[k] e^{b_t[k] - b_j[k]}`, `j < t`), with cumulative
/// log gates formed per chunk in f32 so that no exponent is positive. Under autodiff the
/// gradients of `p1`, `p2`, `info`, `log_alpha` and `initial_state` come from the chunked
/// backward kernels (a reverse pass over the chunks for the state gradients, then one cube per
/// chunk for `dq`, `dk`, `dv`); `S_t` and the L2 normalisation are tensor ops here, as in
/// [`fused_recurrent_linear_relation`]. Elsewhere (or with [`Strategy::Reference`]) it is
/// `relation_core::naive_chunk_linear_relation` with the same `chunk_size`.
///
/// `chunk_size` must be one of [`CHUNK_SIZES`] (16, 32, 64) on every device. The result does not
/// depend on it beyond rounding; `T` need not be a multiple of it.
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha`: `[B, T, H, D]` (`log_alpha <= 0`), `D <= 256`
/// - `initial_state`: `[B, H, D, D]` (zeros when `None`)
/// - output: `y` `[B, T, H, D]`, `state` `[B, H, D, D]`
///
/// # Errors
/// [`KernelError::UnsupportedChunkSize`], everything the references refuse, plus
/// [`KernelError::FusedUnavailable`] and [`KernelError::HeadDimTooLarge`] on the fused path.
#[allow(clippy::too_many_arguments)] // the signature: inputs, tau, state, chunk, strategy
pub fn chunk_linear_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau: f64,
    initial_state: Option<Tensor<4>>,
    chunk_size: usize,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    LinearRelationMode::Chunked { chunk_size }.check()?;
    let dims = check_inputs(&p1, &p2, &info, &log_alpha, tau, initial_state.as_ref())?;
    if strategy.use_fused("chunk_linear_relation", &p1)? {
        fused_rows(
            [p1, p2, info, log_alpha],
            tau,
            initial_state,
            dims,
            LinearRelationMode::Chunked { chunk_size },
        )
    } else {
        Ok(naive_chunk_linear_relation(
            p1,
            p2,
            info,
            log_alpha,
            tau,
            initial_state,
            chunk_size,
        )?)
    }
}

/// Linear Relation (`docs/maths.md#6-linear-relation`) over a sequence in the given [`LinearRelationMode`]: the entry point
/// the model uses. [`LinearRelationMode::Recurrent`] is [`fused_recurrent_linear_relation`],
/// [`LinearRelationMode::Chunked`] is [`chunk_linear_relation`] with its chunk size.
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha`: `[B, T, H, D]` (`log_alpha <= 0`)
/// - `initial_state`: `[B, H, D, D]` (zeros when `None`)
/// - output: `y` `[B, T, H, D]`, `state` `[B, H, D, D]`
///
/// # Errors
/// As the entry point the mode names.
#[allow(clippy::too_many_arguments)] // inputs, tau, state, mode, strategy
pub fn linear_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau: f64,
    initial_state: Option<Tensor<4>>,
    mode: LinearRelationMode,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    match mode {
        LinearRelationMode::Recurrent => {
            fused_recurrent_linear_relation(p1, p2, info, log_alpha, tau, initial_state, strategy)
        }
        LinearRelationMode::Chunked { chunk_size } => chunk_linear_relation(
            p1,
            p2,
            info,
            log_alpha,
            tau,
            initial_state,
            chunk_size,
            strategy,
        ),
    }
}

/// [`linear_relation`] over packed documents: `N` segments back to back in one
/// `[1, total, H, D]` row; segment `n` starts from `initial_state[n]` (zero when `None`) and ends
/// in `state[n]`, exactly as if run alone, with gradients to both.
///
/// On Flex and CubeCL devices one launch covers every segment: one task (Flex) or cube (CubeCL)
/// per `(segment, head)`, each reading only its own segment's rows, so a row of many short
/// documents costs what its tokens cost. CubeCL's chunked kernels take equal rows, so there a
/// chunked call launches them once per segment, on its rows (chunks restart at every segment
/// start). Elsewhere (or with [`Strategy::Reference`]) it is
/// `relation_core::naive_packed_linear_relation`, segment by segment, with the chunk size of
/// `mode` ([`REFERENCE_CHUNK`] for the recurrent mode, as [`linear_relation`]).
///
/// # Shapes
/// - `p1`, `p2`, `info`, `log_alpha`: `[1, total, H, D]`; `segments` end at `total`
/// - `initial_state`: `[N, H, D, D]`
/// - output: `y` `[1, total, H, D]`, `state` `[N, H, D, D]`
///
/// # Errors
/// As [`linear_relation`], plus segments that do not cover the packed rows (or a batch other
/// than 1) and an `initial_state` that is not `[N, H, D, D]`.
#[allow(clippy::too_many_arguments)] // inputs, tau, state, segments, mode, strategy
pub fn linear_relation_packed(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    log_alpha: Tensor<4>,
    tau: f64,
    initial_state: Option<Tensor<4>>,
    segments: &Segments,
    mode: LinearRelationMode,
    strategy: Strategy,
) -> Result<LinearRelationOutput> {
    mode.check()?;
    let dims = check_inputs(&p1, &p2, &info, &log_alpha, tau, None)?;
    segments.check_packed("p1", &p1.dims())?;
    let [_, _, h, d] = dims.dims();
    if let Some(state) = &initial_state {
        check::exact_shape(
            "initial_state",
            state,
            "[N, H, D, D]",
            [segments.count(), h, d, d],
        )?;
        check::same_device("initial_state", state, &p1)?;
    }
    if strategy.use_fused(mode.op_name(), &p1)? {
        let params = LinearParams {
            mode,
            segments: Some(segments.clone()),
        };
        fused(p1, p2, info, log_alpha, tau, initial_state, dims, params)
    } else {
        let form = match mode {
            LinearRelationMode::Recurrent => LinearForm::Chunked(REFERENCE_CHUNK),
            LinearRelationMode::Chunked { chunk_size } => LinearForm::Chunked(chunk_size),
        };
        Ok(naive_packed_linear_relation(
            p1,
            p2,
            info,
            log_alpha,
            tau,
            initial_state,
            segments,
            form,
        )?)
    }
}
