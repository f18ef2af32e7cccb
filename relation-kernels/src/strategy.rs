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
        match self {
            Self::Reference => Ok(false),
            Self::Auto => Ok(has_kernels(device)),
            Self::Fused if has_kernels(device) => Ok(true),
            Self::Fused => Err(crate::KernelError::FusedUnavailable {
                op,
                device: format!("{device:?}"),
            }),
        }
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
