//! The process's allocator settings for training on a CPU.

/// Asks glibc's allocator to keep freed memory for reuse instead of handing it back to the
/// system, unless the user set `GLIBC_TUNABLES` (theirs win). Returns whether the settings were
/// applied: `false` when `GLIBC_TUNABLES` is set or the target is not Linux with glibc.
///
/// Why: a training step allocates and frees the same multi-megabyte buffers every step (each
/// layer's activations and gradients, the `[B·T, V]` logits). By default glibc serves every
/// allocation above its mmap threshold with a fresh `mmap` and unmaps it on free, so every step
/// page-faults in (and the kernel zeroes) hundreds of megabytes: ~11 % of the CPU time of the
/// 3.7M-parameter CPU step went to page faults. With no `mmap` for allocations and no trimming,
/// the buffers come back from the heap already mapped. Measured (`scripts/bench/ab.sh`, 3
/// interleaved rounds, same binary with and without these settings): 3,128 / 3,678 / 3,485
/// tokens/s without, 3,952 / 3,970 / 3,686 with. The price: the process keeps its peak memory
/// until it exits, as a trainer does anyway.
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

/// Allocations of at least this many bytes are hinted to be backed by huge pages ([`HugePages`]).
pub const HUGE_PAGE_HINT_MIN: usize = 4 << 20;

/// The system allocator, with every allocation of at least [`HUGE_PAGE_HINT_MIN`] bytes marked
/// for transparent huge pages (`madvise(MADV_HUGEPAGE)` on the 2 MiB pages it covers whole).
///
/// Why: the step's activations, gradients and logits are 4–64 MiB buffers that the matrix
/// products stream through, packing strided panels of them; on 4 KiB pages every such pass walks
/// thousands of page-table entries. Linux distributions commonly ship transparent huge pages in
/// `madvise` mode, where memory gets 2 MiB pages only when asked, and glibc asks only under its
/// `glibc.malloc.hugetlb=1` tunable, which cannot be set from inside a running process. With
/// [`keep_freed_memory`] the buffers are reused from step to step, so each range is hinted
/// before its first use and keeps its huge pages. Results are unchanged; where transparent huge
/// pages are off (or always on) the hint changes nothing.
///
/// The `relation` binary installs it (`#[global_allocator]`); a program that wants the same
/// declares `#[global_allocator] static ALLOC: HugePages = HugePages;`.
pub struct HugePages;

// SAFETY: every method forwards to `System` with the caller's arguments; the hint only changes
// how the kernel backs pages the allocation owns, never their contents or addresses.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { std::alloc::System.alloc(layout) };
        hint_huge_pages(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        hint_huge_pages(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as `alloc`.
        unsafe { std::alloc::System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        // SAFETY: as `alloc`.
        let q = unsafe { std::alloc::System.realloc(p, layout, size) };
        hint_huge_pages(q, size);
        q
    }
}

/// The whole 2 MiB pages inside `[addr, addr + len)`, as `(start, end)` addresses, when `len` is
/// at least [`HUGE_PAGE_HINT_MIN`] and the range covers one: what [`HugePages`] hints.
///
/// ```
/// use relation_train::memory::{HUGE_PAGE_HINT_MIN, huge_page_range};
/// const MIB: usize = 1 << 20;
/// assert_eq!(huge_page_range(2 * MIB, HUGE_PAGE_HINT_MIN), Some((2 * MIB, 6 * MIB)));
/// // Unaligned: only the pages inside, [4 MiB, 6 MiB).
/// assert_eq!(huge_page_range(2 * MIB + 8, HUGE_PAGE_HINT_MIN), Some((4 * MIB, 6 * MIB)));
/// assert_eq!(huge_page_range(2 * MIB, HUGE_PAGE_HINT_MIN - 1), None);
/// ```
pub fn huge_page_range(addr: usize, len: usize) -> Option<(usize, usize)> {
    const HUGE_PAGE: usize = 2 << 20;
    if len < HUGE_PAGE_HINT_MIN {
        return None;
    }
    let start = addr.next_multiple_of(HUGE_PAGE);
    let end = addr.checked_add(len)? / HUGE_PAGE * HUGE_PAGE;
    (end > start).then_some((start, end))
}

/// `madvise(MADV_HUGEPAGE)` on [`huge_page_range`] of an allocation (Linux with glibc only;
/// nothing elsewhere). A failed hint is ignored: it only means 4 KiB pages, as without it.
fn hint_huge_pages(p: *mut u8, len: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if !p.is_null()
        && let Some((start, end)) = huge_page_range(p as usize, len)
    {
        // SAFETY: the range lies inside the allocation just made (owned by the caller);
        // `MADV_HUGEPAGE` only sets how the kernel backs it, and cannot fault.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (p, len);
}
