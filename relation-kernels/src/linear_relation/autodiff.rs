//! Linear Relation under autodiff: the backward kernels recompute the state trajectory
//! (recurrent) or the chunk-start states (chunked), so only the inputs and the bundled output are
//! saved, `O(T D + D^2)` per head.

use burn::backend::{
    autodiff::{
        Autodiff, NodeId,
        checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
        grads::Gradients,
        ops::{Backward, Ops, OpsKind},
    },
    tensor::FloatTensor,
};

use crate::ops::RelationOps;
use crate::ops::{LinearArgs, LinearGrads, LinearParams};

/// The fused backward of the kernels `params.mode` names, over the call's layout.
#[derive(Debug)]
struct LinearRelationBackward(LinearParams);

impl<B: RelationOps> Backward<B, 5> for LinearRelationBackward {
    // The five input nodes (checkpointed) and the bundled output.
    type State = ([NodeId; 5], FloatTensor<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 5>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let d_out = grads.consume::<B>(&ops.node);
        let (ids, out) = ops.state;
        let [q, k, v, g, h0] =
            ids.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let (dq, dk, dv, dg, dh0) = B::linear_relation_bwd(q, k, v, g, h0, out, d_out, self.0);
        for (node, grad) in ops.parents.into_iter().zip([dq, dk, dv, dg, dh0]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// [`RelationOps::linear_relation`] for `Autodiff<B, C>`.
pub(crate) fn forward<B: RelationOps, C: CheckpointStrategy>(
    args: LinearArgs<FloatTensor<Autodiff<B, C>>>,
) -> FloatTensor<Autodiff<B, C>> {
    let LinearArgs {
        q,
        k,
        v,
        g,
        h0,
        params,
    } = args;
    let guards = [q.node(), k.node(), v.node(), g.node(), h0.node()];
    match LinearRelationBackward(params.clone())
        .prepare::<C>(guards)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [&q, &k, &v, &g, &h0].map(|x| prep.checkpoint(x));
            let [q, k, v, g, h0] = [q, k, v, g, h0].map(|x| x.into_primitive());
            let out = B::linear_relation(q, k, v, g, h0, params);
            prep.finish((ids, out.clone()), out)
        }
        OpsKind::UnTracked(prep) => {
            let [q, k, v, g, h0] = [q, k, v, g, h0].map(|x| x.into_primitive());
            prep.finish(B::linear_relation(q, k, v, g, h0, params))
        }
    }
}

/// [`RelationOps::linear_relation_bwd`] for `Autodiff<B, C>`: the inner backend's, untracked.
pub(crate) fn backward<B: RelationOps, C: CheckpointStrategy>(
    args: LinearArgs<FloatTensor<Autodiff<B, C>>>,
    out: FloatTensor<Autodiff<B, C>>,
    d_out: FloatTensor<Autodiff<B, C>>,
) -> LinearGrads<Autodiff<B, C>> {
    let LinearArgs {
        q,
        k,
        v,
        g,
        h0,
        params,
    } = args;
    let [q, k, v, g, h0, out, d_out] = [q, k, v, g, h0, out, d_out].map(|x| x.into_primitive());
    let grads = B::linear_relation_bwd(q, k, v, g, h0, out, d_out, params);
    let wrap = FloatTensor::<Autodiff<B, C>>::new;
    (
        wrap(grads.0),
        wrap(grads.1),
        wrap(grads.2),
        wrap(grads.3),
        wrap(grads.4),
    )
}
