//! Strategy routing: Flex has its own kernels, `Reference` is always available, bad input is a
//! typed error before any kernel runs.

use burn::tensor::{DType, Device};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{DEFAULT_TAU, RelationError, naive_self_relation};
use relation_kernels::{
    KernelError, Strategy, debug, has_kernels, is_cube, is_flex, self_relation,
};

use crate::common::assert_path;

#[test]
fn flex_has_kernels_and_reference_stays_available() {
    debug::poison_outputs(true);
    let device = Device::flex();
    assert!(is_flex(&device) && is_flex(&device.clone().autodiff()));
    assert!(!is_cube(&device));
    assert!(has_kernels(&device));
    let p1 = uniform([2, 5, 2, 16], 1, 1.0, &device, DType::F32);
    let p2 = uniform([2, 5, 2, 16], 2, 1.0, &device, DType::F32);
    let reference = naive_self_relation(p1.clone(), p2.clone(), DEFAULT_TAU).unwrap();
    let tol = tolerance(DType::F32, Check::Forward);
    // Which path each call took, from its own kernel-choice event (not the process-wide
    // counters, which other tests move concurrently).
    for strategy in [Strategy::Auto, Strategy::Fused] {
        let got = assert_path(&format!("{strategy:?}"), "fused", || {
            self_relation(p1.clone(), p2.clone(), DEFAULT_TAU, strategy).unwrap()
        });
        assert_close(&format!("{strategy:?} on flex"), &got, &reference, tol);
    }
    assert_path("Reference", "reference", || {
        self_relation(p1.clone(), p2.clone(), DEFAULT_TAU, Strategy::Reference).unwrap()
    });
    let err = self_relation(p1, p2, -1.0, Strategy::Auto).unwrap_err();
    assert_eq!(
        err,
        KernelError::Invalid(RelationError::NonPositiveTau { tau: -1.0 })
    );
}

/// A float dtype the kernels do not take (here a quantized tensor): `Fused` is a typed error
/// naming it, never a panic inside a kernel.
#[test]
fn a_dtype_without_kernels_is_a_typed_error() {
    use burn::tensor::quantization::QuantScheme;
    let flex = Device::flex();
    let x =
        uniform([1, 4, 2, 8], 1, 1.0, &flex, DType::F32).quantize_dynamic(&QuantScheme::default());
    assert!(matches!(x.dtype(), DType::QFloat(_)), "{:?}", x.dtype());
    let err = self_relation(x.clone(), x, DEFAULT_TAU, Strategy::Fused).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::UnsupportedDtype {
                op: "self_relation",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("QFloat"), "{err}");
}
