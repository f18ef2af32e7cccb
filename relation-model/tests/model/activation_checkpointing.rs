//! Activation checkpointing (`RelationLm::checkpointed_step`): the same loss and the same
//! gradients for every parameter as the plain forward and backward, for every mixer that can
//! use it, packed or not, whatever the loss chunk; typed refusals otherwise.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, FloatDType, Tensor};
use relation_core::Segments;
use relation_core::testing::{Check, assert_close, tolerance};
use relation_kernels::Strategy;
use relation_model::{CheckpointedStep, ModelError, RelationLm};

use crate::{model, tiny, tokens};

/// The plain step: mean token NLL and `GradientsParams` of `mean · factor`.
fn plain(
    m: &RelationLm,
    x: Tensor<2, burn::tensor::Int>,
    y: Tensor<2, burn::tensor::Int>,
    segments: Option<&Segments>,
    factor: f64,
) -> (f32, GradientsParams) {
    let logits = match segments {
        None => m.forward(x).unwrap(),
        Some(s) => m.forward_packed(x, s).unwrap(),
    };
    let [b, t, v] = logits.dims();
    let nll = relation_kernels::cross_entropy(
        logits.reshape([b * t, v]),
        y.reshape([b * t]),
        Strategy::Auto,
    )
    .unwrap();
    let loss = nll.mean();
    let value = loss.clone().into_scalar::<f32>();
    (
        value,
        GradientsParams::from_grads(loss.mul_scalar(factor).backward(), m),
    )
}

/// Compares every parameter's gradient: bit for bit where `exact`, else within the f32
/// gradient tolerance; counts the parameters seen.
struct Compare<'a> {
    want: &'a GradientsParams,
    got: &'a GradientsParams,
    what: &'a str,
    exact: bool,
    checked: usize,
}

impl ModuleVisitor for Compare<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let want = self.want.get::<D>(param.id);
        let got = self.got.get::<D>(param.id);
        match (want, got) {
            (None, None) => {}
            (Some(want), Some(got)) => {
                self.checked += 1;
                let what = format!("{} parameter {} {:?}", self.what, param.id, want.dims());
                if self.exact {
                    assert_eq!(got.to_data(), want.to_data(), "{what}");
                } else {
                    assert_close(&what, &got, &want, tolerance(want.dtype(), Check::Gradient));
                }
            }
            (want, _) => panic!(
                "{}: parameter {} has a gradient in {} only",
                self.what,
                param.id,
                if want.is_some() {
                    "the plain step"
                } else {
                    "the checkpointed step"
                }
            ),
        }
    }
}

fn check(pattern: &str, segments: Option<&[usize]>, loss_chunk: usize, exact: bool) {
    let device = Device::flex().autodiff();
    let config = tiny(pattern, pattern.len());
    let m = model(&config, &device);
    let (shape, segments) = match segments {
        Some(lengths) => {
            let s = Segments::from_lengths(lengths).unwrap();
            ([1, s.total()], Some(s))
        }
        None => ([2, 24], None),
    };
    let x = tokens(shape[0], shape[1], config.vocab_size, 11, &device);
    let y = tokens(shape[0], shape[1], config.vocab_size, 12, &device);
    let what = format!("{pattern} {segments:?} chunk {loss_chunk}");
    let factor = 0.25;
    let (want_loss, want) = plain(&m, x.clone(), y.clone(), segments.as_ref(), factor);
    let (loss, got) = m
        .checkpointed_step(
            x,
            y,
            CheckpointedStep {
                segments: segments.as_ref(),
                loss_factor: factor,
                loss_chunk,
                ..CheckpointedStep::default()
            },
        )
        .unwrap();
    let loss = loss.into_scalar::<f32>();
    assert!(
        (loss - want_loss).abs() <= 1e-6 * want_loss.abs(),
        "{what}: loss {loss} vs {want_loss}"
    );
    let mut compare = Compare {
        want: &want,
        got: &got,
        what: &what,
        exact,
        checked: 0,
    };
    m.visit(&mut compare);
    assert_eq!(
        compare.checked,
        m.num_params_tensors(),
        "{what}: every parameter has a gradient in both"
    );
}

trait ParamTensors {
    fn num_params_tensors(&self) -> usize;
}

impl ParamTensors for RelationLm {
    fn num_params_tensors(&self) -> usize {
        struct Count(usize);
        impl ModuleVisitor for Count {
            fn visit_float<const D: usize>(&mut self, _: &Param<Tensor<D>>) {
                self.0 += 1;
            }
        }
        let mut count = Count(0);
        self.visit(&mut count);
        count.0
    }
}

#[test]
fn checkpointed_step_equals_the_plain_step() {
    // One chunk of the loss: the Relation patterns' gradients are the plain step's bit for
    // bit; with attention, retention or KDA layers the tied embedding's shares add up in
    // another order (within the f32 tolerance).
    for pattern in ["F", "L", "LLLF"] {
        check(pattern, None, 4096, true);
    }
    for pattern in ["A", "N", "K"] {
        check(pattern, None, 4096, false);
    }
    // Chunks of 7 tokens (the last one short): the head's weight gradient summed over chunks.
    check("LF", None, 7, false);
}

#[test]
fn checkpointed_step_on_packed_documents() {
    // Loss chunks of 5: the head's weight gradient is summed over chunks (f32 tolerance).
    for pattern in ["F", "L", "A", "LLLF"] {
        check(pattern, Some(&[1, 20, 3, 24]), 5, false);
    }
}

#[test]
fn checkpointed_step_in_half_precision_lands_on_the_f32_masters() {
    let device = Device::flex().autodiff();
    let config = tiny("LF", 2);
    let m = model(&config, &device);
    let x = tokens(2, 16, config.vocab_size, 13, &device);
    let y = tokens(2, 16, config.vocab_size, 14, &device);
    let (loss, grads) = m
        .checkpointed_step(
            x.clone(),
            y.clone(),
            CheckpointedStep {
                compute_dtype: Some(FloatDType::F16),
                loss_factor: 1024.0,
                ..CheckpointedStep::default()
            },
        )
        .unwrap();
    let (want_loss, want) = plain(&m, x, y, None, 1024.0);
    let loss = loss.into_scalar::<f32>();
    assert!(
        (loss - want_loss).abs() < 2e-2,
        "f16 loss {loss} vs f32 {want_loss}"
    );
    // Every master parameter has a gradient, in f32 (through the casts onto the masters).
    struct F32Grads<'a>(&'a GradientsParams, usize);
    impl ModuleVisitor for F32Grads<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let g = self
                .0
                .get::<D>(param.id)
                .expect("every parameter has a gradient");
            assert_eq!(
                g.dtype(),
                burn::tensor::DType::F32,
                "parameter {}",
                param.id
            );
            self.1 += 1;
        }
    }
    let mut f32_grads = F32Grads(&grads, 0);
    m.visit(&mut f32_grads);
    assert_eq!(f32_grads.1, m.num_params_tensors());
    // The embedding's (the tied head's and the input's shares) is close to the f32 step's.
    let e = m.embedding.weight.clone();
    let got = grads.get::<2>(e.id).expect("embedding gradient");
    let want = want.get::<2>(e.id).unwrap();
    assert_eq!(got.dtype(), want.dtype());
    let scale = want.clone().abs().max().into_scalar::<f32>();
    let err = (got - want).abs().max().into_scalar::<f32>();
    assert!(
        err <= 2e-2 * scale,
        "embedding gradient error {err} of {scale}"
    );
}

#[test]
fn checkpointed_step_refuses_what_it_cannot_do() {
    let device = Device::flex().autodiff();
    let config = tiny("LR", 2);
    let m = model(&config, &device);
    let x = tokens(1, 8, config.vocab_size, 15, &device);
    let err = m
        .checkpointed_step(x.clone(), x.clone(), CheckpointedStep::default())
        .unwrap_err();
    assert!(
        matches!(err, ModelError::CheckpointingRealFormer { layer: 1 }),
        "{err}"
    );

    let m = model(&tiny("L", 1), &device);
    let err = m
        .checkpointed_step(
            x.clone(),
            x.clone(),
            CheckpointedStep {
                loss_chunk: 0,
                ..CheckpointedStep::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Zero { name: "loss_chunk" }),
        "{err}"
    );

    let plain_device = Device::flex();
    let m = model(&tiny("L", 1), &plain_device);
    let x = tokens(1, 8, 97, 15, &plain_device);
    let err = m
        .checkpointed_step(x.clone(), x, CheckpointedStep::default())
        .unwrap_err();
    assert!(matches!(err, ModelError::NotAutodiff { .. }), "{err}");
    assert!(err.to_string().contains("autodiff"), "{err}");
}

#[test]
fn a_16k_token_row_trains_with_checkpointing() {
    // The long-context path in CI: one checkpointed step of a tiny Linear Relation model over
    // one row of 16,384 tokens (and 3 packed documents of it), every gradient finite.
    let device = Device::flex().autodiff();
    let config = tiny("LL", 2);
    let m = model(&config, &device);
    let t = 16_384;
    let x = tokens(1, t, config.vocab_size, 16, &device);
    let y = tokens(1, t, config.vocab_size, 17, &device);
    let segments = Segments::from_lengths(&[10_000, 6_000, 384]).unwrap();
    for segments in [None, Some(&segments)] {
        let (loss, grads) = m
            .checkpointed_step(
                x.clone(),
                y.clone(),
                CheckpointedStep {
                    segments,
                    ..CheckpointedStep::default()
                },
            )
            .unwrap();
        let loss = loss.into_scalar::<f32>();
        // Untrained: about ln(97) = 4.57 nats per token.
        assert!((3.5..6.0).contains(&loss), "loss {loss}");
        struct Finite<'a>(&'a GradientsParams, usize);
        impl ModuleVisitor for Finite<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let g = self
                    .0
                    .get::<D>(param.id)
                    .expect("every parameter has a gradient");
                let bad = g.clone().is_nan().any().into_scalar::<bool>()
                    || g.is_inf().any().into_scalar::<bool>();
                assert!(!bad, "parameter {} has a non-finite gradient", param.id);
                self.1 += 1;
            }
        }
        let mut finite = Finite(&grads, 0);
        m.visit(&mut finite);
        assert_eq!(finite.1, m.num_params_tensors());
    }
}
