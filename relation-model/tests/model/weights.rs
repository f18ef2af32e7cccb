//! The weights: save then load gives identical logits, and mixed precision's f16 compute copy
//! tracks f32 (logits, and gradients on the f32 master parameters).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{DType, Device, Tensor};
use relation_model::{ModelError, RelationLmConfig};

use super::{model, tiny, tokens};

#[test]
fn save_then_load_gives_identical_logits() {
    let device = Device::flex();
    let config = tiny("LLLF", 4);
    let lm = model(&config, &device);
    let dir = std::env::temp_dir().join(format!("relation-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.bpk");
    lm.save(&path).unwrap();
    config.save(dir.join("config.json")).unwrap();

    let loaded_config = RelationLmConfig::load(dir.join("config.json")).unwrap();
    assert_eq!(loaded_config, config);
    device.seed(99); // different initial weights, replaced by the load
    let fresh = loaded_config.init(&device).unwrap();
    let loaded = fresh.load(&path).unwrap();
    let ids = tokens(1, 9, 97, 5, &device);
    let (a, b): (Vec<f32>, Vec<f32>) = (
        lm.forward(ids.clone())
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect(),
        loaded
            .forward(ids)
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect(),
    );
    assert_eq!(a, b);

    let missing = tiny("LLLF", 4)
        .init(&device)
        .unwrap()
        .load(&dir.join("absent.bpk"));
    assert!(matches!(missing, Err(ModelError::Io(_))));

    // Weights of another model are a typed error naming what does not fit, never a panic:
    // another width (every shape differs), another pattern (other tensor names).
    let wider = RelationLmConfig::new(97, 64, 4, 4, 64).with_pattern("LLLF".into());
    match wider.init(&device).unwrap().load(&path) {
        Err(ModelError::RecordMismatch { path: p, reason }) => {
            assert!(p.ends_with("model.bpk"), "{p}");
            assert!(reason.contains("shape mismatch"), "{reason}");
        }
        other => panic!("expected RecordMismatch, got {:?}", other.map(|_| ())),
    }
    match tiny("AAAA", 4).init(&device).unwrap().load(&path) {
        Err(ModelError::RecordMismatch { reason, .. }) => {
            assert!(
                reason.contains("Missing") || reason.contains("Unused"),
                "{reason}"
            );
        }
        other => panic!("expected RecordMismatch, got {:?}", other.map(|_| ())),
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Mixed precision's compute copy: `cast_params(F16)` runs the whole model in f16 (logits in
/// f16, close to f32's), and the gradients of a loss computed with it land on the f32 master
/// parameters through the casts, in f32, close to the all-f32 gradients.
fn check_f16_compute_copy(device: &Device, pattern: &str) {
    use burn::optim::GradientsParams;
    use burn::tensor::FloatDType;
    let device = device.clone().autodiff();
    let config = tiny(pattern, 2);
    let master = model(&config, &device);
    let x = tokens(2, 24, config.vocab_size, 3, &device);
    let loss_of = |logits: Tensor<3>| logits.cast(FloatDType::F32).powi_scalar(2).mean();

    let full = master.forward(x.clone()).unwrap();
    let grads_full = GradientsParams::from_grads(loss_of(full.clone()).backward(), &master);
    let half_model = master.cast_params(FloatDType::F16);
    let half = half_model.forward(x).unwrap();
    assert_eq!(
        half.dtype(),
        DType::F16,
        "{pattern}: the compute copy runs in f16"
    );
    // Loss scaling, as the trainer does in f16: the smallest gradients here (the decay gate's,
    // ~3e-5) are below f16's smallest normal number (6.1e-5) without it.
    const SCALE: f32 = 65536.0;
    let scaled = loss_of(half.clone()).mul_scalar(SCALE);
    let grads_half = GradientsParams::from_grads(scaled.backward(), &master);

    let f32_of = |t: Tensor<3>| {
        t.cast(FloatDType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let scale = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (a, b) = (f32_of(full), f32_of(half));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        err <= 2e-2 * scale(&a).max(1.0),
        "{pattern}: logits f16 vs f32 max error {err}"
    );

    struct Compare<'a> {
        full: &'a GradientsParams,
        half: &'a GradientsParams,
        checked: usize,
        worst: f32,
        worst_at: String,
        path: Vec<String>,
    }
    impl burn::module::ModuleVisitor for Compare<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            let (Some(f), Some(h)) = (self.full.get::<D>(param.id), self.half.get::<D>(param.id))
            else {
                panic!("a parameter without a gradient in one of the runs");
            };
            assert_eq!(h.dtype(), DType::F32, "master gradients are f32");
            let f = f.into_data().try_to_vec::<f32>().unwrap();
            let h = h.into_data().try_to_vec::<f32>().unwrap();
            let h: Vec<f32> = h.iter().map(|x| x / SCALE).collect();
            let norm = f.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            let diff = f
                .iter()
                .zip(&h)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                .sqrt();
            if diff / norm > self.worst {
                self.worst = diff / norm;
                self.worst_at = self.path.join(".");
            }
            self.checked += 1;
        }
    }
    let mut cmp = Compare {
        full: &grads_full,
        half: &grads_half,
        checked: 0,
        worst: 0.0,
        worst_at: String::new(),
        path: Vec::new(),
    };
    master.visit(&mut cmp);
    // Every float parameter was visited (one without a gradient panics above).
    assert!(cmp.checked >= 8, "{pattern}: {} parameters", cmp.checked);
    assert!(
        cmp.worst < 5e-2,
        "{pattern}: worst relative gradient error {} at {}",
        cmp.worst,
        cmp.worst_at
    );
}

#[test]
fn f16_compute_copy_tracks_f32_on_flex() {
    for pattern in ["F", "L", "A"] {
        check_f16_compute_copy(&Device::flex(), pattern);
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn f16_compute_copy_tracks_f32_with_kernels() {
    check_f16_compute_copy(&Device::wgpu(burn::tensor::DeviceKind::DefaultDevice), "LF");
}
