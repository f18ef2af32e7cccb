//! Helpers shared by the kernel test modules.

use burn::tensor::{Device, Tensor};

/// Flex, whose fused CPU kernels every test runs on.
pub fn flex() -> Device {
    let device = Device::flex();
    assert!(relation_kernels::is_flex(&device));
    device
}

/// The wgpu device the CubeCL kernels are tested on. Panics — fails the test, never skips it —
/// when no adapter exists.
#[cfg(feature = "wgpu")]
pub fn wgpu() -> Device {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    let identity = device.identity().expect(
        "no wgpu adapter: install a Vulkan driver (Debian: mesa-vulkan-drivers for the software \
         one) — kernel tests must not be skipped",
    );
    eprintln!("wgpu adapter: {identity:?}");
    assert!(
        relation_kernels::is_cube(&device),
        "Device::wgpu must be a CubeCL device"
    );
    device
}

/// Every device with fused kernels in this build: Flex, then wgpu when compiled in.
pub fn devices() -> Vec<Device> {
    #[allow(unused_mut)]
    let mut all = vec![flex()];
    #[cfg(feature = "wgpu")]
    all.push(wgpu());
    all
}

/// A copy of `x` on Flex in f32, to compare with the references.
pub fn to_flex<const N: usize>(x: Tensor<N>) -> Tensor<N> {
    Tensor::from_data(x.into_data().convert::<f32>(), &Device::flex())
}

/// One test per device with kernels: `device_tests! { fn name(device) { … } }` makes the module
/// `name` with the tests `name::flex` and (with the `wgpu` feature) `name::wgpu`, each running
/// the body with `device` bound to that device.
macro_rules! device_tests {
    ($(fn $name:ident($device:ident) $body:block)*) => {
        $(
            mod $name {
                #[allow(unused_imports)]
                use super::*;

                fn body($device: burn::tensor::Device) $body

                #[test]
                fn flex() {
                    body(crate::common::flex())
                }

                #[cfg(feature = "wgpu")]
                #[test]
                fn wgpu() {
                    body(crate::common::wgpu())
                }
            }
        )*
    };
}
