//! The Self relation under autodiff: `S = sigmoid(scale p1·p2)` with its closed-form backward.

use burn::backend::{
    TensorMetadata,
    autodiff::{
        Autodiff, NodeId,
        checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
        grads::Gradients,
        ops::{Backward, Ops, OpsKind},
    },
    tensor::FloatTensor,
};
use burn::tensor::Shape;

use crate::ops::RelationOps;

/// `S = sigmoid(scale p1·p2)`: `dp1 = dS S (1 - S) scale p2`, `dp2 = dS S (1 - S) scale p1`.
#[derive(Debug)]
struct SelfRelationBackward;

impl<B: RelationOps> Backward<B, 2> for SelfRelationBackward {
    // p1 and p2 (checkpointed), the output S, the scale.
    type State = (NodeId, NodeId, FloatTensor<B>, f32);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_p1, node_p2] = ops.parents;
        let grad = grads.consume::<B>(&ops.node); // [B, T, H]
        let (p1_id, p2_id, s, scale) = ops.state;
        let p1: FloatTensor<B> = checkpointer.retrieve_node_output(p1_id);
        let p2: FloatTensor<B> = checkpointer.retrieve_node_output(p2_id);

        let dims = s.shape();
        let one_minus_s = B::float_add_scalar(B::float_neg(s.clone()), 1.0f64.into());
        let du = B::float_mul(B::float_mul(grad, s), one_minus_s);
        let du = B::float_mul_scalar(du, (scale as f64).into());
        let du = B::float_reshape(du, Shape::new([dims[0], dims[1], dims[2], 1])); // [B, T, H, 1]
        if let Some(node) = node_p1 {
            grads.register::<B>(node.id, B::float_mul(du.clone(), p2));
        }
        if let Some(node) = node_p2 {
            grads.register::<B>(node.id, B::float_mul(du, p1));
        }
    }
}

/// [`RelationOps::self_relation`] for `Autodiff<B, C>`.
///
/// # Shapes
/// - `p1`, `p2`: `[B, T, H, D]`; output `[B, T, H]`
pub(crate) fn forward<B: RelationOps, C: CheckpointStrategy>(
    p1: FloatTensor<Autodiff<B, C>>,
    p2: FloatTensor<Autodiff<B, C>>,
    scale: f32,
) -> FloatTensor<Autodiff<B, C>> {
    let guards = [p1.node(), p2.node()];
    match SelfRelationBackward
        .prepare::<C>(guards)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let p1_id = prep.checkpoint(&p1);
            let p2_id = prep.checkpoint(&p2);
            let s = B::self_relation(p1.into_primitive(), p2.into_primitive(), scale);
            prep.finish((p1_id, p2_id, s.clone(), scale), s)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::self_relation(
            p1.into_primitive(),
            p2.into_primitive(),
            scale,
        )),
    }
}
