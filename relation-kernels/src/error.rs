//! Errors of the kernel entry points.

use relation_core::RelationError;
use thiserror::Error;

/// Why a kernel entry point refused its inputs.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum KernelError {
    /// The inputs break a rule of the computation itself (shape, head count, tau…).
    #[error(transparent)]
    Invalid(#[from] RelationError),
    /// [`Strategy::Fused`](crate::Strategy::Fused) was asked for on a device without a fused
    /// kernel for the operation.
    #[error(
        "no fused `{op}` kernel on device {device}: it has one on {available}; use Strategy::Auto or Strategy::Reference"
    )]
    FusedUnavailable {
        /// The operation.
        op: &'static str,
        /// The devices that do have the kernel.
        available: &'static str,
        /// The device that was passed.
        device: String,
    },
    /// [`Strategy::Fused`](crate::Strategy::Fused) was asked for with a dtype the kernels do
    /// not take ([`KERNEL_DTYPES`](crate::KERNEL_DTYPES)).
    #[error(
        "no fused `{op}` kernel for dtype {dtype}: the kernels take f32, f16, bf16 and f64; use Strategy::Auto (the reference) or cast"
    )]
    UnsupportedDtype {
        /// The operation.
        op: &'static str,
        /// The dtype that was passed.
        dtype: String,
    },
    /// The device's runtime cannot compute in the inputs' dtype on this machine (see
    /// [`supports_dtype`](crate::device::supports_dtype)): refused before any kernel is built.
    #[error("`{op}` on device {device}: no {dtype} here: {why}")]
    DtypeUnavailable {
        /// The operation.
        op: &'static str,
        /// The device that was passed.
        device: String,
        /// The dtype that was passed.
        dtype: String,
        /// Why the device has no such arithmetic on this machine.
        why: &'static str,
    },
    /// The head dimension is larger than the kernel supports.
    #[error("`{op}` kernel supports head dims up to {max}, got D = {head_dim}")]
    HeadDimTooLarge {
        /// The operation.
        op: &'static str,
        /// The head dimension that was passed.
        head_dim: usize,
        /// The largest supported head dimension.
        max: usize,
    },
    /// The chunk size is not one the chunked kernel supports.
    #[error("`{op}`: chunk_size must be one of {allowed:?}, got {chunk_size}")]
    UnsupportedChunkSize {
        /// The operation.
        op: &'static str,
        /// The chunk size that was passed.
        chunk_size: usize,
        /// The supported chunk sizes.
        allowed: &'static [usize],
    },
    /// A Linear Relation mode written as text is none of `recurrent`, `chunked`, `chunked:N`.
    #[error(
        "`{given}` is not a Linear Relation mode: expected `recurrent`, `chunked` or `chunked:N` (N in 16, 32, 64)"
    )]
    BadMode {
        /// The text that was given.
        given: String,
    },
    /// An input an operation needs is missing, or one it cannot take was given (e.g. a decoding
    /// step without a state, or over a packed row).
    #[error("`{op}`: {what}")]
    BadInputs {
        /// The operation.
        op: &'static str,
        /// What is missing or not allowed.
        what: &'static str,
    },
    /// A decoding step's inputs that do not fit together.
    #[error("flash_relation_decode: {reason}")]
    DecodeInputs {
        /// The shapes or length at fault, and the rule.
        reason: String,
    },
}

/// Result alias of this crate.
pub type Result<T> = core::result::Result<T, KernelError>;
