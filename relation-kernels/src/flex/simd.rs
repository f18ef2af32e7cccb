//! Which vector instruction set the Flex kernels run with ([`FlexSimd`], chosen once per process
//! by [`flex_simd`]), and how a kernel body is compiled for it ([`Vectorized`], [`vectorized`],
//! with fused or unfused multiply-adds by [`MulAdd`]).

/// A kernel body to compile for the best vector extension this CPU has (AVX2 + FMA on x86-64,
/// where the default target is SSE2 only), chosen at run time by [`vectorized`]: a struct of the
/// body's arguments whose [`run`](Self::run) is `#[inline(always)]`. The arithmetic is the same
/// (no fast-math), so only speed changes.
///
/// Why a trait and not a closure: `pulp` compiles what is *inlined into* its
/// `#[target_feature]` trampoline for the vector extension, and LLVM does not inline a large
/// closure body there: with `simd(|| forward_block(…))` the FlashRelation forward and the
/// cross-entropy compiled to SSE2 code (no `ymm` register in their disassembly). A method marked
/// `#[inline(always)]` is always inlined, so its loops are vectorised for the extension.
pub(crate) trait Vectorized {
    /// What the body returns.
    type Output;
    /// The body, its multiply-adds computed as `M` says; implementations must be
    /// `#[inline(always)]`.
    fn run<M: MulAdd>(self) -> Self::Output;
}

pub(crate) use crate::math::{Fused, MulAdd, Unfused};

/// `pulp`'s entry: runs the body inside the trampoline compiled for the chosen extension.
struct Dispatch<K, M>(K, std::marker::PhantomData<M>);

impl<K: Vectorized, M: MulAdd> pulp::WithSimd for Dispatch<K, M> {
    type Output = K::Output;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> K::Output {
        self.0.run::<M>()
    }
}

/// Runs `kernel` compiled for the vector extension [`flex_simd`] chose (see [`Vectorized`]),
/// with fused multiply-adds wherever that extension has them: AVX2 and AVX-512 (x86-64-v3
/// includes FMA), and every aarch64 CPU; not x86-64's SSE2 baseline or other targets'.
pub(crate) fn vectorized<K: Vectorized>(kernel: K) -> K::Output {
    if flex_simd() != FlexSimd::Baseline || cfg!(target_arch = "aarch64") {
        vectorized_as::<K, Fused>(kernel)
    } else {
        vectorized_as::<K, Unfused>(kernel)
    }
}

/// [`vectorized`] with the multiply-adds `M` whatever the extension (for tests of both).
pub(crate) fn vectorized_as<K: Vectorized, M: MulAdd>(kernel: K) -> K::Output {
    arch().dispatch(Dispatch::<K, M>(kernel, std::marker::PhantomData))
}

/// The vector instruction set the Flex kernels (tile products, element-wise loops) run with.
/// Chosen once per process at run time, never by a compile-time flag: see [`flex_simd`].
/// Faer's dense products make their own choice (AVX-512 wherever the CPU has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlexSimd {
    /// x86-64-v4: AVX-512 (F, BW, CD, DQ, VL), 16 f32 lanes.
    Avx512,
    /// x86-64-v3: AVX2 and FMA, 8 f32 lanes.
    Avx2,
    /// What the target has without run-time detection: SSE2 on x86-64, NEON on aarch64, ...
    Baseline,
}

impl FlexSimd {
    /// The name `RELATION_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Baseline => "baseline",
        }
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        self.arch().is_some()
    }

    fn arch(self) -> Option<pulp::Arch> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => pulp::x86::V4::try_new().map(pulp::Arch::V4),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => pulp::x86::V3::try_new().map(pulp::Arch::V3),
            #[cfg(target_arch = "x86_64")]
            Self::Baseline => Some(pulp::Arch::Scalar),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx512 | Self::Avx2 => None,
            #[cfg(not(target_arch = "x86_64"))]
            Self::Baseline => Some(pulp::Arch::new()),
        }
    }

    /// The default for this CPU, by its vendor and family: AVX-512 where it trained faster
    /// (`scripts/bench/simd.sh`; the figures are in `docs/bench/cpu-train.md`), AVX2 on every
    /// other x86-64 CPU with AVX2, `Baseline` elsewhere.
    ///
    /// - Intel CPUs with AVX-512: their 512-bit units run the tile products' FMAs at twice the
    ///   width.
    /// - AMD from family 25 with AVX-512 (Zen 4, which runs each 512-bit operation as two
    ///   256-bit halves, and Zen 5): the kernels gain from the halved instruction count even at
    ///   256-bit throughput. (Family 25 before Zen 4, Zen 3, has no AVX-512 and gets AVX2.)
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if Self::Avx512.is_available() && prefers_512_bit_vectors() {
                return Self::Avx512;
            }
            if Self::Avx2.is_available() {
                return Self::Avx2;
            }
        }
        Self::Baseline
    }

    /// Whether an x86-64 CPU with AVX-512 runs the Flex kernels faster at 512 bits than at 256,
    /// from its CPUID vendor string (leaf 0: EBX, EDX, ECX) and leaf 1's EAX: Intel, or AMD from
    /// family 25 (Zen 4, the first AMD CPUs with AVX-512) on. The rule [`FlexSimd::detect`]
    /// applies to the CPU it runs on.
    pub fn prefers_512_bits(vendor: &[u8], cpuid_1_eax: u32) -> bool {
        // The display family: the base family (EAX bits 8..12), plus the extended family (bits
        // 20..28) when the base is 15, as on every AMD CPU from family 23 (Zen) on.
        let base = (cpuid_1_eax >> 8) & 0xf;
        let family = if base == 0xf {
            base + ((cpuid_1_eax >> 20) & 0xff)
        } else {
            base
        };
        match vendor {
            b"GenuineIntel" => true,
            b"AuthenticAMD" => family >= 25,
            _ => false,
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn prefers_512_bit_vectors() -> bool {
    // CPUID leaf 1: the family in EAX.
    FlexSimd::prefers_512_bits(&cpu_vendor(), std::arch::x86_64::__cpuid(1).eax)
}

/// The CPU's vendor string from CPUID leaf 0 (EBX, EDX, ECX): `GenuineIntel`, `AuthenticAMD`, ...
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_vendor() -> [u8; 12] {
    let id = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    for (i, word) in [id.ebx, id.edx, id.ecx].into_iter().enumerate() {
        vendor[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
    }
    vendor
}

/// The choice of [`flex_simd`], made on its first call.
static SIMD: std::sync::OnceLock<FlexSimd> = std::sync::OnceLock::new();

/// The instruction set the Flex kernels use: `RELATION_SIMD` (`avx512`, `avx2`, `baseline` or
/// `auto`) when set to one this CPU has, else [`FlexSimd::detect`]. Chosen once per process
/// (benchmarks and tests compare the choices in one child process each).
///
/// Results are deterministic for any thread count under one choice. Between choices the bits
/// can differ only where a kernel's reduction order follows the vector width; the tile
/// products and the reductions of the element-wise kernels do not (each output sums its `k`
/// terms in order, and the reductions keep a fixed number of partial sums at either width).
/// AVX-512 and AVX2 both fuse the same multiply-adds; x86-64's baseline fuses none (neither in
/// the element-wise loops nor in the tile products), so its bits can differ from theirs.
pub fn flex_simd() -> FlexSimd {
    *SIMD.get_or_init(|| simd_from_env().unwrap_or_else(FlexSimd::detect))
}

fn simd_from_env() -> Option<FlexSimd> {
    let value = std::env::var("RELATION_SIMD").ok()?;
    let level = match value.as_str() {
        "auto" | "" => return None,
        "avx512" => FlexSimd::Avx512,
        "avx2" => FlexSimd::Avx2,
        "baseline" => FlexSimd::Baseline,
        other => {
            tracing::warn!(
                "RELATION_SIMD={other} is not one of avx512, avx2, baseline, auto; using {}",
                FlexSimd::detect().name()
            );
            return None;
        }
    };
    if level.is_available() {
        Some(level)
    } else {
        tracing::warn!(
            "RELATION_SIMD={value}: this CPU does not have it; using {}",
            FlexSimd::detect().name()
        );
        None
    }
}

pub(crate) fn arch() -> pulp::Arch {
    flex_simd().arch().unwrap_or(pulp::Arch::Scalar)
}

/// Asks the CPU to bring `x` into the L1 cache ahead of its use: one hint per 64-byte line, on
/// x86-64 (`prefetcht0`); nothing elsewhere. A hint cannot fault, and changes no result.
#[inline(always)]
pub(crate) fn prefetch<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// [`prefetch`] into L2, not L1 (`prefetcht1`): for a stream read far ahead, whose requests
/// into L1 would hold the few line-fill buffers the demand loads need.
#[inline(always)]
pub(crate) fn prefetch_l2<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_hint::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(x);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// One `prefetch` hint of kind `HINT` per 64-byte line of `x`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_hint<const HINT: i32, T>(x: &[T]) {
    for line in x.chunks((64 / std::mem::size_of::<T>().max(1)).max(1)) {
        // SAFETY: `prefetch` (SSE, in every x86-64 CPU) only hints; the address is in `x`.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<HINT>(line.as_ptr().cast());
        }
    }
}
