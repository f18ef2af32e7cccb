//! Helpers shared by the kernel test modules.

use burn::tensor::{Device, Tensor, TensorData};
use relation_core::DEFAULT_TAU;
use relation_kernels::{FlashInputs, Strategy, flash_relation};

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

/// CubeCL's CPU runtime (LLVM JIT; `--features cpu`, LLVM from `scripts/llvm-sdk.sh`): the same
/// CubeCL kernels as on wgpu, compiled for this machine's CPU.
#[cfg(feature = "cpu")]
pub fn cube_cpu() -> Device {
    let device = Device::cpu();
    assert!(
        relation_kernels::is_cube(&device),
        "Device::cpu must be a CubeCL device"
    );
    device
}

/// The first CUDA GPU (`--features cuda`; kernels lowered to PTX through LLVM, so only the
/// NVIDIA driver is needed at run time). Panics — fails the test — when there is none.
#[cfg(feature = "cuda")]
pub fn cuda() -> Device {
    let device = Device::cuda(0);
    assert!(
        relation_kernels::is_cube(&device),
        "Device::cuda must be a CubeCL device"
    );
    device
}

/// The default Vulkan device through CubeCL's SPIR-V compiler (`--features vulkan`; real GPUs
/// only: the SPIR-V path crashes Mesa's software driver). Panics when there is none.
#[cfg(feature = "vulkan")]
pub fn vulkan() -> Device {
    let device = Device::vulkan(burn::tensor::DeviceKind::DefaultDevice);
    assert!(
        relation_kernels::is_cube(&device),
        "Device::vulkan must be a CubeCL device"
    );
    device
}

/// The default Metal device (`--features metal`, macOS). Panics when there is none.
#[cfg(feature = "metal")]
pub fn metal() -> Device {
    let device = Device::metal(burn::tensor::DeviceKind::DefaultDevice);
    assert!(
        relation_kernels::is_cube(&device),
        "Device::metal must be a CubeCL device"
    );
    device
}

/// The CubeCL devices of this build: wgpu, Vulkan, Metal, the CubeCL CPU runtime, CUDA, when
/// compiled in.
#[allow(dead_code)] // used only by the CubeCL-only tests
#[allow(clippy::vec_init_then_push)] // each push is behind its own feature
pub fn cube_devices() -> Vec<Device> {
    #[allow(unused_mut)]
    let mut all = Vec::new();
    #[cfg(feature = "wgpu")]
    all.push(wgpu());
    #[cfg(feature = "vulkan")]
    all.push(vulkan());
    #[cfg(feature = "metal")]
    all.push(metal());
    #[cfg(feature = "cpu")]
    all.push(cube_cpu());
    #[cfg(feature = "cuda")]
    all.push(cuda());
    all
}

/// Every device with fused kernels in this build: Flex, then the CubeCL runtimes compiled in
/// (wgpu, the CubeCL CPU runtime).
pub fn devices() -> Vec<Device> {
    let mut all = vec![flex()];
    all.extend(cube_devices());
    all
}

/// A copy of `x` on Flex in f32, to compare with the references.
pub fn to_flex<const N: usize>(x: Tensor<N>) -> Tensor<N> {
    Tensor::from_data(x.into_data().convert::<f32>(), &Device::flex())
}

/// `device_tests_on!([flex, wgpu: "wgpu", …] fn name(device) { … } …)`: for each `fn`, the
/// module `name` with one test per listed device, named after the device's constructor in this
/// module (`flex()`, `wgpu()`, …) and compiled only with the cargo feature after its colon. The
/// device lists live in [`device_tests!`] and [`bf16_device_tests!`].
macro_rules! device_tests_on {
    ($devices:tt) => {};
    ($devices:tt fn $name:ident($device:ident) $body:block $($rest:tt)*) => {
        device_tests_on!(@module $devices $name $device $body);
        device_tests_on!($devices $($rest)*);
    };
    (@module [$($test:ident $(: $feature:literal)?),*] $name:ident $device:ident $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($device: burn::tensor::Device) $body

            $(
                $(#[cfg(feature = $feature)])?
                #[test]
                fn $test() {
                    body(crate::common::$test())
                }
            )*
        }
    };
}

/// One test per device with kernels: `device_tests! { fn name(device) { … } }` makes the module
/// `name` with the tests `name::flex`, `name::wgpu` (with the `wgpu` feature), `name::vulkan`,
/// `name::metal`, `name::cube_cpu` (the `cpu` feature) and `name::cuda`, each running the body
/// with `device` bound to that device: the one place that says which devices the suite covers.
/// Building with a backend's feature adds its tests (none can be skipped at run time); pick
/// devices with cargo's name filter, e.g. `-- ::cube_cpu` or `-- ::cuda`.
macro_rules! device_tests {
    ($($tests:tt)*) => {
        device_tests_on!(
            [flex, wgpu: "wgpu", vulkan: "vulkan", metal: "metal", cube_cpu: "cpu", cuda: "cuda"]
            $($tests)*
        );
    };
}

/// `device_tests!` for bf16: one test per device whose runtime computes in bf16 — Flex, CubeCL's
/// CPU runtime (it registers bf16 for every use) and CUDA. WGSL has no bf16, so the wgpu tests on
/// software Vulkan cannot have one; on a Vulkan GPU the SPIR-V compiler may offer bf16 buffers
/// (an extension), which the FlashRelation benchmark exercises when the device reports it. The
/// body asserts the runtime's support first, so a runtime that drops bf16 fails loudly here. On a
/// machine where the runtime registers bf16 but cannot compile it (CubeCL's CPU runtime on a CPU
/// without a bf16 conversion instruction, see `relation_kernels::device::supports_dtype`), the
/// test checks instead that every kernel entry point refuses bf16 with a typed error.
macro_rules! bf16_device_tests {
    ($(fn $name:ident($device:ident) $body:block)*) => {
        device_tests_on!(
            [flex, cube_cpu: "cpu", cuda: "cuda"]
            $(
                fn $name($device) {
                    assert!(
                        $device.supports_dtype(burn::tensor::DType::BF16),
                        "{:?} reports no bf16 support: bf16 kernel tests cannot run on it",
                        $device
                    );
                    if relation_kernels::device::supports_dtype(
                        &$device,
                        burn::tensor::DType::BF16,
                    ) {
                        $body
                    } else {
                        crate::common::assert_bf16_refused(&$device);
                    }
                }
            )*
        );
    };
}

/// On a machine where `device` registers bf16 but cannot compile it: FlashRelation and Linear
/// Relation (recurrent, chunked, one decoding step), under every strategy, refuse bf16 inputs
/// with `KernelError::DtypeUnavailable` naming the device, before any kernel is built (a kernel
/// that failed to load would panic on the device's server thread instead).
pub fn assert_bf16_refused(device: &Device) {
    use relation_kernels::{
        KernelError, LinearInputs, LinearRelationMode, chunk_linear_relation, linear_relation,
        linear_relation_step,
    };
    // [B, T, H, D] inputs; the decoding state is [B, H, D, D].
    let (dims, state_dims) = ([1, 5, 2, 8], [1, 2, 8, 8]);
    // Converted on the host: a cast on the device would itself be a bf16 kernel.
    let tensor = |shape: [usize; 4], value: fn(usize) -> f32| {
        let values: Vec<f32> = (0..shape.iter().product()).map(value).collect();
        let data = TensorData::new(values, shape).convert::<burn::tensor::bf16>();
        Tensor::<4>::from_data(data, (device, burn::tensor::DType::BF16))
    };
    let x = || tensor(dims, |i| 0.05 * i as f32 - 1.0);
    let lambda = Tensor::<1>::from_data([0.5f32], device);
    let refused = |what: &str, err: Option<KernelError>| match err {
        Some(KernelError::DtypeUnavailable { dtype, .. }) => assert_eq!(dtype, "BF16", "{what}"),
        other => panic!("{what}: expected DtypeUnavailable for bf16 on {device:?}, got {other:?}"),
    };
    for strategy in [Strategy::Auto, Strategy::Fused, Strategy::Reference] {
        let flash = flash_relation(
            FlashInputs::new(x(), x(), x()),
            lambda.clone(),
            DEFAULT_TAU,
            strategy,
        );
        refused(&format!("flash_relation {strategy:?}"), flash.err());
        let gates = tensor(dims, |_| -0.1);
        let recurrent = linear_relation(
            LinearInputs::new(x(), x(), x(), gates.clone()),
            DEFAULT_TAU,
            LinearRelationMode::Recurrent,
            strategy,
        );
        refused(&format!("linear_relation {strategy:?}"), recurrent.err());
        let step = linear_relation_step(
            LinearInputs::new(x(), x(), x(), gates.clone()).with_state(tensor(state_dims, |_| 0.0)),
            DEFAULT_TAU,
            strategy,
        );
        refused(&format!("linear_relation_step {strategy:?}"), step.err());
        let chunked = chunk_linear_relation(
            LinearInputs::new(x(), x(), x(), gates),
            DEFAULT_TAU,
            16,
            strategy,
        );
        refused(
            &format!("chunk_linear_relation {strategy:?}"),
            chunked.err(),
        );
    }
}

/// `Y` of the fused FlashRelation and the gradients of `sum(Y ⊙ weights)` for `p1`, `p2`,
/// `info` and `lambda` (leaves that require gradients, on an autodiff device), as data, in that
/// order.
pub fn flash_outputs_and_grads(
    [p1, p2, info]: [&Tensor<4>; 3],
    lambda: &Tensor<1>,
    weights: &Tensor<4>,
) -> Vec<TensorData> {
    let y = flash_relation(
        FlashInputs::new(p1.clone(), p2.clone(), info.clone()),
        lambda.clone(),
        DEFAULT_TAU,
        Strategy::Fused,
    )
    .unwrap();
    let grads = (y.clone() * weights.clone()).sum().backward();
    let mut out = vec![y.into_data()];
    for x in [p1, p2, info] {
        out.push(x.grad(&grads).unwrap().into_data());
    }
    out.push(lambda.grad(&grads).unwrap().into_data());
    out
}

/// The kernel choices (`(op, path)`, path `"fused"` or `"reference"`) that the entry points
/// report while `f` runs on this thread: read from the `tracing` event of `Strategy`'s decision
/// through a subscriber scoped to this call, so other tests running concurrently cannot affect
/// what one test sees (unlike a process-wide counter).
pub fn kernel_choices<R>(f: impl FnOnce() -> R) -> (R, Vec<(String, String)>) {
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    #[derive(Default)]
    struct Choice {
        op: String,
        path: String,
    }
    impl Visit for Choice {
        fn record_str(&mut self, field: &Field, value: &str) {
            match field.name() {
                "op" => self.op = value.to_string(),
                "path" => self.path = value.to_string(),
                _ => {}
            }
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.record_str(field, format!("{value:?}").trim_matches('"'));
        }
    }
    struct Recorder(Arc<Mutex<Vec<(String, String)>>>);
    impl Subscriber for Recorder {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut choice = Choice::default();
            event.record(&mut choice);
            if !choice.path.is_empty() {
                self.0.lock().unwrap().push((choice.op, choice.path));
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = tracing::subscriber::with_default(Recorder(seen.clone()), f);
    let choices = seen.lock().unwrap().clone();
    (out, choices)
}

/// Runs `f` and asserts that every kernel choice it made took `path` (and that it made one).
pub fn assert_path<R>(what: &str, path: &str, f: impl FnOnce() -> R) -> R {
    let (out, choices) = kernel_choices(f);
    assert!(!choices.is_empty(), "{what}: no kernel choice was reported");
    for (op, got) in &choices {
        assert_eq!(
            got, path,
            "{what}: `{op}` took the {got} path, expected {path}"
        );
    }
    out
}
