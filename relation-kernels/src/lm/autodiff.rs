//! The backward passes of the language-model ops under autodiff: [`LmOps`] for `Autodiff<B, C>`
//! over any backend that has it (Flex).

use burn::backend::autodiff::{
    Autodiff, NodeId,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::tensor::{FloatTensor, IntTensor};

use relation_core::RopePositions;

use super::ops::{LmOps, Transposed};

impl<B: LmOps, C: CheckpointStrategy> LmOps for Autodiff<B, C> {
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        /// Saves each row's `1 / rms` (`[rows]`); `x` and `gamma` are checkpointed (the
        /// residual stream and a parameter, alive anyway).
        #[derive(Debug)]
        struct RmsNormBackward;

        impl<B: LmOps> Backward<B, 2> for RmsNormBackward {
            type State = (NodeId, NodeId, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_x, node_gamma] = ops.parents;
                let dy = grads.consume::<B>(&ops.node);
                let (x_id, gamma_id, r) = ops.state;
                let x: FloatTensor<B> = checkpointer.retrieve_node_output(x_id);
                let gamma: FloatTensor<B> = checkpointer.retrieve_node_output(gamma_id);
                let (dx, dgamma) = B::rms_norm_bwd(x, gamma, r, dy);
                for (node, grad) in [(node_x, dx), (node_gamma, dgamma)] {
                    if let Some(node) = node {
                        grads.register::<B>(node.id, grad);
                    }
                }
            }
        }

        match RmsNormBackward
            .prepare::<C>([x.node(), gamma.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let (x_id, gamma_id) = (prep.checkpoint(&x), prep.checkpoint(&gamma));
                let (y, r) = B::rms_norm_fwd(x.into_primitive(), gamma.into_primitive(), eps);
                prep.finish((x_id, gamma_id, r), y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::rms_norm(x.into_primitive(), gamma.into_primitive(), eps))
            }
        }
    }

    fn rms_norm_fwd(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (y, r) = B::rms_norm_fwd(x.into_primitive(), gamma.into_primitive(), eps);
        (FloatTensor::<Self>::new(y), FloatTensor::<Self>::new(r))
    }

    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dgamma) = B::rms_norm_bwd(
            x.into_primitive(),
            gamma.into_primitive(),
            r.into_primitive(),
            dy.into_primitive(),
        );
        (
            FloatTensor::<Self>::new(dx),
            FloatTensor::<Self>::new(dgamma),
        )
    }

    fn rope(
        x: FloatTensor<Self>,
        positions: RopePositions,
        base: f64,
        inverse: bool,
    ) -> FloatTensor<Self> {
        /// Saves nothing: RoPE is a rotation `R`, so `dx = Rᵀ dy` is the inverse rotation of
        /// the upstream gradient.
        #[derive(Debug)]
        struct RopeBackward;

        impl<B: LmOps> Backward<B, 1> for RopeBackward {
            type State = (RopePositions, f64, bool);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let [node] = ops.parents;
                let dy = grads.consume::<B>(&ops.node);
                let (positions, base, inverse) = ops.state;
                if let Some(node) = node {
                    grads.register::<B>(node.id, B::rope(dy, positions, base, !inverse));
                }
            }
        }

        match RopeBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                (positions.clone(), base, inverse),
                B::rope(x.into_primitive(), positions, base, inverse),
            ),
            OpsKind::UnTracked(prep) => {
                prep.finish(B::rope(x.into_primitive(), positions, base, inverse))
            }
        }
    }

    fn dense(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        transposed: Transposed,
    ) -> FloatTensor<Self> {
        /// Saves nothing new: both factors are checkpointed (they are activations and weights
        /// that live anyway). With `C = op_a(A) op_b(B)` and upstream `G`:
        ///
        /// ```text
        /// dA = G op_b(B)ᵀ          (A not transposed)      dA = op_b(B) Gᵀ      (A transposed)
        /// dB = op_a(A)ᵀ G          (B not transposed)      dB = Gᵀ op_a(A)      (B transposed)
        /// ```
        ///
        /// Each is one more call of the same product with other transposes: no transposed copy.
        #[derive(Debug)]
        struct DenseBackward;

        impl<B: LmOps> Backward<B, 2> for DenseBackward {
            type State = (NodeId, NodeId, Transposed);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_a, node_b] = ops.parents;
                let g = grads.consume::<B>(&ops.node);
                let (a_id, b_id, t) = ops.state;
                let a: FloatTensor<B> = checkpointer.retrieve_node_output(a_id);
                let b: FloatTensor<B> = checkpointer.retrieve_node_output(b_id);
                if let Some(node) = node_a {
                    let da = if t.a {
                        B::dense(b.clone(), g.clone(), Transposed { a: t.b, b: true })
                    } else {
                        B::dense(g.clone(), b, Transposed { a: false, b: !t.b })
                    };
                    grads.register::<B>(node.id, da);
                }
                if let Some(node) = node_b {
                    let db = if t.b {
                        B::dense(g, a, Transposed { a: true, b: t.a })
                    } else {
                        B::dense(a, g, Transposed { a: !t.a, b: false })
                    };
                    grads.register::<B>(node.id, db);
                }
            }
        }

        match DenseBackward
            .prepare::<C>([a.node(), b.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let state = (prep.checkpoint(&a), prep.checkpoint(&b), transposed);
                let y = B::dense(a.into_primitive(), b.into_primitive(), transposed);
                prep.finish(state, y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::dense(a.into_primitive(), b.into_primitive(), transposed))
            }
        }
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        /// Saves nothing new: `gate` and `up` are checkpointed (the matmuls that made them keep
        /// them anyway) and the backward recomputes `sigmoid(gate)`.
        #[derive(Debug)]
        struct SwigluBackward;

        impl<B: LmOps> Backward<B, 2> for SwigluBackward {
            type State = (NodeId, NodeId);

            fn backward(
                self,
                ops: Ops<Self::State, 2>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_gate, node_up] = ops.parents;
                let dy = grads.consume::<B>(&ops.node);
                let (gate_id, up_id) = ops.state;
                let gate: FloatTensor<B> = checkpointer.retrieve_node_output(gate_id);
                let up: FloatTensor<B> = checkpointer.retrieve_node_output(up_id);
                let (dgate, dup) = B::swiglu_bwd(gate, up, dy);
                for (node, grad) in [(node_gate, dgate), (node_up, dup)] {
                    if let Some(node) = node {
                        grads.register::<B>(node.id, grad);
                    }
                }
            }
        }

        match SwigluBackward
            .prepare::<C>([gate.node(), up.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let ids = (prep.checkpoint(&gate), prep.checkpoint(&up));
                let y = B::swiglu(gate.into_primitive(), up.into_primitive());
                prep.finish(ids, y)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::swiglu(gate.into_primitive(), up.into_primitive()))
            }
        }
    }

    fn swiglu_bwd(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // Not differentiable on its own: the outputs are constants of the graph.
        let (dgate, dup) = B::swiglu_bwd(
            gate.into_primitive(),
            up.into_primitive(),
            dy.into_primitive(),
        );
        (
            FloatTensor::<Self>::new(dgate),
            FloatTensor::<Self>::new(dup),
        )
    }

    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        /// Saves the row log-sum-exps (`[N]`) and the targets; the logits are checkpointed
        /// (the output projection keeps them for its own backward).
        #[derive(Debug)]
        struct CrossEntropyBackward;

        impl<B: LmOps> Backward<B, 1> for CrossEntropyBackward {
            type State = (NodeId, IntTensor<B>, FloatTensor<B>);

            fn backward(
                self,
                ops: Ops<Self::State, 1>,
                grads: &mut Gradients,
                checkpointer: &mut Checkpointer,
            ) {
                let [node_logits] = ops.parents;
                let d_nll = grads.consume::<B>(&ops.node);
                let (logits_id, targets, lse) = ops.state;
                let logits: FloatTensor<B> = checkpointer.retrieve_node_output(logits_id);
                if let Some(node) = node_logits {
                    let grad = B::cross_entropy_bwd(logits, targets, lse, d_nll);
                    grads.register::<B>(node.id, grad);
                }
            }
        }

        match CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let logits_id = prep.checkpoint(&logits);
                let (nll, lse) = B::cross_entropy_fwd(logits.into_primitive(), targets.clone());
                prep.finish((logits_id, targets, lse), nll)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::cross_entropy(logits.into_primitive(), targets))
            }
        }
    }

    fn cross_entropy_fwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (nll, lse) = B::cross_entropy_fwd(logits.into_primitive(), targets);
        (FloatTensor::<Self>::new(nll), FloatTensor::<Self>::new(lse))
    }

    fn cross_entropy_bwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        d_nll: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        FloatTensor::<Self>::new(B::cross_entropy_bwd(
            logits.into_primitive(),
            targets,
            lse.into_primitive(),
            d_nll.into_primitive(),
        ))
    }
}
