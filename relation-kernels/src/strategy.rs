//! Choosing between the fused kernel and the reference.

use crate::error::{KernelError, Result};
use burn::tensor::{DType, Device, Tensor};

/// How an operation is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// The fused kernel where the device has one (CubeCL runtimes, Flex), the reference
    /// elsewhere.
    #[default]
    Auto,
    /// Always the `relation-core` reference (tensor ops; any device; autodiff by Burn).
    Reference,
    /// Always the fused kernel; an error on devices without one (NdArray).
    Fused,
}

/// The float dtypes the fused kernels take (f32 accumulation inside); any other dtype (a
/// quantized or 8-bit float tensor, say) runs the reference under [`Strategy::Auto`] and is
/// [`KernelError::UnsupportedDtype`](KernelError::UnsupportedDtype) under
/// [`Strategy::Fused`].
pub const KERNEL_DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

impl Strategy {
    /// Whether this strategy runs the fused kernel for `x` (its device and dtype), or the error
    /// to return.
    pub(crate) fn use_fused<const D: usize>(self, op: &'static str, x: &Tensor<D>) -> Result<bool> {
        let available = "CubeCL devices (wgpu, vulkan, metal, cuda, rocm, cpu) and Flex";
        self.decide(op, x, has_kernels(&x.device()), available)
    }

    /// As [`use_fused`](Self::use_fused) for operations whose only fused kernel is Flex's (the
    /// language-model element-wise ops): CubeCL devices take the reference, which Burn's fusion
    /// compiles into one kernel.
    pub(crate) fn use_fused_flex<const D: usize>(
        self,
        op: &'static str,
        x: &Tensor<D>,
    ) -> Result<bool> {
        self.decide(op, x, is_flex(&x.device()), "Flex")
    }

    /// `Auto` fuses where `here` (the device has the kernel) and the dtype is one the kernels
    /// take; `Fused` otherwise is an error naming what is missing.
    fn decide<const D: usize>(
        self,
        op: &'static str,
        x: &Tensor<D>,
        here: bool,
        available: &'static str,
    ) -> Result<bool> {
        let device = x.device();
        let dtype = x.dtype();
        if let Some(why) = crate::device::dtype_unavailable_because(&device, dtype) {
            // Either path would fail to load its kernels (Burn's own as well as ours).
            return Err(KernelError::DtypeUnavailable {
                op,
                device: format!("{device:?}"),
                dtype: format!("{dtype:?}"),
                why,
            });
        }
        let dtype_ok = KERNEL_DTYPES.contains(&dtype);
        let fused = match self {
            Self::Reference => false,
            Self::Auto => here && dtype_ok,
            Self::Fused if !here => {
                return Err(KernelError::FusedUnavailable {
                    op,
                    available,
                    device: format!("{device:?}"),
                });
            }
            Self::Fused if !dtype_ok => {
                return Err(KernelError::UnsupportedDtype {
                    op,
                    dtype: format!("{dtype:?}"),
                });
            }
            Self::Fused => true,
        };
        // `RUST_LOG=relation_kernels=debug` shows which path every call took (per call: at
        // `trace` the kernels add their tile sizes).
        tracing::debug!(
            op,
            strategy = ?self,
            ?device,
            ?dtype,
            path = if fused { "fused" } else { "reference" },
            "kernel choice"
        );
        Ok(fused)
    }
}

/// Whether `device` (autodiff or not) runs on a CubeCL runtime compiled into this build.
pub fn is_cube(device: &Device) -> bool {
    #[cfg(feature = "cube")]
    {
        matches!(
            device.clone().inner().as_dispatch(),
            burn::backend::DispatchDevice::Cube(_)
        )
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        false
    }
}

/// Whether `device` (autodiff or not) is Flex, which has its own fused CPU kernels in this build.
pub fn is_flex(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    {
        matches!(
            device.clone().inner().as_dispatch(),
            burn::backend::DispatchDevice::Flex(_)
        )
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = device;
        false
    }
}

/// Whether this build has fused kernels for `device`: every CubeCL runtime, and Flex.
pub fn has_kernels(device: &Device) -> bool {
    is_cube(device) || is_flex(device)
}
