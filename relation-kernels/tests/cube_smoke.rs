//! CI smoke test: a CubeCL kernel launched through Burn on every CubeCL device of the build
//! (`Device::wgpu`, `Device::cpu`), checked for its numbers and gradients. Fails (never skips)
//! when no wgpu adapter exists.

use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{DEFAULT_TAU, naive_self_relation};
use relation_kernels::{Strategy, self_relation};

use crate::common::{assert_path, cube_devices};

#[test]
fn self_relation_kernel_matches_reference() {
    for device in cube_devices() {
        matches_reference_on(device);
    }
}

fn matches_reference_on(device: Device) {
    let flex = Device::flex();
    for (dims, seed) in [([2, 37, 4, 60], 1), ([1, 1, 8, 48], 3), ([3, 5, 2, 80], 5)] {
        // A non-contiguous p1 ([B, H, T, D] swapped) exercises the kernel's contiguity handling.
        let [b, t, h, d] = dims;
        let p1 = uniform([b, h, t, d], seed, 1.5, &device, DType::F32).swap_dims(1, 2);
        let p2 = uniform(dims, seed + 1, 1.5, &device, DType::F32);
        let fused = assert_path(&format!("{dims:?}"), "fused", || {
            self_relation(p1.clone(), p2.clone(), DEFAULT_TAU, Strategy::Fused).unwrap()
        });
        let values = fused.to_data(); // synchronises
        let expected =
            naive_self_relation(p1.to_device(&flex), p2.to_device(&flex), DEFAULT_TAU).unwrap();
        assert_close(
            &format!("self_relation {dims:?} on {device:?}"),
            &Tensor::<3>::from_data(values, &flex),
            &expected,
            tolerance(DType::F32, Check::Forward),
        );
    }
}

#[test]
fn self_relation_kernel_gradients_match_reference() {
    for device in cube_devices() {
        gradients_match_on(device.autodiff());
    }
}

fn gradients_match_on(device: Device) {
    let tol = tolerance(DType::F32, Check::Gradient);
    let p1 = uniform([2, 9, 2, 48], 7, 1.5, &device, DType::F32).require_grad();
    let p2 = uniform([2, 9, 2, 48], 8, 1.5, &device, DType::F32).require_grad();
    let weights = uniform([2, 9, 2], 9, 1.0, &device, DType::F32);
    let grads_of = |strategy| {
        let s = self_relation(p1.clone(), p2.clone(), DEFAULT_TAU, strategy).unwrap();
        let grads = (s * weights.clone()).sum().backward();
        (p1.grad(&grads).unwrap(), p2.grad(&grads).unwrap())
    };
    let (fused_p1, fused_p2) = grads_of(Strategy::Fused);
    let (ref_p1, ref_p2) = grads_of(Strategy::Reference);
    assert_close("dS/dp1", &fused_p1, &ref_p1, tol);
    assert_close("dS/dp2", &fused_p2, &ref_p2, tol);
}
