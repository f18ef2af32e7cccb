//! Self relation on Flex: `S = sigmoid(scale p1 · p2)` per row, rows split over the thread pool.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::flex::{Unfused, dims4, output, read_f32, sigmoid, tensor};

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 1024;

/// `S[b, t, h] = sigmoid(scale p1[b, t, h, :] · p2[b, t, h, :])`.
///
/// # Shapes
/// - `p1`, `p2`: `[B, T, H, D]`; output `[B, T, H]` in `p1`'s dtype
pub(crate) fn forward(p1: FlexTensor, p2: FlexTensor, scale: f32) -> FlexTensor {
    let [b, t, h, d] = dims4(&p1);
    let dtype = p1.dtype();
    let (p1, p2) = (read_f32(&p1), read_f32(&p2)); // [B·T·H, D]
    let mut s = output(b * t * h);
    s.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, rows)| {
            for (r, out) in rows.iter_mut().enumerate() {
                let row = (task * ROWS_PER_TASK + r) * d;
                let dot: f32 = p1[row..row + d]
                    .iter()
                    .zip(&p2[row..row + d])
                    .map(|(a, b)| a * b)
                    .sum();
                *out = sigmoid::<Unfused>(scale * dot);
            }
        });
    tensor(s, Shape::new([b, t, h]), dtype)
}
