//! Choosing between the fused kernel and the reference.

use burn::tensor::Device;

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

impl Strategy {
    /// Whether this strategy runs the fused kernel on `device`, or the error to return.
    pub(crate) fn use_fused(self, op: &'static str, device: &Device) -> crate::Result<bool> {
        let available = "CubeCL devices (wgpu, vulkan, metal, cuda, rocm, cpu) and Flex";
        self.decide(op, device, has_kernels(device), available)
    }

    /// As [`use_fused`](Self::use_fused) for operations whose only fused kernel is Flex's (the
    /// language-model element-wise ops): CubeCL devices take the reference, which Burn's fusion
    /// compiles into one kernel.
    pub(crate) fn use_fused_flex(self, op: &'static str, device: &Device) -> crate::Result<bool> {
        self.decide(op, device, is_flex(device), "Flex")
    }

    /// `Auto` fuses where `here` (the device has the kernel); `Fused` elsewhere is an error
    /// naming the devices that have it.
    fn decide(
        self,
        op: &'static str,
        device: &Device,
        here: bool,
        available: &'static str,
    ) -> crate::Result<bool> {
        let fused = match self {
            Self::Reference => false,
            Self::Auto => here,
            Self::Fused if here => true,
            Self::Fused => {
                return Err(crate::KernelError::FusedUnavailable {
                    op,
                    available,
                    device: format!("{device:?}"),
                });
            }
        };
        // `RUST_LOG=relation_kernels=debug` shows which path every call took (per call: at
        // `trace` the kernels add their tile sizes).
        tracing::debug!(
            op,
            strategy = ?self,
            ?device,
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
