//! [`OptimOps`] under autodiff: an optimizer's update is not differentiated, so it runs the inner
//! backend's kernel on the tensors' primitives.

use burn::backend::autodiff::{Autodiff, checkpoint::strategy::CheckpointStrategy};
use burn::backend::tensor::FloatTensor;

use relation_core::AdamWStep;

use super::ops::OptimOps;

impl<B: OptimOps, C: CheckpointStrategy> OptimOps for Autodiff<B, C> {
    fn adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [param, grad, moment_1, moment_2] =
            [param, grad, moment_1, moment_2].map(|x| x.into_primitive());
        let (p, m, v) = B::adamw(param, grad, moment_1, moment_2, step);
        (
            FloatTensor::<Self>::new(p),
            FloatTensor::<Self>::new(m),
            FloatTensor::<Self>::new(v),
        )
    }
}
