//! Helpers shared by the examples and benchmarks: device selection by name, timing that waits
//! for the device, and allocator readings.

use std::time::{Duration, Instant};

use burn::tensor::Device;

/// The device called `name` (`flex`, `wgpu`, `vulkan`, `cuda`), if compiled into this build.
pub fn device_by_name(name: &str) -> Result<Device, String> {
    match name {
        "flex" => Ok(Device::flex()),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)),
        #[cfg(feature = "vulkan")]
        "vulkan" => Ok(Device::vulkan(burn::tensor::DeviceKind::DefaultDevice)),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Device::cuda(0)),
        other => Err(format!(
            "device `{other}` is not compiled into this build (see the README's backend table)"
        )),
    }
}

/// Mean time of `iters` calls of `f` after one warm-up call (compilation, autotune, allocation),
/// waiting for the device to finish before reading the clock.
pub fn time_on(device: &Device, iters: usize, f: &mut dyn FnMut()) -> Duration {
    f();
    device.sync().expect("device sync");
    let start = Instant::now();
    for _ in 0..iters.max(1) {
        f();
    }
    device.sync().expect("device sync");
    start.elapsed() / iters.max(1) as u32
}

/// Bytes the device allocator holds while `f`'s result is alive, above what it held before
/// (`None` on backends that do not report it).
pub fn bytes_held_by<T>(device: &Device, f: impl FnOnce() -> T) -> Option<u64> {
    device.memory_cleanup();
    let before = device.memory_pool_usage().map(|u| u.bytes_in_use);
    let kept = f();
    device.sync().expect("device sync");
    let after = device.memory_pool_usage().map(|u| u.bytes_in_use);
    drop(kept);
    before.zip(after).map(|(b, a)| a.saturating_sub(b))
}

/// Growth of the device allocator's reserved bytes while `f` runs, after a cleanup: the peak
/// working memory of `f` as the allocator saw it (pages are reserved up to the high-water mark
/// and then reused), rounded up to its page sizes. `None` on backends that do not report it.
pub fn peak_reserved_by(device: &Device, f: impl FnOnce()) -> Option<u64> {
    device.memory_cleanup();
    let before = device.memory_pool_usage().map(|u| u.bytes_reserved);
    f();
    device.sync().expect("device sync");
    let after = device.memory_pool_usage().map(|u| u.bytes_reserved);
    before.zip(after).map(|(b, a)| a.saturating_sub(b))
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// MiB with one decimal, or `n/a`.
pub fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("n/a".into(), |b| {
        format!("{:.1}", b as f64 / (1 << 20) as f64)
    })
}
