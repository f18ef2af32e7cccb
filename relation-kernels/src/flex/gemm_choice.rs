//! Which GEMM the Flex backend's dense products use ([`FlexGemm`]): this crate's AVX-512 GEMM
//! (`gemm512.rs`) or faer's, chosen once per process by [`flex_gemm`] (`RELATION_GEMM`
//! overrides).

/// Which GEMM the Flex backend's dense products use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlexGemm {
    /// faer's GEMM (every CPU).
    Faer,
    /// This crate's AVX-512 GEMM (x86-64 with AVX-512F).
    Avx512,
}

impl FlexGemm {
    /// The name `RELATION_GEMM` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Faer => "faer",
            Self::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        match self {
            Self::Faer => true,
            Self::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
        }
    }

    /// The default for this CPU: [`FlexGemm::Avx512`] on Intel CPUs with AVX-512 (two full-width
    /// FMA ports, where these products ran closer to the machine's peak than faer's), faer
    /// everywhere else (on AMD's Zen 4 faer's products were the fastest measured).
    pub fn detect() -> Self {
        if super::simd::cpu_vendor() == *b"GenuineIntel" && Self::Avx512.is_available() {
            Self::Avx512
        } else {
            Self::Faer
        }
    }
}

/// The choice of [`flex_gemm`], made on its first call.
static GEMM: std::sync::OnceLock<FlexGemm> = std::sync::OnceLock::new();

/// The GEMM of the Flex backend's dense products: `RELATION_GEMM` (`avx512`, `faer` or `auto`)
/// when set to one this CPU has, else [`FlexGemm::detect`]. Chosen once per process.
pub fn flex_gemm() -> FlexGemm {
    *GEMM.get_or_init(|| {
        let chosen = match std::env::var("RELATION_GEMM").as_deref() {
            Ok("avx512") => Some(FlexGemm::Avx512),
            Ok("faer") => Some(FlexGemm::Faer),
            Ok("auto" | "") | Err(_) => None,
            Ok(other) => {
                tracing::warn!(
                    "RELATION_GEMM={other} is not one of avx512, faer, auto; using {}",
                    FlexGemm::detect().name()
                );
                None
            }
        };
        match chosen {
            Some(g) if g.is_available() => g,
            Some(g) => {
                tracing::warn!(
                    "RELATION_GEMM={}: this CPU does not have it; using {}",
                    g.name(),
                    FlexGemm::detect().name()
                );
                FlexGemm::detect()
            }
            None => FlexGemm::detect(),
        }
    })
}
