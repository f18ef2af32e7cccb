//! Which kernels serve [`RelationOps`] on each backend: `impl RelationOps` for CubeCL, Flex and
//! Autodiff by one-line delegations to the `cube`, `flex` and `autodiff` modules of every
//! operation folder. Kept apart from the trait (`ops.rs`), which the operations' entry points use,
//! so that no module both uses the entry points' folders and is used by them.

use burn::backend::tensor::FloatTensor;

use crate::ops::{
    FlashArgs, FlashForward, FlashGrads, FlashParams, FlashSaved, LinearArgs, LinearGrads,
    LinearParams, RelationOps,
};

/// `impl RelationOps for <backend>` by delegation to the `<kernels>` module of every operation
/// folder (`cube`, `flex` or `autodiff`), optionally with type arguments for its functions.
macro_rules! relation_ops_impl {
    (impl[$($generics:tt)*] $backend:ty => $kernels:ident $(::<$($ty:ty),+>)?) => {
        impl<$($generics)*> RelationOps for $backend {
            fn self_relation(
                p1: FloatTensor<Self>,
                p2: FloatTensor<Self>,
                scale: f32,
            ) -> FloatTensor<Self> {
                crate::self_relation::$kernels::forward$(::<$($ty),+>)?(p1, p2, scale)
            }

            fn flash_relation(
                p1: FloatTensor<Self>,
                p2: FloatTensor<Self>,
                info: FloatTensor<Self>,
                lambda: FloatTensor<Self>,
                params: FlashParams,
            ) -> FloatTensor<Self> {
                let args = FlashArgs { p1, p2, info, lambda, params };
                crate::flash_relation::$kernels::forward$(::<$($ty),+>)?(args)
            }

            fn flash_relation_fwd(
                p1: FloatTensor<Self>,
                p2: FloatTensor<Self>,
                info: FloatTensor<Self>,
                lambda: FloatTensor<Self>,
                params: FlashParams,
            ) -> FlashForward<Self> {
                let args = FlashArgs { p1, p2, info, lambda, params };
                crate::flash_relation::$kernels::forward_with_stats$(::<$($ty),+>)?(args)
            }

            fn flash_relation_bwd(
                p1: FloatTensor<Self>,
                p2: FloatTensor<Self>,
                info: FloatTensor<Self>,
                lambda: FloatTensor<Self>,
                ibar: FloatTensor<Self>,
                stats: FloatTensor<Self>,
                dy: FloatTensor<Self>,
                params: FlashParams,
            ) -> FlashGrads<Self> {
                let args = FlashArgs { p1, p2, info, lambda, params };
                let saved = FlashSaved { ibar, stats, dy };
                crate::flash_relation::$kernels::backward$(::<$($ty),+>)?(args, saved)
            }

            fn linear_relation(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                g: FloatTensor<Self>,
                h0: FloatTensor<Self>,
                params: LinearParams,
            ) -> FloatTensor<Self> {
                let args = LinearArgs { q, k, v, g, h0, params };
                crate::linear_relation::$kernels::forward$(::<$($ty),+>)?(args)
            }

            fn linear_relation_bwd(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                g: FloatTensor<Self>,
                h0: FloatTensor<Self>,
                out: FloatTensor<Self>,
                d_out: FloatTensor<Self>,
                params: LinearParams,
            ) -> LinearGrads<Self> {
                let args = LinearArgs { q, k, v, g, h0, params };
                crate::linear_relation::$kernels::backward$(::<$($ty),+>)?(args, out, d_out)
            }
        }
    };
}

#[cfg(feature = "cube")]
relation_ops_impl!(impl[] burn_cubecl::CubeBackend => cube);
#[cfg(feature = "flex")]
relation_ops_impl!(impl[] burn::backend::Flex => flex);
relation_ops_impl!(
    impl[B: RelationOps, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy]
    burn::backend::autodiff::Autodiff<B, C> => autodiff::<B, C>
);
