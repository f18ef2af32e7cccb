//! Linear Relation's fused kernels (Flex and `Device::wgpu`) against the `relation-core` token loop on
//! Flex: outputs, final state and every gradient; state carry; prefill then decode.

use burn::tensor::{DType, Device, Tensor, TensorData};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{DEFAULT_TAU, LinearRelationOutput, naive_recurrent_linear_relation};
use relation_kernels::{
    LinearInputs, Strategy, debug, fused_recurrent_linear_relation, linear_relation_step,
};

use crate::common::{assert_path, to_flex};

/// Inputs in f32 on Flex, rounded through `dtype`: `[p1, p2, info, log_alpha]`, the initial
/// state, and the loss weights of `y` and of the final state.
pub(crate) struct Case {
    inputs: [TensorData; 4],
    state: Option<TensorData>,
    w_y: TensorData,
    w_state: TensorData,
}

pub(crate) fn case(
    dims: [usize; 4],
    seed: u64,
    gate: (f64, f64),
    with_state: bool,
    dtype: DType,
) -> Case {
    let flex = Device::flex();
    let [b, _, h, d] = dims;
    let round = |x: Tensor<4>| x.cast(dtype).cast(DType::F32).into_data();
    let (low, high) = gate; // log gates uniform in [low, high]
    let gates = uniform(dims, seed + 3, (high - low) / 2.0, &flex, DType::F32) + (high + low) / 2.0;
    Case {
        inputs: [
            round(uniform(dims, seed, 1.0, &flex, DType::F32)),
            round(uniform(dims, seed + 1, 1.0, &flex, DType::F32)),
            round(uniform(dims, seed + 2, 1.0, &flex, DType::F32)),
            round(gates),
        ],
        state: with_state.then(|| round(uniform([b, h, d, d], seed + 4, 0.5, &flex, DType::F32))),
        w_y: round(uniform(dims, seed + 5, 1.0, &flex, DType::F32)),
        w_state: round(uniform([b, h, d, d], seed + 6, 1.0, &flex, DType::F32)),
    }
}

pub(crate) struct On {
    pub(crate) inputs: Vec<Tensor<4>>,
    pub(crate) state: Option<Tensor<4>>,
}

impl On {
    /// The entry points' inputs: clones of `inputs` (`[p1, p2, info, log_alpha]`) and of `state`.
    pub(crate) fn linear_inputs(&self) -> LinearInputs {
        let [p1, p2, info, log_alpha] = [0, 1, 2, 3].map(|i| self.inputs[i].clone());
        LinearInputs {
            p1,
            p2,
            info,
            log_alpha,
            initial_state: self.state.clone(),
            segments: None,
        }
    }
}

impl Case {
    pub(crate) fn on(&self, device: &Device, dtype: DType, grad: bool) -> On {
        let t = |d: &TensorData| {
            let x = Tensor::<4>::from_data(d.clone(), (device, dtype));
            if grad { x.require_grad() } else { x }
        };
        On {
            inputs: self.inputs.iter().map(t).collect(),
            state: self.state.as_ref().map(t),
        }
    }

    pub(crate) fn loss(
        &self,
        out: &LinearRelationOutput,
        device: &Device,
        dtype: DType,
    ) -> Tensor<1> {
        let w_y = Tensor::<4>::from_data(self.w_y.clone(), (device, dtype));
        let w_state = Tensor::<4>::from_data(self.w_state.clone(), (device, dtype));
        (out.y.clone() * w_y).sum() + (out.state.clone() * w_state).sum()
    }
}

fn run(x: &On, strategy: Strategy) -> LinearRelationOutput {
    fused_recurrent_linear_relation(x.linear_inputs(), DEFAULT_TAU, strategy).unwrap()
}

pub(crate) fn reference(x: &On) -> LinearRelationOutput {
    let [p1, p2, info, gates] = [0, 1, 2, 3].map(|i| x.inputs[i].clone());
    naive_recurrent_linear_relation(p1, p2, info, gates, DEFAULT_TAU, x.state.clone()).unwrap()
}

fn check_case(
    device: &Device,
    dims: [usize; 4],
    dtype: DType,
    seed: u64,
    gate: (f64, f64),
    with_state: bool,
) {
    let case = LinearCase {
        dims,
        dtype,
        seed,
        gate,
        with_state,
        grads: true,
    };
    check_against_reference(device, "recurrent", &case, run);
}

/// One Linear Relation test case: the inputs' shape, dtype and seed, the range of the log
/// gates, whether an initial state is given, and whether gradients are checked too.
pub(crate) struct LinearCase {
    pub dims: [usize; 4],
    pub dtype: DType,
    pub seed: u64,
    pub gate: (f64, f64),
    pub with_state: bool,
    pub grads: bool,
}

/// A fused Linear Relation path (`run`, called with `Strategy::Fused`; `label` names it in the
/// messages) against the token loop on Flex: `Y` and the final state, then (with `grads`) the
/// gradients of `p1`, `p2`, `Ĩ`, the log gates and the initial state. Shared by the recurrent
/// and the chunked tests.
pub(crate) fn check_against_reference(
    device: &Device,
    label: &str,
    k: &LinearCase,
    run: impl Fn(&On, Strategy) -> LinearRelationOutput,
) {
    debug::poison_outputs(true);
    let flex = Device::flex();
    let (dims, dtype) = (k.dims, k.dtype);
    let what = format!(
        "{label} {dims:?} {dtype:?} gates {:?} state {}",
        k.gate, k.with_state
    );
    let c = case(dims, k.seed, k.gate, k.with_state, dtype);
    let (fwd_tol, grad_tol) = (
        tolerance(dtype, Check::Forward),
        tolerance(dtype, Check::Gradient),
    );

    let fused = assert_path(&what, "fused", || {
        run(&c.on(device, dtype, false), Strategy::Fused)
    });
    let expected = reference(&c.on(&flex, DType::F32, false));
    assert_close(
        &format!("Y {what}"),
        &to_flex(fused.y),
        &expected.y,
        fwd_tol,
    );
    assert_close(
        &format!("state {what}"),
        &to_flex(fused.state),
        &expected.state,
        fwd_tol,
    );
    if !k.grads {
        return;
    }

    let ad = device.clone().autodiff();
    let x = c.on(&ad, dtype, true);
    // The fused forward registers the fused backward: one choice decides both.
    let out = assert_path(&what, "fused", || run(&x, Strategy::Fused));
    let grads = c.loss(&out, &ad, dtype).backward();
    let flex_ad = flex.clone().autodiff();
    let r = c.on(&flex_ad, DType::F32, true);
    let ref_grads = c.loss(&reference(&r), &flex_ad, DType::F32).backward();
    for (i, name) in ["dp1", "dp2", "dI", "dlog_alpha"].iter().enumerate() {
        let got = to_flex(x.inputs[i].grad(&grads).unwrap());
        assert_close(
            &format!("{name} {what}"),
            &got,
            &r.inputs[i].grad(&ref_grads).unwrap(),
            grad_tol,
        );
    }
    if let (Some(s), Some(rs)) = (&x.state, &r.state) {
        let got = to_flex(s.grad(&grads).unwrap());
        assert_close(
            &format!("dstate {what}"),
            &got,
            &rs.grad(&ref_grads).unwrap(),
            grad_tol,
        );
    }
}

device_tests! {
    fn linear_relation_f32_shapes(device) {
        check_case(&device, [1, 1, 2, 48], DType::F32, 1, (-1.0, 0.0), false);
        check_case(&device, [2, 63, 2, 60], DType::F32, 2, (-1.0, 0.0), true);
        check_case(&device, [1, 64, 4, 64], DType::F32, 3, (-2.0, 0.0), true);
        check_case(&device, [2, 65, 1, 80], DType::F32, 4, (-1.0, 0.0), false);
    }
}

device_tests! {
    fn linear_relation_f32_long_sequence(device) {
        check_case(&device, [1, 1000, 2, 64], DType::F32, 5, (-0.5, 0.0), true);
    }
}

device_tests! {
    fn linear_relation_gate_extremes(device) {
        // Strong decay (log gates near -20) and no decay at all stay finite and exact.
        check_case(&device, [1, 70, 2, 48], DType::F32, 6, (-20.5, -19.5), true);
        check_case(&device, [1, 70, 2, 48], DType::F32, 7, (0.0, 0.0), true);
    }
}

device_tests! {
    fn linear_relation_f16(device) {
        assert!(
            device.supports_dtype(DType::F16),
            "this device has no f16 support"
        );
        check_case(&device, [1, 63, 2, 64], DType::F16, 8, (-1.0, 0.0), true);
        check_case(&device, [2, 65, 1, 48], DType::F16, 9, (-1.0, 0.0), false);
    }
}

bf16_device_tests! {
    fn linear_relation_bf16(device) {
        check_case(&device, [1, 63, 2, 64], DType::BF16, 10, (-1.0, 0.0), true);
        check_case(&device, [2, 65, 1, 48], DType::BF16, 11, (-1.0, 0.0), false);
    }
}

device_tests! {
    fn linear_relation_state_carry_and_decoding(device) {
        debug::poison_outputs(true);
        let tol = tolerance(DType::F32, Check::Forward);
        let (seq, split) = (90, 37);
        let c = case([1, seq, 2, 60], 10, (-1.0, 0.0), true, DType::F32);
        let x = c.on(&device, DType::F32, false);
        let whole = run(&x, Strategy::Fused);
        let part = |from: usize, len: usize| -> [Tensor<4>; 4] {
            [0, 1, 2, 3].map(|i| x.inputs[i].clone().narrow(1, from, len))
        };

        // x1 then x2 from the carried state == x1 ++ x2.
        let [p1, p2, info, log_alpha] = part(0, split);
        let first = fused_recurrent_linear_relation(
            LinearInputs {
                p1,
                p2,
                info,
                log_alpha,
                initial_state: x.state.clone(),
                segments: None,
            },
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .unwrap();
        let [p1, p2, info, gates] = part(split, seq - split);
        let second = fused_recurrent_linear_relation(
            LinearInputs::new(p1, p2, info, gates).with_state(first.state.clone()),
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .unwrap();
        assert_close(
            "carry: Y",
            &Tensor::cat(vec![first.y.clone(), second.y], 1),
            &whole.y,
            tol,
        );
        assert_close("carry: state", &second.state, &whole.state, tol);

        // Prefill x1, then decode token by token with the step kernel == one full pass.
        let mut state = first.state;
        let mut ys = vec![first.y];
        for t in split..seq {
            let [p1, p2, info, gates] = part(t, 1);
            let inputs = LinearInputs::new(p1, p2, info, gates).with_state(state);
            let out = linear_relation_step(inputs, DEFAULT_TAU, Strategy::Fused).unwrap();
            ys.push(out.y);
            state = out.state;
        }
        assert_close("decode: Y", &Tensor::cat(ys, 1), &whole.y, tol);
        assert_close("decode: state", &state, &whole.state, tol);
    }
}

#[test]
fn linear_relation_auto_on_flex_runs_the_kernel() {
    let flex = Device::flex();
    let c = case([1, 20, 2, 48], 11, (-1.0, 0.0), true, DType::F32);
    let x = c.on(&flex, DType::F32, false);
    let auto = assert_path("Auto on Flex", "fused", || run(&x, Strategy::Auto));
    let expected = reference(&x);
    let tol = tolerance(DType::F32, Check::Forward);
    assert_close("flex Y", &auto.y, &expected.y, tol);
    assert_close("flex state", &auto.state, &expected.state, tol);
}

/// One decoding step (`T = 1`, nothing to differentiate: the one-launch kernel) against the
/// token loop reference, from the same rounded inputs: awkward head dimensions, several
/// sequences, strong and weak gates, outputs poisoned.
fn check_one_step(device: &Device, dtype: DType) {
    debug::poison_outputs(true);
    let flex = Device::flex();
    for (dims, seed, gate) in [
        ([3, 1, 2, 48], 21, (-1.0, 0.0)),
        ([1, 1, 4, 60], 22, (-6.0, -2.0)),
        ([2, 1, 1, 80], 23, (-0.1, 0.0)),
        ([1, 1, 8, 32], 24, (-1.0, 0.0)),
    ] {
        let c = case(dims, seed, gate, true, dtype);
        let x = c.on(device, dtype, false);
        let what = format!("{device:?} {dims:?} {dtype:?} one step");
        let step = assert_path(&what, "fused", || {
            let [p1, p2, info, gates] = [0, 1, 2, 3].map(|i| x.inputs[i].clone());
            let inputs =
                LinearInputs::new(p1, p2, info, gates).with_state(x.state.clone().unwrap());
            linear_relation_step(inputs, DEFAULT_TAU, Strategy::Fused).unwrap()
        });
        let r = c.on(&flex, DType::F32, false);
        let [p1, p2, info, gates] = [0, 1, 2, 3].map(|i| r.inputs[i].clone());
        let want =
            naive_recurrent_linear_relation(p1, p2, info, gates, DEFAULT_TAU, r.state.clone())
                .unwrap();
        let tol = tolerance(dtype, Check::Forward);
        assert_close(&format!("{what}: Y"), &to_flex(step.y), &want.y, tol);
        assert_close(
            &format!("{what}: state"),
            &to_flex(step.state),
            &want.state,
            tol,
        );
    }
}

device_tests! {
    fn linear_relation_one_step_matches_the_reference_f32(device) {
        check_one_step(&device, DType::F32);
    }
}

device_tests! {
    fn linear_relation_one_step_matches_the_reference_f16(device) {
        assert!(device.supports_dtype(DType::F16), "this device has no f16 support");
        check_one_step(&device, DType::F16);
    }
}

bf16_device_tests! {
    fn linear_relation_one_step_matches_the_reference_bf16(device) {
        check_one_step(&device, DType::BF16);
    }
}

/// A step whose inputs need gradients takes the differentiable fused path: the gradients exist
/// and equal those of the reference.
#[test]
fn a_step_that_needs_gradients_is_differentiated() {
    let device = Device::flex().autodiff();
    let c = case([1, 1, 2, 48], 30, (-1.0, 0.0), true, DType::F32);
    let x = c.on(&device, DType::F32, true);
    let [p1, p2, info, gates] = [0, 1, 2, 3].map(|i| x.inputs[i].clone());
    let inputs = LinearInputs::new(p1, p2, info, gates).with_state(x.state.clone().unwrap());
    let out = linear_relation_step(inputs, DEFAULT_TAU, Strategy::Fused).unwrap();
    let grads = c.loss(&out, &device, DType::F32).backward();
    let r = c.on(&device, DType::F32, true);
    let [p1, p2, info, gates] = [0, 1, 2, 3].map(|i| r.inputs[i].clone());
    let want =
        naive_recurrent_linear_relation(p1, p2, info, gates, DEFAULT_TAU, r.state.clone()).unwrap();
    let want_grads = c.loss(&want, &device, DType::F32).backward();
    let tol = tolerance(DType::F32, Check::Gradient);
    for i in 0..4 {
        let got = x.inputs[i].grad(&grads).expect("a gradient");
        let expected = r.inputs[i].grad(&want_grads).expect("a gradient");
        assert_close(&format!("input {i} gradient"), &got, &expected, tol);
    }
}
