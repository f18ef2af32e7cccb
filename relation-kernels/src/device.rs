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

/// Whether `device` (autodiff or not) computes in `dtype` on this machine: Burn's
/// `Device::supports_dtype`, refined where a runtime registers a dtype that the host it runs on
/// cannot compile.
///
/// The one such case known: CubeCL's CPU runtime registers bf16 everywhere, but its LLVM JIT
/// turns every f32 → bf16 rounding into the CPU's own conversion instruction when the CPU has
/// one (x86-64: AVX512-BF16 or AVX-NE-CONVERT) and otherwise into a call to a runtime helper
/// (`__truncsfbf2`) that the JIT cannot resolve, so every bf16 kernel, Burn's own included,
/// fails to load there (an AMD EPYC of family 23, say). Checked here, a bf16 call on such a
/// machine is refused with [`KernelError::DtypeUnavailable`](crate::KernelError::DtypeUnavailable)
/// before any kernel is built, and the trainer refuses `--precision bf16` on it.
pub fn supports_dtype(device: &Device, dtype: burn::tensor::DType) -> bool {
    device.supports_dtype(dtype) && dtype_unavailable_because(device, dtype).is_none()
}

/// Why `device` cannot compute in `dtype` on this machine although its runtime registers it
/// (see [`supports_dtype`]); `None` when nothing is known against it.
pub fn dtype_unavailable_because(
    device: &Device,
    dtype: burn::tensor::DType,
) -> Option<&'static str> {
    #[cfg(feature = "cpu")]
    {
        // Cheapest test first: every kernel call asks, and only bf16 can be refused.
        let cube_cpu = || {
            matches!(
                device.clone().inner().as_dispatch(),
                burn::backend::DispatchDevice::Cube(d) if d.runtime() == cubecl::RuntimeId::Cpu
            )
        };
        if dtype == burn::tensor::DType::BF16 && !host_rounds_to_bf16() && cube_cpu() {
            return Some(
                "CubeCL's CPU runtime needs the CPU's own f32 -> bf16 conversion (AVX512-BF16 \
                 or AVX-NE-CONVERT on x86-64) and this CPU has neither; use f16 or f32 there, \
                 or bf16 on Flex",
            );
        }
    }
    let _ = (device, dtype);
    None
}

/// Whether LLVM compiles an f32 → bf16 rounding on this CPU without a runtime helper.
#[cfg(feature = "cpu")]
fn host_rounds_to_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16")
            || std::arch::is_x86_feature_detected!("avxneconvert")
    }
    // Elsewhere (AArch64: LLVM expands the rounding in integer instructions) nothing is known
    // against it.
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// Threads the CPU kernels (and Flex's own operations) run on: the size of the current rayon
/// pool, which is every core unless `RAYON_NUM_THREADS` or an installed pool says otherwise.
pub fn cpu_threads() -> usize {
    #[cfg(feature = "flex")]
    {
        rayon::current_num_threads()
    }
    #[cfg(not(feature = "flex"))]
    {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}
