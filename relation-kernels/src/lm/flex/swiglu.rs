//! The SwiGLU gate on Flex: one element-wise pass forward, one backward.

use std::mem::MaybeUninit;

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use crate::flex::{MulAdd, Uninit, Vectorized, sigmoid, silu, tensor, vectorized, with_f32};

use super::ELEMS_PER_TASK;

/// `SiLU(gate) ⊙ up` in `gate`'s dtype.
pub(crate) fn swiglu(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
    let shape = gate.layout().shape().clone();
    let dtype = gate.dtype();
    let mut y = Uninit::new(shape.num_elements());
    with_f32(&gate, |g| {
        with_f32(&up, |u| {
            assert_eq!(g.len(), u.len(), "SwiGLU gate and up of one shape");
            y.room()
                .par_chunks_mut(ELEMS_PER_TASK)
                .zip(g.par_chunks(ELEMS_PER_TASK))
                .zip(u.par_chunks(ELEMS_PER_TASK))
                .for_each(|((y, g), u)| vectorized(SwigluFwd { y, g, u }));
        })
    });
    // SAFETY: the tasks cover `y` whole (`gate` is as long) and write every element.
    #[allow(unsafe_code)]
    let y = unsafe { y.assume_init() };
    tensor(y, shape, dtype)
}

/// `(d gate, d up)` of SwiGLU, in `gate`'s dtype.
pub(crate) fn swiglu_bwd(
    gate: FlexTensor,
    up: FlexTensor,
    dy: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    let shape = gate.layout().shape().clone();
    let dtype = gate.dtype();
    let len = shape.num_elements();
    let (mut dg, mut du) = (Uninit::new(len), Uninit::new(len));
    with_f32(&gate, |g| {
        with_f32(&up, |u| {
            with_f32(&dy, |dy| {
                assert_eq!(
                    (g.len(), u.len(), dy.len()),
                    (len, len, len),
                    "SwiGLU backward input shapes"
                );
                dg.room()
                    .par_chunks_mut(ELEMS_PER_TASK)
                    .zip(du.room().par_chunks_mut(ELEMS_PER_TASK))
                    .zip(g.par_chunks(ELEMS_PER_TASK))
                    .zip(
                        u.par_chunks(ELEMS_PER_TASK)
                            .zip(dy.par_chunks(ELEMS_PER_TASK)),
                    )
                    .for_each(|(((dg, du), g), (u, dy))| {
                        vectorized(SwigluBwd { dg, du, g, u, dy });
                    });
            })
        })
    });
    // SAFETY: the tasks cover `dg` and `du` whole (`gate` is as long) and write every element.
    #[allow(unsafe_code)]
    let (dg, du) = unsafe { (dg.assume_init(), du.assume_init()) };
    (tensor(dg, shape.clone(), dtype), tensor(du, shape, dtype))
}

/// `y = SiLU(g) u` over one chunk.
struct SwigluFwd<'a> {
    y: &'a mut [MaybeUninit<f32>],
    g: &'a [f32],
    u: &'a [f32],
}

impl Vectorized for SwigluFwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        for ((y, &g), &u) in self.y.iter_mut().zip(self.g).zip(self.u) {
            y.write(silu::<M>(g) * u);
        }
    }
}

/// `(d gate, d up)` of SwiGLU over one chunk.
struct SwigluBwd<'a> {
    dg: &'a mut [MaybeUninit<f32>],
    du: &'a mut [MaybeUninit<f32>],
    g: &'a [f32],
    u: &'a [f32],
    dy: &'a [f32],
}

impl Vectorized for SwigluBwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let Self { dg, du, g, u, dy } = self;
        for ((((dg, du), &g), &u), &dy) in dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u).zip(dy) {
            let s = sigmoid::<M>(g);
            du.write(dy * g * s);
            dg.write(dy * u * s * (1.0 + g * (1.0 - s)));
        }
    }
}
