//! What a multi-process run's host-staged gradient exchange costs on a device: the time to read
//! a gradient-sized f32 buffer back to the host and to write it back to the device, at the
//! gradient sizes of the 3.7M, 10M and 100M presets (`relation-train`'s MPI ranks do both once
//! per step; see `docs/bench/mpi.md` for the exchange itself and the bandwidth model).
//!
//! ```text
//! gpu_check staging --device cuda --params 3670000,10430000,84570000 [--out staging.md]
//! ```
//!
//! Each row: the median of `--reps` timed round trips after one untimed, the device synchronised
//! before each clock read.

use std::io::Write;
use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};

use crate::device_label;

/// Device-to-host and host-to-device copies of gradient-sized buffers.
#[derive(Debug, clap::Parser)]
pub struct Args {
    /// Device (flex, wgpu, vulkan, cuda:N, ...; its feature must be on).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Buffer sizes in f32 values (parameters), comma separated.
    #[arg(
        long,
        default_value = "3670000,10430000,84570000",
        value_delimiter = ','
    )]
    params: Vec<usize>,
    /// Timed round trips per size.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Also write the table to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
}

/// Milliseconds of `f`, the device synchronised before and after.
fn timed(device: &Device, f: impl FnOnce()) -> f64 {
    device.sync().expect("device sync");
    let start = Instant::now();
    f();
    device.sync().expect("device sync");
    start.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Prints the table (and writes it to `--out`).
pub fn run(args: &Args) {
    let device = relation_kernels::device::parse_device(&args.device).expect("the device");
    let mut table = format!(
        "Device {}; f32 buffers, median of {} round trips\n\n",
        device_label(&device),
        args.reps.max(1)
    );
    table += "| values | MB | device to host ms | GB/s | host to device ms | GB/s |\n|---|---|---|---|---|---|\n";
    for &n in &args.params {
        let host: Vec<f32> = (0..n).map(|i| (i % 251) as f32).collect();
        let mut down = Vec::new();
        let mut up = Vec::new();
        for rep in 0..=args.reps.max(1) {
            let mut on_device = None;
            let h2d = timed(&device, || {
                on_device = Some(Tensor::<1>::from_data(
                    TensorData::new(host.clone(), [n]),
                    &device,
                ));
            });
            let t = on_device.expect("uploaded");
            let mut read = None;
            let d2h = timed(&device, || read = Some(t.into_data()));
            let read = read.expect("read back");
            assert_eq!(read.num_elements(), n, "the round trip kept every value");
            if rep > 0 {
                up.push(h2d);
                down.push(d2h);
            }
        }
        let mb = 4.0 * n as f64 / 1e6;
        let (d, u) = (median(down), median(up));
        table += &format!(
            "| {n} | {mb:.1} | {d:.2} | {:.1} | {u:.2} | {:.1} |\n",
            mb / d,
            mb / u
        );
    }
    print!("{table}");
    if let Some(path) = &args.out {
        let mut file = std::fs::File::create(path).expect("the table file");
        file.write_all(table.as_bytes()).expect("the table written");
    }
}
