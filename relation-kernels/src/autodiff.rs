//! Backward passes of the fused operations, for `Autodiff<B, C>` over any backend that
//! implements [`RelationOps`].

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

use crate::RelationOps;

/// Backward of Linear Relation: the backward kernels recompute the state trajectory (recurrent)
/// or the chunk-start states (chunked), so only the inputs and the bundled output are saved,
/// `O(T D + D^2)` per head. `Some(chunk_size)` selects the chunked backward kernels.
#[derive(Debug)]
struct LinearRelationBackward(Option<usize>);

impl<B: RelationOps> Backward<B, 5> for LinearRelationBackward {
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
        let (dq, dk, dv, dg, dh0) = match self.0 {
            None => B::linear_relation_bwd(q, k, v, g, h0, out, d_out),
            Some(chunk) => B::chunk_linear_relation_bwd(q, k, v, g, h0, out, d_out, chunk),
        };
        for (node, grad) in ops.parents.into_iter().zip([dq, dk, dv, dg, dh0]) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: RelationOps, C: CheckpointStrategy> RelationOps for Autodiff<B, C> {
    fn self_relation(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
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

    fn flash_relation(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> FloatTensor<Self> {
        /// Fused backward: saves only `O(T D)` state (`Ī` and three f32 statistics per row)
        /// and recomputes `U`, `E`, `pi` tile by tile.
        #[derive(Debug)]
        struct FlashRelationBackward;

        impl<B: RelationOps> Backward<B, 4> for FlashRelationBackward {
            // p1, p2, info, lambda (checkpointed), Ī, stats, scale, 1 / tau.
            type State = (
                NodeId,
                NodeId,
                NodeId,
                NodeId,
                FloatTensor<B>,
                FloatTensor<B>,
                f32,
                f32,
            );

            fn backward(
                self,
                ops: Ops<Self::State, 4>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_p1, node_p2, node_info, node_lambda] = ops.parents;
                let dy = grads.consume::<B>(&ops.node);
                let (p1_id, p2_id, info_id, lambda_id, ibar, stats, scale, inv_tau) = ops.state;
                let p1: FloatTensor<B> = checkpointer.retrieve_node_output(p1_id);
                let p2: FloatTensor<B> = checkpointer.retrieve_node_output(p2_id);
                let info: FloatTensor<B> = checkpointer.retrieve_node_output(info_id);
                let lambda: FloatTensor<B> = checkpointer.retrieve_node_output(lambda_id);
                let (dp1, dp2, dinfo, dlambda) =
                    B::flash_relation_bwd(p1, p2, info, lambda, ibar, stats, dy, scale, inv_tau);
                for (node, grad) in [
                    (node_p1, dp1),
                    (node_p2, dp2),
                    (node_info, dinfo),
                    (node_lambda, dlambda),
                ] {
                    if let Some(node) = node {
                        grads.register::<B>(node.id, grad);
                    }
                }
            }
        }

        let guards = [p1.node(), p2.node(), info.node(), lambda.node()];
        match FlashRelationBackward
            .prepare::<C>(guards)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let ids = (
                    prep.checkpoint(&p1),
                    prep.checkpoint(&p2),
                    prep.checkpoint(&info),
                    prep.checkpoint(&lambda),
                );
                let (y, ibar, stats) = B::flash_relation_fwd(
                    p1.into_primitive(),
                    p2.into_primitive(),
                    info.into_primitive(),
                    lambda.into_primitive(),
                    scale,
                    inv_tau,
                );
                prep.finish((ids.0, ids.1, ids.2, ids.3, ibar, stats, scale, inv_tau), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::flash_relation(
                p1.into_primitive(),
                p2.into_primitive(),
                info.into_primitive(),
                lambda.into_primitive(),
                scale,
                inv_tau,
            )),
        }
    }

    fn flash_relation_fwd(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Not differentiable on its own: the outputs are constants of the graph.
        let (y, ibar, stats) = B::flash_relation_fwd(
            p1.into_primitive(),
            p2.into_primitive(),
            info.into_primitive(),
            lambda.into_primitive(),
            scale,
            inv_tau,
        );
        (
            FloatTensor::<Self>::new(y),
            FloatTensor::<Self>::new(ibar),
            FloatTensor::<Self>::new(stats),
        )
    }

    fn flash_relation_bwd(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        ibar: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (a, b, c, d) = B::flash_relation_bwd(
            p1.into_primitive(),
            p2.into_primitive(),
            info.into_primitive(),
            lambda.into_primitive(),
            ibar.into_primitive(),
            stats.into_primitive(),
            dy.into_primitive(),
            scale,
            inv_tau,
        );
        (
            FloatTensor::<Self>::new(a),
            FloatTensor::<Self>::new(b),
            FloatTensor::<Self>::new(c),
            FloatTensor::<Self>::new(d),
        )
    }

    fn linear_relation(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let guards = [q.node(), k.node(), v.node(), g.node(), h0.node()];
        match LinearRelationBackward(None)
            .prepare::<C>(guards)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let ids = [
                    prep.checkpoint(&q),
                    prep.checkpoint(&k),
                    prep.checkpoint(&v),
                    prep.checkpoint(&g),
                    prep.checkpoint(&h0),
                ];
                let out = B::linear_relation(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    g.into_primitive(),
                    h0.into_primitive(),
                );
                prep.finish((ids, out.clone()), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::linear_relation(
                q.into_primitive(),
                k.into_primitive(),
                v.into_primitive(),
                g.into_primitive(),
                h0.into_primitive(),
            )),
        }
    }

    fn chunk_linear_relation(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        chunk_size: usize,
    ) -> FloatTensor<Self> {
        let guards = [q.node(), k.node(), v.node(), g.node(), h0.node()];
        match LinearRelationBackward(Some(chunk_size))
            .prepare::<C>(guards)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let ids = [
                    prep.checkpoint(&q),
                    prep.checkpoint(&k),
                    prep.checkpoint(&v),
                    prep.checkpoint(&g),
                    prep.checkpoint(&h0),
                ];
                let out = B::chunk_linear_relation(
                    q.into_primitive(),
                    k.into_primitive(),
                    v.into_primitive(),
                    g.into_primitive(),
                    h0.into_primitive(),
                    chunk_size,
                );
                prep.finish((ids, out.clone()), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::chunk_linear_relation(
                q.into_primitive(),
                k.into_primitive(),
                v.into_primitive(),
                g.into_primitive(),
                h0.into_primitive(),
                chunk_size,
            )),
        }
    }

    fn chunk_linear_relation_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        out: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        chunk_size: usize,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (a, b, c, d, e) = B::chunk_linear_relation_bwd(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            g.into_primitive(),
            h0.into_primitive(),
            out.into_primitive(),
            d_out.into_primitive(),
            chunk_size,
        );
        (
            FloatTensor::<Self>::new(a),
            FloatTensor::<Self>::new(b),
            FloatTensor::<Self>::new(c),
            FloatTensor::<Self>::new(d),
            FloatTensor::<Self>::new(e),
        )
    }

    fn linear_relation_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        out: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (a, b, c, d, e) = B::linear_relation_bwd(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            g.into_primitive(),
            h0.into_primitive(),
            out.into_primitive(),
            d_out.into_primitive(),
        );
        (
            FloatTensor::<Self>::new(a),
            FloatTensor::<Self>::new(b),
            FloatTensor::<Self>::new(c),
            FloatTensor::<Self>::new(d),
            FloatTensor::<Self>::new(e),
        )
    }
}
