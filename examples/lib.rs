//! Helpers shared by the examples and benchmarks: timing that waits for the device, and
//! allocator readings (`measure.rs`), and the kernel benchmarks (`bench/`). Devices are chosen by
//! name with `relation_kernels::device::parse_device`, the parser the `relation` command line
//! uses too.

/// The kernel benchmarks behind `flash_relation_bench`, `linear_relation_bench` and `gpu_check`.
pub mod bench {
    pub mod decode;
    pub mod flash;
    pub mod linear;
    pub mod staging;
}
mod measure;

pub use measure::{
    BenchArgs, Peak, bytes_held_by, counting, device_label, mib, ms, parse_dtype, peak_bytes,
    peak_mib, peak_reserved_by, time_on,
};
