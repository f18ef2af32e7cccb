//! [`DecodeOps`] under autodiff: a decoding step is not differentiated (generation runs outside
//! any graph), so it runs the inner backend's kernel on the tensors' primitives.

use burn::backend::autodiff::{Autodiff, checkpoint::strategy::CheckpointStrategy};
use burn::backend::tensor::FloatTensor;

use super::{DecodeOps, DecodeParams};

impl<B: DecodeOps, C: CheckpointStrategy> DecodeOps for Autodiff<B, C> {
    fn flash_relation_decode(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        params: DecodeParams,
    ) -> FloatTensor<Self> {
        let [p1, p2, info, lambda] = [p1, p2, info, lambda].map(|x| x.into_primitive());
        FloatTensor::<Self>::new(B::flash_relation_decode(p1, p2, info, lambda, params))
    }
}
