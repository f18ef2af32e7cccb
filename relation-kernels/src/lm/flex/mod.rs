//! Flex kernels of the language-model ops, one file per op. The dense product is a GEMM
//! ([`crate::flex::dense`]); the others
//! are one pass each, split over the thread pool in fixed
//! chunks (every chunk owns its output slice and runs the same arithmetic whatever the thread
//! count, so results are bitwise identical for 1 or N threads), element loops vectorised through
//! [`vectorized`] with the branch-free [`exp`].
//!
//! ```text
//! SwiGLU        y = g s u,  s = sigmoid(g)
//!               du = dy g s,  dg = dy u s (1 + g (1 - s))
//! cross-entropy lse_n = m_n + ln sum_v e^{x_nv - m_n},  m_n = max_v x_nv,  nll_n = lse_n - x_{n,t_n}
//!               dx_nv = d_n (e^{x_nv - lse_n} - [v = t_n])
//! ```

mod cross_entropy;
mod dense;
mod rms_norm;
mod rope;
mod swiglu;

pub(crate) use cross_entropy::{cross_entropy_bwd, cross_entropy_fwd};
pub(crate) use dense::{dense, dense_f32, dense_on_avx512};
pub(crate) use rms_norm::{rms_norm_bwd, rms_norm_fwd};
pub(crate) use rope::rope;
pub(crate) use swiglu::{swiglu, swiglu_bwd};

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;

/// Elements per parallel task of the element-wise SwiGLU (64 KiB of f32 per input).
pub(super) const ELEMS_PER_TASK: usize = 16 * 1024;

/// `[N, V]` of a rank-2 Flex tensor.
pub(super) fn dims2(x: &FlexTensor) -> [usize; 2] {
    let s = x.layout().shape();
    [s[0], s[1]]
}

/// The token ids of an integer Flex tensor, as indices (the entry point checked `0..V`).
///
/// # Panics
/// On a float dtype or a negative id (the entry point passes neither).
pub(super) fn read_ids(x: &FlexTensor) -> Vec<usize> {
    const CONTIGUOUS: &str = "a contiguous tensor has a contiguous slice";
    let x = x.to_contiguous();
    fn ids<T: Copy + TryInto<usize>>(s: &[T]) -> Vec<usize> {
        s.iter()
            .map(|&v| {
                v.try_into()
                    .ok()
                    .expect("token ids are checked to be in 0..V")
            })
            .collect()
    }
    match x.dtype() {
        DType::I64 => ids(x.as_slice::<i64>().expect(CONTIGUOUS)),
        DType::I32 => ids(x.as_slice::<i32>().expect(CONTIGUOUS)),
        DType::I16 => ids(x.as_slice::<i16>().expect(CONTIGUOUS)),
        DType::I8 => ids(x.as_slice::<i8>().expect(CONTIGUOUS)),
        DType::U64 => ids(x.as_slice::<u64>().expect(CONTIGUOUS)),
        DType::U32 => ids(x.as_slice::<u32>().expect(CONTIGUOUS)),
        DType::U16 => ids(x.as_slice::<u16>().expect(CONTIGUOUS)),
        DType::U8 => ids(x.as_slice::<u8>().expect(CONTIGUOUS)),
        other => panic!("relation-kernels (flex): token ids of dtype {other:?}"),
    }
}
