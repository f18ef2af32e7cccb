//! The process's allocator settings for training on a CPU.

/// Asks glibc's allocator to keep freed memory for reuse instead of handing it back to the
/// system, unless the user set `GLIBC_TUNABLES` (theirs win). Returns whether the settings were
/// applied: `false` when `GLIBC_TUNABLES` is set or the target is not Linux with glibc.
///
/// Why: a training step allocates and frees the same multi-megabyte buffers every step (each
/// layer's activations and gradients, the `[B·T, V]` logits). By default glibc serves every
/// allocation above its mmap threshold with a fresh `mmap` and unmaps it on free, so every step
/// page-faults in (and the kernel zeroes) hundreds of megabytes, a large share of a CPU step's
/// time. With no `mmap` for allocations and no trimming, the buffers come back from the heap
/// already mapped (measured with `scripts/bench/ab.sh`: `docs/bench/cpu-train.md`). The price:
/// the process keeps its peak memory until it exits, as a trainer does anyway.
///
/// One limit: a thread other than the main one allocates from an arena of its own, which grows
/// in heaps of at most 64 MiB, and glibc still maps a single request larger than such a heap
/// (it has nowhere else to put it). The trainer's largest buffers (the `[B·T, V]` logits and
/// their gradient, 64 MiB at 4,096 tokens of a 4,096-token vocabulary) are made on the main
/// thread, whose heap has no such bound.
///
/// The setting is process-wide, so the library never makes it on its own: the `relation` binary
/// calls this first thing in `main`, and so should any program (or benchmark) that wants the
/// binary's speed. The equivalent without code:
/// `GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647:glibc.malloc.top_pad=67108864`.
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: `mallopt` only changes allocator parameters (glibc documents it as thread-safe;
        // it takes the arena locks), and every parameter and value here is one glibc documents.
        #[allow(unsafe_code)]
        unsafe {
            // No allocation is served by `mmap` (so none is unmapped, and faulted in again, when
            // freed and reallocated); the heap is never trimmed; it grows 64 MiB at a time.
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            libc::mallopt(libc::M_TOP_PAD, 64 << 20);
        }
        return true;
    }
    false
}
