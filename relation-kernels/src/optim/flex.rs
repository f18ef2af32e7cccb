//! The fused AdamW update on Flex: one pass over parameter, gradient and both moments.

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use rayon::prelude::*;

use crate::flex::{MulAdd, Vectorized, tensor, vectorized, with_f32};

/// Elements per parallel task (64 KiB of f32 per array).
const ELEMS_PER_TASK: usize = 16 * 1024;

/// One AdamW update, `(θ', m', v')`: [`relation_core::naive_adamw`]'s maths in its order of
/// f32 operations (no fused multiply-add), so the same bits as the reference and Burn's `AdamW`,
/// in one pass over the four arrays on the thread pool instead of the reference's fifteen
/// (each a full read and write of the parameter, on the calling thread).
///
/// `θ`, `m` and `v` are overwritten in place when each is an f32 tensor that owns its
/// contiguous buffer alone (an optimizer's parameter and state between steps); otherwise they
/// are copied first (and other dtypes converted to f32 and back).
///
/// # Shapes
/// - `param`, `grad`, `m`, `v` and the outputs: the same shape
pub(crate) fn adamw(
    param: FlexTensor,
    grad: FlexTensor,
    m: FlexTensor,
    v: FlexTensor,
    step: relation_core::AdamWStep,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    let dtype = param.dtype();
    let shape = param.layout().shape().clone();
    let k = AdamWScalars::new(&step);
    let [mut p, mut m, mut v] = [param, m, v].map(writable_f32);
    with_f32(&grad, |g| {
        let (p, m, v) = (
            p.storage_mut::<f32>(),
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
        );
        assert!(
            [p.len(), m.len(), v.len()] == [g.len(); 3],
            "AdamW: param, moments and gradient of one shape"
        );
        p.par_chunks_mut(ELEMS_PER_TASK)
            .zip(m.par_chunks_mut(ELEMS_PER_TASK))
            .zip(v.par_chunks_mut(ELEMS_PER_TASK))
            .zip(g.par_chunks(ELEMS_PER_TASK))
            .for_each(|(((p, m), v), g)| vectorized(AdamWChunk { p, m, v, g, k }));
    });
    let back = |x: FlexTensor| {
        if dtype == DType::F32 {
            x
        } else {
            tensor(x.storage::<f32>().to_vec(), shape.clone(), dtype)
        }
    };
    (back(p), back(m), back(v))
}

/// `x` as a contiguous f32 tensor whose storage is exactly its elements: itself when it already
/// is one (written in place if it owns the buffer alone, copied on write otherwise), a converted
/// copy when not.
fn writable_f32(x: FlexTensor) -> FlexTensor {
    let whole = x.dtype() == DType::F32
        && x.as_slice::<f32>()
            .is_some_and(|s| s.len() == x.storage::<f32>().len());
    if whole {
        x
    } else {
        let shape = x.layout().shape().clone();
        tensor(crate::flex::f32_data(&x).into_owned(), shape, DType::F32)
    }
}

/// The f32 scalars of an AdamW update, rounded as the reference rounds them.
#[derive(Clone, Copy)]
struct AdamWScalars {
    b1: f32,
    /// `1 - β1`.
    c1: f32,
    b2: f32,
    /// `1 - β2`.
    c2: f32,
    /// `1 - β1^t`, `1 - β2^t`.
    bias1: f32,
    bias2: f32,
    eps: f32,
    /// `1 - η λ` (1 without decay: `θ · 1 = θ` exactly, as the reference's skipped product).
    keep: f32,
    lr: f32,
}

impl AdamWScalars {
    fn new(s: &relation_core::AdamWStep) -> Self {
        let t = s.time as i32;
        let decay = s.lr * f64::from(s.weight_decay);
        Self {
            b1: s.beta1,
            c1: 1.0 - s.beta1,
            b2: s.beta2,
            c2: 1.0 - s.beta2,
            bias1: 1.0 - s.beta1.powi(t),
            bias2: 1.0 - s.beta2.powi(t),
            eps: s.epsilon,
            keep: if decay == 0.0 {
                1.0
            } else {
                (1.0 - decay) as f32
            },
            lr: s.lr as f32,
        }
    }
}

/// One chunk of [`adamw`].
struct AdamWChunk<'a> {
    p: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    g: &'a [f32],
    k: AdamWScalars,
}

impl Vectorized for AdamWChunk<'_> {
    type Output = ();

    /// Plain products and sums, never `M::mul_add`: one rounding each, as the reference.
    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let k = self.k;
        for (((p, m), v), &g) in self.p.iter_mut().zip(self.m).zip(self.v).zip(self.g) {
            let m1 = *m * k.b1 + g * k.c1;
            let v1 = *v * k.b2 + (g * g) * k.c2;
            let delta = (m1 / k.bias1) / ((v1 / k.bias2).sqrt() + k.eps);
            *p = *p * k.keep - delta * k.lr;
            *m = m1;
            *v = v1;
        }
    }
}
