//! Devices by name (`flex`, `wgpu:1`, `cuda:0`, …): the one parser that the `relation` command
//! line and the examples share, so every tool accepts the same names and says the same thing
//! about a backend that is missing from its build.
//!
//! It lives here rather than in the trainer because this is the lowest crate that forwards every
//! backend feature: whichever features a binary is built with, they reach this crate too, so
//! `cfg!(feature = …)` here sees exactly the backends the binary can run.

use burn::tensor::Device;
#[cfg(any(feature = "wgpu", feature = "vulkan", feature = "metal"))]
use burn::tensor::DeviceKind;
use thiserror::Error;

/// A device name that cannot be used in this build.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("device `{name}`: {reason}")]
pub struct DeviceError {
    /// The name as given (e.g. `rocm:0`).
    pub name: String,
    /// Why it cannot be used, naming what would make it work (a cargo feature, a valid index).
    pub reason: String,
}

/// Device names this build accepts (depends on the cargo features it was built with);
/// `[:N]` marks the ones that take an index.
pub fn compiled_devices() -> Vec<&'static str> {
    [
        (cfg!(feature = "flex"), "flex"),
        (cfg!(feature = "ndarray"), "ndarray"),
        (cfg!(feature = "wgpu"), "wgpu[:N]"),
        (cfg!(feature = "vulkan"), "vulkan[:N]"),
        (cfg!(feature = "metal"), "metal"),
        (cfg!(feature = "cuda"), "cuda[:N]"),
        (cfg!(feature = "rocm"), "rocm[:N]"),
        (cfg!(feature = "cpu"), "cpu"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect()
}

/// Every backend name the parser knows, compiled in or not. Each is also the cargo feature that
/// adds it, which is what the error for a missing one tells the user to enable.
const BACKENDS: &[&str] = &[
    "flex", "ndarray", "wgpu", "vulkan", "metal", "cuda", "rocm", "cpu",
];

/// Parses `flex`, `wgpu`, `wgpu:1` (the second discrete GPU), `vulkan`, `metal`, `cuda:0`,
/// `rocm:0`, `cpu` (CubeCL's CPU runtime), `ndarray`.
///
/// # Errors
/// [`DeviceError`] for an unknown name, a bad index, or a backend this binary was not built
/// with (naming the cargo feature that adds it and the names that are available).
pub fn parse_device(spec: &str) -> Result<Device, DeviceError> {
    let fail = |reason: String| DeviceError {
        name: spec.into(),
        reason,
    };
    let (backend, index) = match spec.split_once(':') {
        Some((b, i)) => {
            let index = i.parse::<usize>().map_err(|_| {
                fail(format!(
                    "`{i}` is not a device index (expected a number, e.g. cuda:0)"
                ))
            })?;
            (b, Some(index))
        }
        None => (spec, None),
    };
    let Some(&feature) = BACKENDS.iter().find(|&&b| b == backend) else {
        return Err(fail(format!(
            "unknown backend; this build has: {}",
            compiled_devices().join(", ")
        )));
    };
    // The CPU backends have one device each: an index there is a mistake, not a choice.
    let no_index = |device: Device| match index {
        Some(_) => Err(fail(format!("`{backend}` takes no index"))),
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
            Err(fail(format!(
                "not compiled into this build; rebuild with `--features {feature}` (this build has: {})",
                compiled_devices().join(", ")
            )))
        }
    }
}
