//! FlashRelation under autodiff: the forward saves only `O(T D)` state (`Ī` and three f32
//! statistics per row) and the backward kernels recompute `U`, `E`, `pi` tile by tile.

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
use crate::ops::{FlashArgs, FlashForward, FlashGrads, FlashParams, FlashSaved};

/// The fused backward: [`RelationOps::flash_relation_bwd`] from the saved `(Ī, stats)`.
#[derive(Debug)]
struct FlashRelationBackward;

/// What the forward leaves for the backward: the four input nodes (checkpointed), `Ī`, the
/// per-row statistics and the call's parameters.
type Saved<B> = ([NodeId; 4], FloatTensor<B>, FloatTensor<B>, FlashParams);

impl<B: RelationOps> Backward<B, 4> for FlashRelationBackward {
    type State = Saved<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 4>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<B>(&ops.node);
        let (ids, ibar, stats, params) = ops.state;
        let [p1, p2, info, lambda] =
            ids.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let (dp1, dp2, dinfo, dlambda) =
            B::flash_relation_bwd(p1, p2, info, lambda, ibar, stats, dy, params);
        for (node, grad) in ops.parents.into_iter().zip([dp1, dp2, dinfo, dlambda]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// [`RelationOps::flash_relation`] for `Autodiff<B, C>`: tracked, it runs the forward that keeps
/// the statistics and registers the fused backward; untracked, the plain forward.
pub(crate) fn forward<B: RelationOps, C: CheckpointStrategy>(
    FlashArgs {
        p1,
        p2,
        info,
        lambda,
        params,
    }: FlashArgs<FloatTensor<Autodiff<B, C>>>,
) -> FloatTensor<Autodiff<B, C>> {
    let guards = [p1.node(), p2.node(), info.node(), lambda.node()];
    match FlashRelationBackward
        .prepare::<C>(guards)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [&p1, &p2, &info, &lambda].map(|x| prep.checkpoint(x));
            let (y, ibar, stats) = B::flash_relation_fwd(
                p1.into_primitive(),
                p2.into_primitive(),
                info.into_primitive(),
                lambda.into_primitive(),
                params.clone(),
            );
            prep.finish((ids, ibar, stats, params), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::flash_relation(
            p1.into_primitive(),
            p2.into_primitive(),
            info.into_primitive(),
            lambda.into_primitive(),
            params,
        )),
    }
}

/// [`RelationOps::flash_relation_fwd`] for `Autodiff<B, C>`: not differentiable on its own, the
/// outputs are constants of the graph.
pub(crate) fn forward_with_stats<B: RelationOps, C: CheckpointStrategy>(
    FlashArgs {
        p1,
        p2,
        info,
        lambda,
        params,
    }: FlashArgs<FloatTensor<Autodiff<B, C>>>,
) -> FlashForward<Autodiff<B, C>> {
    let [p1, p2, info, lambda] = [p1, p2, info, lambda].map(|x| x.into_primitive());
    let (y, ibar, stats) = B::flash_relation_fwd(p1, p2, info, lambda, params);
    (
        FloatTensor::<Autodiff<B, C>>::new(y),
        FloatTensor::<Autodiff<B, C>>::new(ibar),
        FloatTensor::<Autodiff<B, C>>::new(stats),
    )
}

/// [`RelationOps::flash_relation_bwd`] for `Autodiff<B, C>`: the inner backend's, untracked.
pub(crate) fn backward<B: RelationOps, C: CheckpointStrategy>(
    FlashArgs {
        p1,
        p2,
        info,
        lambda,
        params,
    }: FlashArgs<FloatTensor<Autodiff<B, C>>>,
    FlashSaved { ibar, stats, dy }: FlashSaved<FloatTensor<Autodiff<B, C>>>,
) -> FlashGrads<Autodiff<B, C>> {
    let [p1, p2, info, lambda, ibar, stats, dy] =
        [p1, p2, info, lambda, ibar, stats, dy].map(|x| x.into_primitive());
    let grads = B::flash_relation_bwd(p1, p2, info, lambda, ibar, stats, dy, params);
    let wrap = FloatTensor::<Autodiff<B, C>>::new;
    (wrap(grads.0), wrap(grads.1), wrap(grads.2), wrap(grads.3))
}
