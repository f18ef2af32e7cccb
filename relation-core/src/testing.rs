//! Test support shared by every crate of the workspace: the one tolerance table, a comparison
//! that reports where and by how much two tensors differ, and deterministic inputs.
//!
//! Tolerances are per dtype and per kind of comparison, and live only here, so that a kernel is
//! never made to pass by loosening one test's numbers.

use burn::tensor::{DType, Device, Tensor, TensorData};

pub use crate::rng::SplitMix64;

/// An absolute-plus-relative tolerance: `|actual - expected| <= abs + rel * |expected|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tol {
    /// Relative part.
    pub rel: f64,
    /// Absolute part.
    pub abs: f64,
}

/// What is being compared; each kind has its own column in [`TOLERANCES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Two algorithms for the same forward value (materialized vs factorized, kernel vs
    /// reference): only summation order differs.
    Forward,
    /// Two gradients of the same function (kernel backward vs autodiff of the reference).
    Gradient,
    /// Autodiff against central finite differences (f64 only makes sense).
    FiniteDifference,
    /// Forward values or gradients when the evidence is huge (`|U|` up to ~1e3): `U` itself then
    /// carries an absolute rounding error of about `|U| * eps`, which `exp` turns into a relative
    /// error of the weights, whatever the algorithm.
    LargeEvidence,
}

/// The tolerance table: `(dtype, forward, gradient, finite difference, large evidence)`.
///
/// Half-precision rows compare a half-precision run against an f32 reference computed from the
/// same (rounded) inputs, so they cover one rounding of every stored intermediate.
pub const TOLERANCES: &[(DType, Tol, Tol, Tol, Tol)] = &[
    (
        DType::F64,
        Tol {
            rel: 1e-10,
            abs: 1e-12,
        },
        Tol {
            rel: 1e-9,
            abs: 1e-11,
        },
        Tol {
            rel: 1e-6,
            abs: 1e-8,
        },
        Tol {
            rel: 1e-8,
            abs: 1e-8,
        },
    ),
    (
        DType::F32,
        Tol {
            rel: 1e-4,
            abs: 1e-5,
        },
        Tol {
            rel: 1e-3,
            abs: 1e-4,
        },
        Tol {
            rel: 2e-2,
            abs: 1e-3,
        },
        Tol {
            rel: 2e-3,
            abs: 1e-3,
        },
    ),
    (
        DType::F16,
        Tol {
            rel: 1e-2,
            abs: 1e-2,
        },
        Tol {
            rel: 5e-2,
            abs: 2e-2,
        },
        Tol {
            rel: 1e-1,
            abs: 1e-1,
        },
        Tol {
            rel: 1e-1,
            abs: 1e-1,
        },
    ),
    (
        DType::BF16,
        Tol {
            rel: 4e-2,
            abs: 4e-2,
        },
        Tol {
            rel: 1e-1,
            abs: 5e-2,
        },
        Tol {
            rel: 2e-1,
            abs: 2e-1,
        },
        Tol {
            rel: 2e-1,
            abs: 2e-1,
        },
    ),
];

/// Looks up the tolerance for `dtype` and `check` in [`TOLERANCES`].
///
/// # Panics
/// If the dtype has no row (a test is comparing a dtype nobody has budgeted for).
pub fn tolerance(dtype: DType, check: Check) -> Tol {
    let row = TOLERANCES
        .iter()
        .find(|row| row.0 == dtype)
        .unwrap_or_else(|| panic!("no tolerance row for dtype {dtype:?}"));
    match check {
        Check::Forward => row.1,
        Check::Gradient => row.2,
        Check::FiniteDifference => row.3,
        Check::LargeEvidence => row.4,
    }
}

/// The worst element of a comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Flat index of the element.
    pub index: usize,
    /// Its value in `actual`.
    pub actual: f64,
    /// Its value in `expected`.
    pub expected: f64,
    /// `|actual - expected| / (abs + rel |expected|)`: > 1 fails.
    pub ratio: f64,
}

/// Compares two tensors element by element and returns the worst element.
///
/// A NaN anywhere in `actual` or `expected` is a failure (ratio = inf): no test expects NaN, and
/// kernels' outputs are poisoned with NaN before launch so that unwritten memory shows up here.
/// Equal infinities compare equal.
///
/// # Panics
/// If the shapes differ.
pub fn compare<const N: usize>(actual: &Tensor<N>, expected: &Tensor<N>, tol: Tol) -> Mismatch {
    assert_eq!(actual.dims(), expected.dims(), "shapes differ");
    let a: Vec<f64> = actual.to_data().iter::<f64>().collect();
    let e: Vec<f64> = expected.to_data().iter::<f64>().collect();
    let mut worst = Mismatch {
        index: 0,
        actual: f64::NAN,
        expected: f64::NAN,
        ratio: 0.0,
    };
    for (index, (&x, &y)) in a.iter().zip(&e).enumerate() {
        let ratio = if x.is_nan() || y.is_nan() {
            f64::INFINITY
        } else if x == y {
            0.0
        } else {
            (x - y).abs() / (tol.abs + tol.rel * y.abs())
        };
        if ratio > worst.ratio || (index == 0 && worst.actual.is_nan()) {
            worst = Mismatch {
                index,
                actual: x,
                expected: y,
                ratio,
            };
        }
    }
    worst
}

/// Asserts `actual ≈ expected` within `tol`, naming the comparison and the worst element.
///
/// # Panics
/// On a shape mismatch, any NaN, or any element outside the tolerance.
#[track_caller]
pub fn assert_close<const N: usize>(
    what: &str,
    actual: &Tensor<N>,
    expected: &Tensor<N>,
    tol: Tol,
) {
    let worst = compare(actual, expected, tol);
    assert!(
        worst.ratio <= 1.0,
        "{what}: element {} (of shape {:?}) is {} but expected {} (|diff| = {:.3e}, {:.2}x the \
         tolerance {tol:?})",
        worst.index,
        actual.dims(),
        worst.actual,
        worst.expected,
        (worst.actual - worst.expected).abs(),
        worst.ratio,
    );
}

/// A deterministic tensor, uniform in `[-scale, scale)`, created on `device` in `dtype`.
pub fn uniform<const N: usize>(
    shape: [usize; N],
    seed: u64,
    scale: f64,
    device: &Device,
    dtype: DType,
) -> Tensor<N> {
    let mut rng = SplitMix64::new(seed);
    let values: Vec<f64> = (0..shape.iter().product::<usize>())
        .map(|_| scale * rng.next_signed())
        .collect();
    Tensor::from_data(TensorData::new(values, shape), (device, dtype))
}
