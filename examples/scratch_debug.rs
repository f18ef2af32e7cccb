use burn::tensor::{DType, Device, DeviceKind, Tensor};
use relation_core::testing::uniform;
use relation_kernels::{Strategy, debug, flash_relation};
fn main() {
    let device = Device::wgpu(DeviceKind::DefaultDevice);
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (t, d, poison) = (args[0], args[1], args[2] == 1);
    debug::poison_outputs(poison);
    let dims = [1, t, 1, d];
    let p1 = uniform(dims, 8, 1.5, &device, DType::F32);
    let p2 = uniform(dims, 9, 1.5, &device, DType::F32);
    let info = uniform(dims, 10, 1.0, &device, DType::F32);
    let lambda = Tensor::<1>::from_data([0.5f32], &device);
    let y = flash_relation(p1.clone(), p2.clone(), info.clone(), lambda.clone(), 2.0, Strategy::Fused).unwrap();
    let r = flash_relation(p1, p2, info, lambda, 2.0, Strategy::Reference).unwrap();
    let diff: Vec<f32> = (y.clone() - r).abs().into_data().to_vec().unwrap();
    let rows_bad: Vec<usize> = (0..t).filter(|&i| diff[i * d..(i + 1) * d].iter().any(|x| !(*x < 1e-3))).collect();
    println!("rows differing from reference: {} first {:?}", rows_bad.len(), rows_bad.first());
    let v: Vec<f32> = y.into_data().to_vec().unwrap();
    let bad: Vec<usize> = (0..t).filter(|&i| v[i * d..(i + 1) * d].iter().any(|x| x.is_nan())).collect();
    println!("T={t} D={d} poison={poison}: {} NaN rows, first {:?}, last {:?}", bad.len(), bad.first(), bad.last());
}
