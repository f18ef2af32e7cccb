//! `--device NAME[:INDEX]`: the backends compiled into this build, chosen at run time.

use burn::tensor::Device;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "metal"))]
use burn::tensor::DeviceKind;

use crate::{Result, TrainError};

/// Device names this build accepts (depends on the cargo features it was built with).
pub fn compiled_devices() -> Vec<&'static str> {
    let mut names = Vec::new();
    if cfg!(feature = "flex") {
        names.push("flex");
    }
    if cfg!(feature = "ndarray") {
        names.push("ndarray");
    }
    if cfg!(feature = "wgpu") {
        names.push("wgpu[:N]");
    }
    if cfg!(feature = "vulkan") {
        names.push("vulkan[:N]");
    }
    if cfg!(feature = "metal") {
        names.push("metal");
    }
    if cfg!(feature = "cuda") {
        names.push("cuda[:N]");
    }
    if cfg!(feature = "rocm") {
        names.push("rocm[:N]");
    }
    if cfg!(feature = "cpu") {
        names.push("cpu");
    }
    names
}

/// The cargo feature that provides `backend`, if it is one we know.
fn feature_of(backend: &str) -> Option<&'static str> {
    Some(match backend {
        "flex" => "flex",
        "ndarray" => "ndarray",
        "wgpu" => "wgpu",
        "vulkan" => "vulkan",
        "metal" => "metal",
        "cuda" => "cuda",
        "rocm" => "rocm",
        "cpu" => "cpu",
        _ => return None,
    })
}

/// Parses `flex`, `wgpu`, `wgpu:1` (the second discrete GPU), `vulkan`, `metal`, `cuda:0`,
/// `rocm:0`, `cpu`, `ndarray`.
///
/// # Errors
/// [`TrainError::Device`] for an unknown name, a bad index, or a backend this binary was not
/// built with (naming the cargo feature that adds it and the names that are available).
pub fn parse_device(spec: &str) -> Result<Device> {
    let (backend, index) = match spec.split_once(':') {
        Some((b, i)) => {
            let index = i.parse::<usize>().map_err(|_| TrainError::Device {
                name: spec.into(),
                reason: format!("`{i}` is not a device index (expected a number, e.g. cuda:0)"),
            })?;
            (b, Some(index))
        }
        None => (spec, None),
    };
    let unavailable = |reason: String| TrainError::Device {
        name: spec.into(),
        reason,
    };
    let Some(feature) = feature_of(backend) else {
        return Err(unavailable(format!(
            "unknown backend; this build has: {}",
            compiled_devices().join(", ")
        )));
    };
    let no_index = |device: Device| match index {
        Some(_) => Err(unavailable(format!("`{backend}` takes no index"))),
        None => Ok(device),
    };
    #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "metal"))]
    let kind = match index {
        Some(i) => DeviceKind::DiscreteGpu(i),
        None => DeviceKind::DefaultDevice,
    };
    match backend {
        #[cfg(feature = "flex")]
        "flex" => no_index(Device::flex()),
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)] // Burn 0.22 deprecates NdArray; it still works.
        "ndarray" => no_index(Device::ndarray()),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(Device::wgpu(kind)),
        #[cfg(feature = "vulkan")]
        "vulkan" => Ok(Device::vulkan(kind)),
        #[cfg(feature = "metal")]
        "metal" => Ok(Device::metal(kind)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Device::cuda(index.unwrap_or(0))),
        #[cfg(feature = "rocm")]
        "rocm" => Ok(Device::rocm(index.unwrap_or(0))),
        #[cfg(feature = "cpu")]
        "cpu" => no_index(Device::cpu()),
        _ => {
            let _ = no_index;
            Err(unavailable(format!(
                "not compiled into this build; rebuild with `--features {feature}` (this build has: {})",
                compiled_devices().join(", ")
            )))
        }
    }
}
