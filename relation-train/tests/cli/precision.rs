//! Mixed precision: f16 and bf16 passes with f32 master weights, on Flex and wgpu, and f16's
//! loss scale.

use crate::common::*;

/// Mixed precision: `--precision f16|bf16` on `device` keeps f32 master weights, runs the
/// passes in half precision, tracks the f32 run's loss step by step (within 1%; the weights
/// start equal whatever the precision), announces and records itself, and (f16) saves its loss
/// scale in every checkpoint.
fn check_precision_tracks_f32(device: &str, precision: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let train = |name: &str, precision: &str| {
        let run = tmp.path().join(name);
        let mut args = with(tiny_args(&run, &cache, &corpus), "--steps", "6");
        args = with(args, "--device", device);
        args = with(args, "--precision", precision);
        let out = ok(&args);
        (run, out)
    };
    let (f32_run, _) = train("f32", "f32");
    let (half_run, out) = train("half", precision);
    assert!(
        out.contains(&format!("{precision} compute with f32 master weights")),
        "{out}"
    );
    let (a, b) = (rows(&f32_run), rows(&half_run));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 0.01 * x,
            "{device}: step loss f32 {x} vs {precision} {y}"
        );
    }
    let first = b[0]["loss"].as_f64().unwrap();
    let last = b[b.len() - 1]["loss"].as_f64().unwrap();
    assert!(last < first, "{precision} trains: {first} -> {last}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(half_run.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["train"]["precision"], precision);
    let scale = state(&half_run).get("loss_scale").cloned();
    if precision == "f16" {
        assert_eq!(
            scale,
            Some(serde_json::json!({"scale": 65536.0, "good_steps": 6}))
        );
    } else {
        assert_eq!(scale, None);
    }
    assert!(state(&f32_run).get("loss_scale").is_none());
}

/// The checkpoint state (`state.json`) that `latest` names.
fn state(run: &std::path::Path) -> serde_json::Value {
    let dir = run.join("checkpoints").join(latest(run));
    serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).unwrap()).unwrap()
}

#[test]
fn half_precision_on_flex_tracks_f32() {
    check_precision_tracks_f32("flex", "bf16");
    check_precision_tracks_f32("flex", "f16");
}

/// f16 on wgpu (f16 arithmetic in software Vulkan here, the CubeCL kernels in f16); and f16
/// gradients that overflow (a loss scale of 1e30) skip the update and halve the scale instead
/// of stopping the run.
#[cfg(feature = "wgpu")]
#[test]
fn f16_on_wgpu_tracks_f32_and_survives_overflow() {
    check_precision_tracks_f32("wgpu", "f16");

    let tmp = tempfile::tempdir().unwrap();
    let over = tmp.path().join("over");
    let mut args = with(
        tiny_args(&over, &tmp.path().join("cache"), &corpus(tmp.path())),
        "--steps",
        "2",
    );
    args = with(args, "--device", "wgpu");
    args = with(args, "--precision", "f16");
    let out = relation_ok(&fault(&args, "loss-scale=1e30"), &[]);
    assert!(
        out.contains("f16 gradients overflowed: update skipped, loss scale"),
        "{out}"
    );
    assert_eq!(state(&over)["loss_scale"]["scale"].as_f64(), Some(2.5e29));
    assert_eq!(
        state(&over)["skipped_steps"],
        0,
        "an overflow is not a divergence"
    );
    assert!(rows(&over)[0]["loss"].as_f64().unwrap().is_finite());
}
