//! Strategy routing on a device without CubeCL.

use burn::tensor::{DType, Device};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{DEFAULT_TAU, RelationError, naive_self_relation};
use relation_kernels::{KernelError, Strategy, is_cube, self_relation};

#[test]
fn flex_uses_the_reference_and_refuses_fused() {
    let device = Device::flex();
    assert!(!is_cube(&device));
    let p1 = uniform([2, 5, 2, 16], 1, 1.0, &device, DType::F32);
    let p2 = uniform([2, 5, 2, 16], 2, 1.0, &device, DType::F32);
    let auto = self_relation(p1.clone(), p2.clone(), DEFAULT_TAU, Strategy::Auto).unwrap();
    let reference = naive_self_relation(p1.clone(), p2.clone(), DEFAULT_TAU).unwrap();
    assert_close(
        "auto on flex",
        &auto,
        &reference,
        tolerance(DType::F32, Check::Forward),
    );
    let err = self_relation(p1.clone(), p2.clone(), DEFAULT_TAU, Strategy::Fused).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::FusedUnavailable {
                op: "self_relation",
                ..
            }
        ),
        "{err}"
    );
    let err = self_relation(p1, p2, -1.0, Strategy::Auto).unwrap_err();
    assert_eq!(
        err,
        KernelError::Invalid(RelationError::NonPositiveTau { tau: -1.0 })
    );
}
