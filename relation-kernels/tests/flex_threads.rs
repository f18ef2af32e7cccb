//! The Flex kernels give the same bits on 1 thread as on several: every task owns its output and
//! runs a fixed order of operations, whatever the pool size.

use burn::tensor::{DType, Device, Tensor, TensorData};
use relation_core::testing::uniform;
use relation_core::{DEFAULT_TAU, RopePositions};
use relation_kernels::{LinearInputs, Strategy, chunk_linear_relation};

use crate::common::flash_outputs_and_grads;

/// Runs `f` on a fresh rayon pool of `threads` threads (Flex runs its work on the current pool).
fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
        .install(f)
}

/// Output and input gradients of FlashRelation, as data.
fn flash_run() -> Vec<TensorData> {
    let device = Device::flex().autodiff();
    let dims = [2, 150, 4, 48];
    let make = |seed, scale| uniform(dims, seed, scale, &device, DType::F32).require_grad();
    let (p1, p2, info) = (make(1, 1.5), make(2, 1.5), make(3, 1.0));
    let lambda = Tensor::<1>::from_data([0.5f32], &device).require_grad();
    let weights = uniform(dims, 4, 1.0, &device, DType::F32);
    flash_outputs_and_grads([&p1, &p2, &info], &lambda, &weights)
}

/// Output, final state and input gradients of Linear Relation, as data.
fn linear_run() -> Vec<TensorData> {
    let device = Device::flex().autodiff();
    let dims = [2, 130, 4, 60];
    let make = |seed, scale| uniform(dims, seed, scale, &device, DType::F32).require_grad();
    let (p1, p2, info) = (make(1, 1.0), make(2, 1.0), make(3, 1.0));
    let gates = (uniform(dims, 4, 0.5, &device, DType::F32) - 0.5).require_grad();
    let state = uniform([2, 4, 60, 60], 5, 0.5, &device, DType::F32).require_grad();
    let out = chunk_linear_relation(
        LinearInputs::new(p1.clone(), p2.clone(), info.clone(), gates.clone())
            .with_state(state.clone()),
        DEFAULT_TAU,
        64,
        Strategy::Fused,
    )
    .unwrap();
    let loss = (out.y.clone() * out.y.clone()).sum() + out.state.clone().sum();
    let grads = loss.backward();
    let mut data = vec![out.y.into_data(), out.state.into_data()];
    for x in [&p1, &p2, &info, &gates, &state] {
        data.push(x.grad(&grads).unwrap().into_data());
    }
    data
}

/// Outputs and gradients of the language-model ops (dense product, RMSNorm, RoPE, SwiGLU gate,
/// cross-entropy), as data.
fn lm_run() -> Vec<TensorData> {
    let device = Device::flex().autodiff();
    let gate = uniform([3, 700, 96], 1, 3.0, &device, DType::F32).require_grad();
    let up = uniform([3, 700, 96], 2, 1.0, &device, DType::F32).require_grad();
    let y = relation_kernels::swiglu(gate.clone(), up.clone(), Strategy::Fused).unwrap();
    let x = uniform([300, 517], 4, 1.0, &device, DType::F32).require_grad();
    let w = uniform([777, 517], 5, 1.0, &device, DType::F32).require_grad();
    // [300, 517] x [777, 517]ᵀ: big enough to be split among threads.
    let logits = relation_kernels::dense(
        x.clone(),
        w.clone(),
        relation_core::WeightLayout::OutIn,
        Strategy::Fused,
    )
    .unwrap();
    // A decoding step's projection: 16 rows by a `[K, N]` weight, its columns split among
    // threads (the few-rows product).
    let xs = uniform([16, 256], 9, 1.0, &device, DType::F32);
    let ws = uniform([256, 1000], 10, 1.0, &device, DType::F32);
    let few = relation_kernels::dense(
        xs.clone(),
        ws,
        relation_core::WeightLayout::InOut,
        Strategy::Fused,
    )
    .unwrap();
    // And by a weight stored `[N, K]` (the tied head): row-by-row dot products.
    let wt = uniform([1000, 256], 11, 1.0, &device, DType::F32);
    let few_t =
        relation_kernels::dense(xs, wt, relation_core::WeightLayout::OutIn, Strategy::Fused)
            .unwrap();
    let ids: Vec<i64> = (0..300).map(|i| (i * 37 % 777) as i64).collect();
    let targets = Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(ids, [300]), &device);
    let nll = relation_kernels::cross_entropy(logits.clone(), targets, Strategy::Fused).unwrap();
    let h = uniform([3, 300, 96], 7, 2.0, &device, DType::F32).require_grad();
    let gamma = uniform([96], 8, 1.0, &device, DType::F32).require_grad();
    // 900 rows: several fixed row blocks, whose dγ partials must add up the same way.
    let normed =
        relation_kernels::rms_norm(h.clone(), gamma.clone(), 1e-6, Strategy::Fused).unwrap();
    let p = uniform([2, 300, 8, 48], 6, 2.0, &device, DType::F32).require_grad();
    let positions = RopePositions::From(7);
    let rotated = relation_kernels::rope(p.clone(), &positions, 1e4, Strategy::Fused).unwrap();
    let grads = ((y.clone() * y.clone()).sum()
        + nll.clone().sum()
        + (rotated.clone() * rotated.clone()).sum()
        + (normed.clone() * normed.clone()).sum())
    .backward();
    vec![
        few.into_data(),
        few_t.into_data(),
        y.into_data(),
        nll.into_data(),
        gate.grad(&grads).unwrap().into_data(),
        up.grad(&grads).unwrap().into_data(),
        x.grad(&grads).unwrap().into_data(),
        w.grad(&grads).unwrap().into_data(),
        rotated.into_data(),
        normed.into_data(),
        h.grad(&grads).unwrap().into_data(),
        gamma.grad(&grads).unwrap().into_data(),
        p.grad(&grads).unwrap().into_data(),
    ]
}

#[test]
fn flex_kernels_are_bitwise_equal_on_one_and_many_threads() {
    for (name, run) in [
        ("flash_relation", flash_run as fn() -> Vec<TensorData>),
        ("chunk_linear_relation", linear_run),
        ("dense + rms_norm + rope + swiglu + cross_entropy", lm_run),
    ] {
        let one = on_threads(1, run);
        for threads in [2, 3] {
            let many = on_threads(threads, run);
            for (k, (a, b)) in one.iter().zip(&many).enumerate() {
                assert_eq!(
                    a, b,
                    "{name}: output {k} differs between 1 and {threads} threads"
                );
            }
        }
    }
}

/// FNV-1a over the bits of every value of `runs`: one line per run, for the parent process.
fn digests(runs: &[Vec<TensorData>]) -> String {
    runs.iter()
        .map(|run| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for data in run {
                for v in data.iter::<f32>() {
                    for byte in v.to_bits().to_le_bytes() {
                        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
                    }
                }
            }
            format!("{h:016x}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run in a child process by [`flex_kernels_under_each_instruction_set`], with `RELATION_SIMD`
/// set: prints which instruction set the kernels used and the digests of the three runs.
#[test]
#[ignore = "run in a child process by flex_kernels_under_each_instruction_set"]
fn simd_child() {
    let runs = [flash_run(), linear_run(), lm_run()];
    println!(
        "SIMD {} {}",
        relation_kernels::flex_simd().name(),
        digests(&runs)
    );
}

/// The Flex kernels under each vector instruction set this CPU has (`RELATION_SIMD`, one child
/// process each, since the choice is process-wide): each run uses the set it asked for, and
/// AVX-512 and AVX2 give the same bits (every tile product sums its `k` terms in order at any
/// vector width, the element-wise reductions keep a fixed number of partial sums at either
/// width, and every multiply-add of `exp` is fused under both).
#[test]
fn flex_kernels_under_each_instruction_set() {
    use relation_kernels::FlexSimd;
    let levels: Vec<FlexSimd> = [FlexSimd::Avx512, FlexSimd::Avx2]
        .into_iter()
        .filter(|l| l.is_available())
        .collect();
    let mut seen = Vec::new();
    for level in &levels {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "flex_threads::simd_child",
                "--ignored",
                "--nocapture",
            ])
            .env("RELATION_SIMD", level.name())
            .output()
            .expect("the test binary runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("SIMD "))
            .unwrap_or_else(|| panic!("no SIMD line from the child for {level:?}: {stdout}"));
        let (used, digests) = line.split_once(' ').expect("name and digests");
        assert_eq!(
            used,
            level.name(),
            "RELATION_SIMD={} was not used",
            level.name()
        );
        seen.push((level.name(), digests.to_string()));
    }
    for pair in seen.windows(2) {
        assert_eq!(
            pair[0].1, pair[1].1,
            "the Flex kernels' bits differ between {} and {}",
            pair[0].0, pair[1].0
        );
    }
    eprintln!("instruction sets compared: {seen:?}");
}

/// Which CPUs get 512-bit Flex kernels by default, from CPUID values of real parts (leaf 1's
/// EAX): Intel with AVX-512 yes; AMD Zen 5 (family 26) yes; AMD Zen 4 (family 25), where
/// 512-bit operations run as two halves but still measured 5–8 % faster, yes; earlier AMD
/// families (which have no AVX-512 anyway) and Hygon no. A decoding slip in the extended family
/// fails here.
#[test]
fn avx512_by_default_on_intel_and_amd_from_zen4() {
    use relation_kernels::FlexSimd;
    let cases: [(&[u8], u32, bool, &str); 5] = [
        (
            b"GenuineIntel",
            0x0005_0654,
            true,
            "Xeon (Skylake-SP), family 6",
        ),
        (
            b"AuthenticAMD",
            0x00B0_0F21,
            true,
            "EPYC 9005 (Zen 5), family 26",
        ),
        (
            b"AuthenticAMD",
            0x00A1_0F11,
            true,
            "EPYC 9004 (Zen 4), family 25",
        ),
        (
            b"AuthenticAMD",
            0x0080_0F12,
            false,
            "EPYC 7001 (Zen), family 23",
        ),
        (
            b"HygonGenuine",
            0x0090_0F01,
            false,
            "Hygon Dhyana, family 24",
        ),
    ];
    for (vendor, eax, expected, cpu) in cases {
        assert_eq!(
            FlexSimd::prefers_512_bits(vendor, eax),
            expected,
            "{cpu} (EAX {eax:#010x})"
        );
    }
}
