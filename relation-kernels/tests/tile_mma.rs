//! The CubeCL kernels' tile product (`debug::cube_tile_product`: `C + A · B` on one 16 x 16
//! tile) against a host product of the same operands rounded to the dtype, in f64: both layouts
//! the kernels use for `B` (by columns, as `P2` in `U = P1 · P2ᵀ`; by rows, as `Ĩ` in
//! `Y += π · Ĩ`), depths 16 to 80 (head dims padded to the fragment), accumulating onto a
//! non-zero `C`, in f32, f16 and bf16 where the runtime has them. The runtimes here have no
//! matrix units, so the emulated path runs; the path on matrix units is the same call with
//! `TilePath::MatrixUnits`, compared by the GPU check. The operands are exact in the dtype and
//! both sides sum products in f32 or better: the f32 forward tolerance.

use burn::tensor::{DType, Device, Tensor, TensorData};
use relation_core::testing::{Check, assert_close, tolerance};
use relation_kernels::debug::{TilePath, cube_tile_path, cube_tile_product};

/// A deterministic value in [-1, 1) for index `i` of stream `seed`.
fn value(seed: u64, i: usize) -> f32 {
    let x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `values` rounded to `dtype` and back.
fn rounded(values: Vec<f32>, dtype: DType) -> Vec<f32> {
    let n = values.len();
    TensorData::new(values, [n])
        .convert_dtype(dtype)
        .iter::<f32>()
        .collect()
}

fn check(device: &Device, dtype: DType) {
    let flex = Device::flex();
    for depth in [16usize, 32, 48, 64, 80] {
        for b_by_columns in [true, false] {
            let seed = depth as u64 * 2 + b_by_columns as u64;
            let a = rounded((0..16 * depth).map(|i| value(seed, i)).collect(), dtype);
            let b = rounded(
                (0..16 * depth).map(|i| value(seed + 100, i)).collect(),
                dtype,
            );
            let c: Vec<f32> = (0..256).map(|i| value(seed + 200, i)).collect();
            let got = cube_tile_product(
                device,
                &a,
                &b,
                &c,
                depth,
                b_by_columns,
                dtype,
                TilePath::Emulated,
            );
            let expected: Vec<f32> = (0..256)
                .map(|e| {
                    let (r, n) = (e / 16, e % 16);
                    let dot: f64 = (0..depth)
                        .map(|k| {
                            let bv = if b_by_columns {
                                b[n * depth + k]
                            } else {
                                b[k * 16 + n]
                            };
                            a[r * depth + k] as f64 * bv as f64
                        })
                        .sum();
                    (c[e] as f64 + dot) as f32
                })
                .collect();
            let tensor = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [16, 16]), &flex);
            assert_close(
                &format!(
                    "{device:?} {dtype:?} depth {depth}, B by {}",
                    if b_by_columns { "columns" } else { "rows" }
                ),
                &tensor(got),
                &tensor(expected),
                tolerance(DType::F32, Check::Forward),
            );
        }
    }
}

/// f32 and f16 on every CubeCL device of the build; bf16 where the runtime computes in it. The
/// runtimes CI has report no matrix units, so the kernels pick the emulated path there (f32
/// inputs always take it).
#[test]
fn tile_product_matches_a_host_product() {
    for device in crate::common::cube_devices() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(
                cube_tile_path(&device, dtype),
                TilePath::Emulated,
                "{device:?} {dtype:?}"
            );
        }
        check(&device, DType::F32);
        check(&device, DType::F16);
        if relation_kernels::device::supports_dtype(&device, DType::BF16)
            && device.supports_dtype(DType::BF16)
        {
            check(&device, DType::BF16);
        }
    }
}
