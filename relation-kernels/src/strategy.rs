//! Choosing between the fused kernel and the reference.

use burn::tensor::Device;

/// How an operation is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// The fused kernel on CubeCL devices, the reference elsewhere.
    #[default]
    Auto,
    /// Always the `relation-core` reference (tensor ops; any device; autodiff by Burn).
    Reference,
    /// Always the fused kernel; an error on devices without CubeCL.
    Fused,
}

impl Strategy {
    /// Whether this strategy runs the fused kernel on `device`, or the error to return.
    pub(crate) fn use_fused(self, op: &'static str, device: &Device) -> crate::Result<bool> {
        match self {
            Self::Reference => Ok(false),
            Self::Auto => Ok(is_cube(device)),
            Self::Fused if is_cube(device) => Ok(true),
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
