//! The chunked Linear Relation kernels (Flex and `Device::wgpu`) against the `relation-core` token loop
//! on Flex: outputs, final state and every gradient over a covering set of lengths, chunk sizes,
//! head dims, dtypes and initial states; gate extremes; state carry; chunked prefill then
//! recurrent decoding; the chunk-size error.
//!
//! Covering set (not the full cross-product, to keep the binary fast on software Vulkan):
//!
//! | T | chunk | D | state | dtype | test |
//! |---|---|---|---|---|---|
//! | 1 | 16 | 48 | no | f32 | `chunk_f32_shapes` |
//! | 63 | 32 | 60 | yes | f32 | `chunk_f32_shapes` |
//! | 64 | 64 | 64 | yes | f32 | `chunk_f32_shapes` |
//! | 65 | 64 | 80 | no | f32 | `chunk_f32_shapes` |
//! | 65 | 16 | 64 | yes | f32 | `chunk_f32_shapes` |
//! | 1000 | 64, 16 | 64, 48 | yes, no | f32 | `chunk_f32_long_sequence` |
//! | 63, 65 | 32, 16 | 64, 80 | yes, no | f16 | `chunk_f16` |
//! | 70 | 32 | 48 | yes | f32, gates -20 and 0 | `chunk_gate_extremes` |
//! | 40 | 16 | 256 | yes | f32 | `chunk_head_dim_256` |

use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::{Check, assert_close, tolerance};
use relation_core::{DEFAULT_TAU, LinearRelationOutput};
use relation_kernels::{
    CHUNK_SIZES, KernelError, LinearInputs, Strategy, chunk_linear_relation, debug,
    fused_recurrent_linear_relation, linear_relation_step,
};

use crate::common::{assert_path, devices};
use crate::linear_relation::{LinearCase, On, case, check_against_reference, reference};

fn run(x: &On, chunk: usize, strategy: Strategy) -> LinearRelationOutput {
    chunk_linear_relation(x.linear_inputs(), DEFAULT_TAU, chunk, strategy).unwrap()
}

/// Forward (and, when `grads`, every gradient) of the chunked kernel against the token loop.
#[allow(clippy::too_many_arguments)] // the case's dimensions, each named at the call
fn check_case(
    device: &Device,
    dims: [usize; 4],
    chunk: usize,
    dtype: DType,
    seed: u64,
    gate: (f64, f64),
    with_state: bool,
    grads: bool,
) {
    let case = LinearCase {
        dims,
        dtype,
        seed,
        gate,
        with_state,
        grads,
    };
    check_against_reference(device, &format!("chunk {chunk}"), &case, |x, strategy| {
        run(x, chunk, strategy)
    });
}

device_tests! {
    fn chunk_f32_shapes(device) {
        check_case(&device, [1, 1, 2, 48], 16, DType::F32, 21, (-1.0, 0.0), false, true);
        check_case(&device, [2, 63, 2, 60], 32, DType::F32, 22, (-1.0, 0.0), true, true);
        check_case(&device, [1, 64, 2, 64], 64, DType::F32, 23, (-2.0, 0.0), true, true);
        check_case(&device, [2, 65, 1, 80], 64, DType::F32, 24, (-1.0, 0.0), false, true);
        check_case(&device, [1, 65, 2, 64], 16, DType::F32, 25, (-1.0, 0.0), true, true);
    }
}

device_tests! {
    fn chunk_f32_long_sequence(device) {
        check_case(
            &device,
            [1, 1000, 2, 64],
            64,
            DType::F32,
            26,
            (-0.5, 0.0),
            true,
            true,
        );
        check_case(
            &device,
            [1, 1000, 1, 48],
            16,
            DType::F32,
            27,
            (-0.1, 0.0),
            false,
            false,
        );
    }
}

device_tests! {
    fn chunk_f16(device) {
        assert!(
            device.supports_dtype(DType::F16),
            "this device has no f16 support"
        );
        check_case(&device, [1, 63, 2, 64], 32, DType::F16, 28, (-1.0, 0.0), true, true);
        check_case(&device, [2, 65, 1, 80], 16, DType::F16, 29, (-1.0, 0.0), false, true);
    }
}

/// The half-precision chunked outputs on tile products (`cube_chunk_tiles.rs`): weak gates, so
/// that the blocks before the diagonal carry weight (with gates near -0.5 per token a block 16
/// tokens back is down to e^-8, and an error there would not show), chunks of 64 (four row
/// blocks), a partial last chunk, head dims padded to 16, one token, and the strongest gates
/// (the factored decay's two exponents must both stay finite).
fn check_half_tiles(device: &Device, dtype: DType) {
    check_case(
        device,
        [1, 130, 2, 64],
        64,
        dtype,
        40,
        (-0.05, 0.0),
        true,
        true,
    );
    check_case(
        device,
        [2, 100, 1, 48],
        32,
        dtype,
        41,
        (-0.02, 0.0),
        false,
        true,
    );
    check_case(
        device,
        [1, 77, 2, 60],
        64,
        dtype,
        42,
        (-0.1, 0.0),
        true,
        false,
    );
    check_case(
        device,
        [1, 1, 2, 32],
        64,
        dtype,
        43,
        (-0.05, 0.0),
        true,
        true,
    );
    check_case(
        device,
        [1, 70, 1, 32],
        64,
        dtype,
        44,
        (-20.5, -19.5),
        true,
        false,
    );
    check_case(
        device,
        [1, 70, 1, 32],
        64,
        dtype,
        45,
        (0.0, 0.0),
        false,
        false,
    );
}

device_tests! {
    fn chunk_f16_tiles(device) {
        assert!(
            device.supports_dtype(DType::F16),
            "this device has no f16 support"
        );
        check_half_tiles(&device, DType::F16);
    }
}

bf16_device_tests! {
    fn chunk_bf16_tiles(device) {
        check_half_tiles(&device, DType::BF16);
    }
}

bf16_device_tests! {
    fn chunk_bf16(device) {
        check_case(&device, [1, 63, 2, 64], 32, DType::BF16, 30, (-1.0, 0.0), true, true);
        check_case(&device, [2, 65, 1, 80], 16, DType::BF16, 31, (-1.0, 0.0), false, true);
    }
}

device_tests! {
    fn chunk_gate_extremes(device) {
        // Strong decay (log gates near -20: cumulative gates near -1300 in a chunk of 64) and no
        // decay at all stay finite and exact.
        check_case(
            &device,
            [1, 70, 2, 48],
            32,
            DType::F32,
            30,
            (-20.5, -19.5),
            true,
            true,
        );
        check_case(
            &device,
            [1, 130, 1, 48],
            64,
            DType::F32,
            31,
            (-20.5, -19.5),
            false,
            false,
        );
        check_case(&device, [1, 70, 2, 48], 32, DType::F32, 32, (0.0, 0.0), true, true);
    }
}

device_tests! {
    fn chunk_head_dim_256(device) {
        // D = 256: the output kernel's sub-tiles shrink to fit the device's shared memory; the
        // backward's per-chunk kernels run 256 units.
        check_case(&device, [1, 40, 1, 256], 16, DType::F32, 33, (-1.0, 0.0), true, true);
    }
}

device_tests! {
    fn chunk_matches_the_recurrent_kernel(device) {
        // Same function, two algorithms: every chunk size against the fused token loop.
        debug::poison_outputs(true);
        let tol = tolerance(DType::F32, Check::Forward);
        let c = case([1, 100, 2, 60], 34, (-1.0, 0.0), true, DType::F32);
        let x = c.on(&device, DType::F32, false);
        let recurrent =
            fused_recurrent_linear_relation(x.linear_inputs(), DEFAULT_TAU, Strategy::Fused)
                .unwrap();
        for &chunk in CHUNK_SIZES {
            let out = run(&x, chunk, Strategy::Fused);
            assert_close(&format!("chunk {chunk} Y"), &out.y, &recurrent.y, tol);
            assert_close(
                &format!("chunk {chunk} state"),
                &out.state,
                &recurrent.state,
                tol,
            );
        }
    }
}

device_tests! {
    fn chunk_state_carry_and_decoding(device) {
        debug::poison_outputs(true);
        let tol = tolerance(DType::F32, Check::Forward);
        let (seq, split) = (90, 37);
        let c = case([1, seq, 2, 60], 35, (-1.0, 0.0), true, DType::F32);
        let x = c.on(&device, DType::F32, false);
        let whole = run(&x, 32, Strategy::Fused);
        let part = |from: usize, len: usize| -> [Tensor<4>; 4] {
            [0, 1, 2, 3].map(|i| x.inputs[i].clone().narrow(1, from, len))
        };

        // x1 then x2 from the carried state == x1 ++ x2 (split inside a chunk).
        let [p1, p2, info, log_alpha] = part(0, split);
        let first = chunk_linear_relation(
            LinearInputs {
                p1,
                p2,
                info,
                log_alpha,
                initial_state: x.state.clone(),
                segments: None,
            },
            DEFAULT_TAU,
            32,
            Strategy::Fused,
        )
        .unwrap();
        let [p1, p2, info, gates] = part(split, seq - split);
        let second = chunk_linear_relation(
            LinearInputs::new(p1, p2, info, gates).with_state(first.state.clone()),
            DEFAULT_TAU,
            16,
            Strategy::Fused,
        )
        .unwrap();
        assert_close(
            "carry: Y",
            &Tensor::cat(vec![first.y.clone(), second.y], 1),
            &whole.y,
            tol,
        );
        assert_close("carry: state", &second.state, &whole.state, tol);

        // Prefill x1 with the chunk kernel, then decode token by token == one full pass.
        let mut state = first.state;
        let mut ys = vec![first.y];
        for t in split..seq {
            let [p1, p2, info, gates] = part(t, 1);
            let out = linear_relation_step(
                LinearInputs::new(p1, p2, info, gates).with_state(state),
                DEFAULT_TAU,
                Strategy::Fused,
            )
            .unwrap();
            ys.push(out.y);
            state = out.state;
        }
        assert_close("decode: Y", &Tensor::cat(ys, 1), &whole.y, tol);
        assert_close("decode: state", &state, &whole.state, tol);
    }
}

#[test]
fn chunk_size_is_validated_on_every_device() {
    let c = case([1, 8, 1, 48], 36, (-1.0, 0.0), false, DType::F32);
    for device in devices() {
        let x = c.on(&device, DType::F32, false);
        for bad in [0, 8, 48, 128] {
            let err = chunk_linear_relation(x.linear_inputs(), DEFAULT_TAU, bad, Strategy::Auto)
                .unwrap_err();
            assert_eq!(
                err,
                KernelError::UnsupportedChunkSize {
                    op: "chunk_linear_relation",
                    chunk_size: bad,
                    allowed: CHUNK_SIZES,
                }
            );
            assert!(err.to_string().contains(&bad.to_string()), "{err}");
        }
    }
}

#[test]
fn chunk_auto_on_flex_runs_the_kernel_and_reference_stays_available() {
    let flex = Device::flex();
    let c = case([1, 40, 2, 48], 37, (-1.0, 0.0), true, DType::F32);
    let x = c.on(&flex, DType::F32, false);
    let tol = tolerance(DType::F32, Check::Forward);
    let expected = reference(&x);
    for &chunk in CHUNK_SIZES {
        let auto = assert_path(&format!("Auto on Flex, chunk {chunk}"), "fused", || {
            run(&x, chunk, Strategy::Auto)
        });
        let forced = run(&x, chunk, Strategy::Reference);
        for (name, got) in [("auto", auto), ("reference", forced)] {
            assert_close(&format!("flex {name} Y {chunk}"), &got.y, &expected.y, tol);
            assert_close(
                &format!("flex {name} state {chunk}"),
                &got.state,
                &expected.state,
                tol,
            );
        }
    }
}
