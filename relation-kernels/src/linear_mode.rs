//! How Linear Relation runs over a sequence ([`LinearRelationMode`]) and the chunk sizes it
//! takes: shared by the entry points and the backend extension's parameters.

use crate::error::{KernelError, Result};

/// Chunk size of the reference fallback (`naive_chunk_linear_relation`) of
/// [`fused_recurrent_linear_relation`](crate::fused_recurrent_linear_relation).
pub const REFERENCE_CHUNK: usize = 64;

/// Chunk sizes [`chunk_linear_relation`](crate::chunk_linear_relation) accepts (on every device, so that a program behaves the
/// same everywhere): powers of two from 16 to 64. Larger chunks would cost the kernel
/// `O(L^2)` scores per chunk for no gain without matrix units; smaller ones are the recurrent
/// kernel's job.
pub const CHUNK_SIZES: &[usize] = &[16, 32, 64];

/// How Linear Relation runs over a sequence: the kernel [`linear_relation`](crate::linear_relation) picks.
///
/// Both compute the same function (`docs/maths.md#6-linear-relation`) and carry the same state;
/// they differ in speed and rounding only. [`Recurrent`](Self::Recurrent) is the default: on the
/// CPUs measured it is as fast as the chunked form or faster at every length
/// (`examples/linear_relation_bench`; the tables are in `docs/bench/cpu-ops.md` and
/// `docs/bench/cube-cpu.md`). GPUs with matrix units are where the chunked form should win at
/// long T: measure it there with `scripts/gpu/run.sh` before choosing it.
///
/// Written in configs and on the command line as `recurrent`, `chunked` (chunk 64) or
/// `chunked:N` with `N` one of [`CHUNK_SIZES`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LinearRelationMode {
    /// Token by token ([`fused_recurrent_linear_relation`](crate::fused_recurrent_linear_relation)): state in registers (GPU) or cache
    /// (CPU), `O(T D)` memory.
    #[default]
    Recurrent,
    /// Chunkwise parallel, GLA-style ([`chunk_linear_relation`](crate::chunk_linear_relation)) with this many tokens per chunk,
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
