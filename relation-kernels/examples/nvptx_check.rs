//! The offline tensor-core check: the half-precision tile kernels (FlashRelation's, the chunked
//! Linear Relation's) compiled to PTX for NVIDIA GPUs with no GPU and no CUDA installation
//! (`relation_kernels::nvptx`), then checked: every kernel holds matrix instructions (`mma`) and
//! no local memory, and — given NVIDIA's assembler (`--ptxas`, from PyPI's `nvidia-cuda-nvcc-cu12`;
//! `scripts/gpu/nvptx-check.sh` fetches it) — assembles without register spills. Prints one table
//! row per kernel; exits non-zero when a check fails.
//!
//! ```text
//! cargo run -p relation-kernels --features cuda,cpu,testing --example nvptx_check -- \
//!     --sm 80,90 --head-dims 64,128 --ptxas /path/to/ptxas --out target/nvptx
//! ```

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use burn::tensor::{DType, Device};
use relation_kernels::nvptx::flash_tile_kernels;

struct Args {
    sms: Vec<u32>,
    head_dims: Vec<usize>,
    dtypes: Vec<DType>,
    ptxas: Option<PathBuf>,
    out: PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        sms: vec![80, 90],
        head_dims: vec![64, 128],
        dtypes: vec![DType::F16, DType::BF16],
        ptxas: None,
        out: PathBuf::from("target/nvptx"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let list = |v: String| -> Result<Vec<usize>, String> {
            v.split(',')
                .map(|x| x.trim().parse().map_err(|_| format!("not a number: {x}")))
                .collect()
        };
        match flag.as_str() {
            "--sm" => args.sms = list(value()?)?.into_iter().map(|x| x as u32).collect(),
            "--head-dims" => args.head_dims = list(value()?)?,
            "--dtypes" => {
                args.dtypes = value()?
                    .split(',')
                    .map(|d| match d {
                        "f16" => Ok(DType::F16),
                        "bf16" => Ok(DType::BF16),
                        other => Err(format!("dtype {other}: f16 or bf16")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--ptxas" => args.ptxas = Some(PathBuf::from(value()?)),
            "--out" => args.out = PathBuf::from(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// `(registers, spill store bytes, spill load bytes)` from `ptxas -v`'s report of one kernel,
/// assembled for the PTX's own `.target` (`sm_90a` where the compiler chose Hopper's
/// architecture-specific variant).
fn assemble(ptxas: &PathBuf, file: &PathBuf, ptx: &str) -> Result<(u32, u32, u32), String> {
    let target = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".target "))
        .and_then(|t| t.split(',').next())
        .map(str::trim)
        .ok_or(format!("no .target line in {}", file.display()))?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={target}"))
        .args(["-v", "-o", "/dev/null"])
        .arg(file)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("ptxas failed on {}:\n{text}", file.display()));
    }
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let end = line.find(what)?;
        line[..end].split_whitespace().last()?.parse().ok()
    };
    let (mut regs, mut stores, mut loads) = (None, 0, 0);
    for line in text.lines() {
        if let Some(r) = number_before(line, "registers") {
            regs = Some(r);
        }
        if let Some(s) = number_before(line, "bytes spill stores") {
            stores = s;
        }
        if let Some(l) = number_before(line, "bytes spill loads") {
            loads = l;
        }
    }
    let regs = regs.ok_or(format!("no register count in ptxas' report:\n{text}"))?;
    Ok((regs, stores, loads))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("nvptx_check: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("nvptx_check: creating {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    let device = Device::cpu();
    let mut failed = Vec::new();
    println!(
        "| kernel | dtype | D | sm | planes x tile | shared KiB | mma instructions | local memory | registers | spill stores / loads (bytes) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &sm in &args.sms {
        for &dtype in &args.dtypes {
            for &head_dim in &args.head_dims {
                let kernels = match flash_tile_kernels(&device, dtype, head_dim, sm) {
                    Ok(k) => k,
                    Err(e) => {
                        failed.push(format!("{dtype:?} D {head_dim} sm_{sm}: {e}"));
                        continue;
                    }
                };
                for k in kernels {
                    let what = format!("{} {dtype:?} D {head_dim} sm_{sm}", k.name);
                    let file = args.out.join(format!(
                        "{}-{}-d{head_dim}-sm{sm}.ptx",
                        k.name,
                        format!("{dtype:?}").to_lowercase()
                    ));
                    if let Err(e) = std::fs::write(&file, &k.ptx) {
                        failed.push(format!("{what}: writing {}: {e}", file.display()));
                        continue;
                    }
                    // `wmma.mma.sync…` (CubeCL's cmma) or `mma.sync…` lines.
                    let mma = k
                        .ptx
                        .lines()
                        .filter(|l| {
                            let l = l.trim_start();
                            l.starts_with("mma.") || l.starts_with("wmma.mma")
                        })
                        .count();
                    let local = k.ptx.lines().filter(|l| l.contains(".local")).count();
                    if mma == 0 {
                        failed.push(format!("{what}: no mma instruction in the PTX"));
                    }
                    if local > 0 {
                        failed.push(format!("{what}: {local} lines use local memory"));
                    }
                    let (regs, spills) = match &args.ptxas {
                        Some(ptxas) => match assemble(ptxas, &file, &k.ptx) {
                            Ok((r, s, l)) => {
                                if s + l > 0 {
                                    failed.push(format!("{what}: spills {s} / {l} bytes"));
                                }
                                (r.to_string(), format!("{s} / {l}"))
                            }
                            Err(e) => {
                                failed.push(format!("{what}: {e}"));
                                ("?".into(), "?".into())
                            }
                        },
                        None => ("(no ptxas)".into(), "(no ptxas)".into()),
                    };
                    println!(
                        "| {} | {dtype:?} | {head_dim} | {sm} | {} x {} | {:.1} | {mma} | {local} | {regs} | {spills} |",
                        k.name,
                        k.shape.0,
                        k.shape.1,
                        k.shared_bytes as f64 / 1024.0,
                    );
                }
            }
        }
    }
    if failed.is_empty() {
        println!("\nall kernels: matrix instructions present, no local memory, no spills");
        ExitCode::SUCCESS
    } else {
        for f in &failed {
            eprintln!("FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
