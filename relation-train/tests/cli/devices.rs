//! Devices and data parallel: how the replicas' gradients are summed (Burn's collective where
//! there is one, the ordered sum elsewhere), and training on wgpu and across backends.

use crate::common::*;

/// Data parallel through Burn's collective: refused on Flex, which has none in Burn 0.22, with
/// the reason; and the collective's arrangement — each replica sums its own micro-batches,
/// then the replicas' sums are added — run with the host doing the all-reduce: bit for bit one
/// device with one micro-batch per replica (a single addition per element), and equal up to
/// the order of the sum with two each.
#[test]
fn data_parallel_collective_arrangement() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let short = |run: &std::path::Path, tokens: &str| {
        let args = with(tiny_args(run, &cache, &corpus), "--steps", "4");
        with(args, "--tokens-per-step", tokens)
    };

    let refused = tmp.path().join("refused");
    let args = with(short(&refused, "256"), "--devices", "flex,flex");
    let out = fails_with(
        &with(args, "--reduce", "collective"),
        &[],
        "--reduce collective",
    );
    assert!(
        out.contains("`flex` is a Flex device, and Burn 0.22 has no collective operations there"),
        "{out}"
    );

    // Asked for nothing (auto), the same devices take the ordered sum, and the trace says why.
    let auto = tmp.path().join("auto");
    let args = with(short(&auto, "256"), "--devices", "flex,flex");
    let out = relation(&args, &[("RUST_LOG", "relation_train=info")]);
    let out = text(&out);
    assert!(
        out.contains("no Burn collective over these devices")
            && out.contains("has no collective operations there"),
        "{out}"
    );

    for (tokens, bitwise) in [("256", true), ("512", false)] {
        let one = tmp.path().join(format!("one-{tokens}"));
        ok(&short(&one, tokens));
        let two = tmp.path().join(format!("two-{tokens}"));
        let args = fault(&short(&two, tokens), "host-all-reduce");
        let out = relation(&with(args, "--devices", "flex,flex"), &[]);
        let out = text(&out);
        assert!(out.contains("replica sums added by the host"), "{out}");
        for (a, b) in rows(&one).iter().zip(&rows(&two)) {
            for key in ["loss", "grad_norm"] {
                let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
                if bitwise {
                    assert_eq!(x, y, "{key} at step {} ({tokens} tokens)", a["step"]);
                } else {
                    assert!(
                        (x - y).abs() <= COLLECTIVE_REL_TOL * x.abs(),
                        "{key} at step {}: one device {x} vs replica sums {y}",
                        a["step"]
                    );
                }
            }
        }
    }
}

/// How far the collective's order of summation (each replica's micro-batches, then the
/// replicas) may move the tiny run's loss and gradient norm from one device's (micro-batches
/// in order) over 4 steps of 4 micro-batches: f32 rounding of the reordered sums, carried
/// through AdamW's updates. Measured: at most 6.6e-8 (about one f32 rounding) over these 4
/// steps, 3e-7 over 12; the bound leaves room for other CPUs' rounding of the same sums.
const COLLECTIVE_REL_TOL: f64 = 1e-6;

/// The same command on wgpu: the fused CubeCL kernels train the model (software Vulkan here);
/// and data parallel across two backends (flex holds the optimizer, wgpu computes every other
/// micro-batch on a forked copy) matches flex alone up to float rounding — through the ordered
/// sum, as Burn's collective spans one backend (and wgpu has none), which `--reduce
/// collective` says.
#[cfg(feature = "wgpu")]
#[test]
fn trains_on_wgpu_and_across_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = corpus(tmp.path());
    let short = |run: &std::path::Path| with(tiny_args(run, &cache, &corpus), "--steps", "2");

    let gpu = tmp.path().join("gpu");
    let out = ok(&with(short(&gpu), "--device", "wgpu"));
    assert!(out.contains("device wgpu"), "{out}");
    assert!(out.contains("finished at step 2/2"), "{out}");
    assert!(
        rows(&gpu)
            .iter()
            .all(|r| r["loss"].as_f64().unwrap().is_finite())
    );

    let flex = tmp.path().join("flex");
    ok(&short(&flex));
    let both = tmp.path().join("both");
    let out = ok(&with(short(&both), "--devices", "flex,wgpu"));
    assert!(out.contains("device flex + wgpu"), "{out}");
    assert!(
        out.contains("gradients summed in micro-batch order on flex"),
        "{out}"
    );
    for (a, b) in rows(&flex).iter().zip(&rows(&both)) {
        for key in ["loss", "grad_norm"] {
            let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
            assert!(
                (x - y).abs() <= 1e-4 * x.abs(),
                "{key} at step {}: flex {x} vs flex+wgpu {y}",
                a["step"]
            );
        }
    }
    let refused = tmp.path().join("refused");
    let args = with(short(&refused), "--devices", "flex,wgpu");
    let out = fails_with(
        &with(args, "--reduce", "collective"),
        &[],
        "--reduce collective",
    );
    assert!(out.contains("different backends"), "{out}");
    let args = with(short(&refused), "--devices", "wgpu,wgpu");
    let out = fails_with(
        &with(args, "--reduce", "collective"),
        &[],
        "--reduce collective",
    );
    assert!(out.contains("no transport between its devices"), "{out}");
}
