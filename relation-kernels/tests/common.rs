//! Helpers shared by the kernel test modules.

use burn::tensor::{Device, DeviceKind, Tensor};
use relation_kernels::is_cube;

/// The wgpu device the kernels are tested on. Panics — fails the test, never skips it — when no
/// adapter exists.
pub fn wgpu() -> Device {
    let device = Device::wgpu(DeviceKind::DefaultDevice);
    let identity = device.identity().expect(
        "no wgpu adapter: install a Vulkan driver (Debian: mesa-vulkan-drivers for the software \
         one) — kernel tests must not be skipped",
    );
    eprintln!("wgpu adapter: {identity:?}");
    assert!(is_cube(&device), "Device::wgpu must be a CubeCL device");
    device
}

/// A copy of `x` on Flex in f32, to compare with the references.
pub fn to_flex<const N: usize>(x: Tensor<N>) -> Tensor<N> {
    Tensor::from_data(x.into_data().convert::<f32>(), &Device::flex())
}
