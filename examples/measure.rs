//! What the benchmarks share: the flags every benchmark takes, timing that waits for the
//! device, and allocator readings.

use std::time::{Duration, Instant};

use burn::tensor::{DType, Device};

/// The flags every benchmark takes (`#[command(flatten)]` into its own `clap::Parser`).
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Device: flex (the CPU), wgpu, vulkan, metal, cuda:N, rocm:N, cpu (CubeCL's CPU
    /// runtime), ndarray; the backend's cargo feature must be on.
    #[arg(long, default_value = "flex")]
    pub device: String,
    /// Sequence lengths T to measure, comma separated (default: the benchmark's own).
    #[arg(long, value_delimiter = ',')]
    pub seqs: Vec<usize>,
    /// Heads H.
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Head dimension D.
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// Timed iterations per measurement, after one warm-up (default: the benchmark's own).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: Option<u32>,
    /// Also write the result table to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
}

impl BenchArgs {
    /// The device `--device` names; exits with the parser's message (status 2) otherwise.
    pub fn device(&self) -> Device {
        relation_kernels::device::parse_device(&self.device).unwrap_or_else(|err| {
            eprintln!("error: --device: {err}");
            std::process::exit(2)
        })
    }

    /// `--seqs`, or `default` without it.
    pub fn seqs_or(&self, default: &[usize]) -> Vec<usize> {
        if self.seqs.is_empty() {
            default.to_vec()
        } else {
            self.seqs.clone()
        }
    }

    /// `--iters`, or `default` without it.
    pub fn iters_or(&self, default: u32) -> usize {
        self.iters.unwrap_or(default) as usize
    }
}

/// `--dtype f32|f16|bf16` for `clap` (`value_parser = parse_dtype`).
pub fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        other => Err(format!("unknown dtype `{other}` (f32, f16, bf16)")),
    }
}

/// Mean time of `iters` calls of `f` after one warm-up call (compilation, autotune, allocation),
/// waiting for the device to finish before reading the clock.
pub fn time_on(device: &Device, iters: usize, f: &mut dyn FnMut()) -> Duration {
    f();
    device.sync().expect("device sync");
    let start = Instant::now();
    for _ in 0..iters.max(1) {
        f();
    }
    device.sync().expect("device sync");
    start.elapsed() / iters.max(1) as u32
}

/// Bytes the device allocator holds while `f`'s result is alive, above what it held before
/// (`None` on backends that do not report it).
pub fn bytes_held_by<T>(device: &Device, f: impl FnOnce() -> T) -> Option<u64> {
    device.memory_cleanup();
    let before = device.memory_pool_usage().map(|u| u.bytes_in_use);
    let kept = f();
    device.sync().expect("device sync");
    let after = device.memory_pool_usage().map(|u| u.bytes_in_use);
    drop(kept);
    before.zip(after).map(|(b, a)| a.saturating_sub(b))
}

/// Peak working memory of `f` as the device allocator saw it: the bytes reserved once `f` has
/// run, less those in use before it, after a cleanup that returned every page nothing held.
/// `None` on backends that do not report it.
///
/// An upper bound, by at most the free space on the reserved pages: every byte in use at `f`'s
/// peak lay on a page reserved at that moment, and the allocator keeps its pages until the next
/// cleanup (as long as `f` allocates nothing larger than it did before, so no page size grows and
/// no outdated page is returned while it runs: measure after a warm-up run). CubeCL has no
/// resettable high-water mark of the bytes in use, and the growth of the reserved bytes, what this
/// measured first, reads low: the pages that held `f`'s inputs had room for its working memory
/// (0.1 MiB for a FlashRelation training step at T = 2048 that holds 2.1 MiB after the forward).
pub fn peak_reserved_by(device: &Device, f: impl FnOnce()) -> Option<u64> {
    device.memory_cleanup();
    let before = device.memory_pool_usage().map(|u| u.bytes_in_use);
    f();
    device.sync().expect("device sync");
    let after = device.memory_pool_usage().map(|u| u.bytes_reserved);
    before.zip(after).map(|(b, a)| a.saturating_sub(b))
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// MiB with one decimal, or `n/a`.
pub fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("n/a".into(), |b| {
        format!("{:.1}", b as f64 / (1 << 20) as f64)
    })
}

/// A short description of `device`: the adapter's name on wgpu, the thread count on CPUs and,
/// on Flex, the vector instruction set its kernels run with.
pub fn device_label(device: &Device) -> String {
    #[cfg(feature = "wgpu")]
    if let Some(identity) = device.identity() {
        return format!("{device:?} ({})", identity.name);
    }
    let simd = if relation_kernels::is_flex(device) {
        format!(", {}", relation_kernels::flex_simd().name())
    } else {
        String::new()
    };
    format!(
        "{device:?} ({} CPU threads{simd})",
        relation_kernels::cpu_threads()
    )
}

/// A global allocator that counts the bytes in use and their high-water mark, so benchmarks can
/// report the peak memory of CPU backends, which keep no pool statistics. A benchmark installs
/// it with `#[global_allocator] static ALLOC: Counting = Counting;`.
pub mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CURRENT: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    /// The system allocator, counting.
    pub struct Counting;

    fn grew(bytes: usize) {
        let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }

    // SAFETY: every call forwards to `System` with the caller's layout unchanged; the counters
    // are side bookkeeping that never touches the memory.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded as is (see the impl).
            let ptr = unsafe { System.alloc(layout) };
            if !ptr.is_null() {
                grew(layout.size());
            }
            ptr
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded as is (see the impl).
            let ptr = unsafe { System.alloc_zeroed(layout) };
            if !ptr.is_null() {
                grew(layout.size());
            }
            ptr
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded as is (see the impl).
            unsafe { System.dealloc(ptr, layout) };
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: forwarded as is (see the impl).
            let new = unsafe { System.realloc(ptr, layout, new_size) };
            if !new.is_null() {
                CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
                grew(new_size);
            }
            new
        }
    }

    /// Peak bytes in use while `f` runs, above what was in use before it (needs [`Counting`]
    /// installed as the global allocator; `None` otherwise).
    pub fn peak_bytes_of(f: impl FnOnce()) -> Option<u64> {
        let before = CURRENT.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        f();
        let peak = PEAK.load(Ordering::Relaxed);
        (peak > 0 || before > 0).then(|| peak.saturating_sub(before) as u64)
    }
}

/// Peak working memory of a measured closure, as [`peak_bytes`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peak {
    /// The process heap's high-water mark above what was in use before (CPU backends).
    Exact(u64),
    /// An upper bound from the device allocator's pages (CubeCL devices, [`peak_reserved_by`]).
    AtMost(u64),
}

/// Peak working memory of `f` on `device`: an upper bound from the allocator's pages on CubeCL
/// devices ([`peak_reserved_by`]), the process heap's high-water mark on CPU backends
/// ([`counting::peak_bytes_of`]).
pub fn peak_bytes(device: &Device, f: impl FnOnce()) -> Option<Peak> {
    if relation_kernels::is_cube(device) {
        peak_reserved_by(device, f).map(Peak::AtMost)
    } else {
        counting::peak_bytes_of(f).map(Peak::Exact)
    }
}

/// A [`Peak`] in MiB with one decimal: `≤ 19.5` for an upper bound, `n/a` when unknown.
pub fn peak_mib(peak: Option<Peak>) -> String {
    match peak {
        None => mib(None),
        Some(Peak::Exact(bytes)) => mib(Some(bytes)),
        Some(Peak::AtMost(bytes)) => format!("≤ {}", mib(Some(bytes))),
    }
}
