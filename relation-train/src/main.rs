//! `relation`: train, evaluate and sample from Relation language models.

use clap::Parser;
use relation_train::cli::{Cli, run};

fn main() {
    keep_freed_memory();
    init_tracing();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Sends `tracing` events to stderr, filtered by `RUST_LOG` (e.g.
/// `RUST_LOG=relation_train=debug`). Without `RUST_LOG` nothing is installed, so the command's
/// output is exactly what it is without tracing; a `RUST_LOG` that does not parse is reported
/// and ignored rather than failing the command.
fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Plain text even when another crate of the build (burn-train) turns on
            // tracing-subscriber's `ansi` feature: logs are read by programs and files too.
            .with_ansi(false)
            .init(),
        Err(e) => eprintln!("warning: RUST_LOG ignored ({e})"),
    }
}

/// Asks glibc's allocator to keep freed memory for reuse instead of handing it back to the
/// system, unless the user set `GLIBC_TUNABLES` (theirs win).
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
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: `mallopt` only changes allocator parameters; it is called before any other
        // thread exists, and every parameter and value here is one glibc documents.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            libc::mallopt(libc::M_TOP_PAD, 64 << 20);
        }
    }
}
