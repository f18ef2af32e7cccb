//! A multi-process step's exchange (see [`crate::ranks`]): the step's micro-batch losses from
//! every rank, in micro-batch order, and the ranks' gradient sums added in rank order. Through
//! the host: each gradient is read back, the flattened buffer summed across ranks, and the sums
//! registered again on the device they came from.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use relation_model::RelationLm;

use crate::Result;
use crate::ranks::Ranks;

/// The step's `accumulation` micro-batch losses (`[accumulation]`, in micro-batch order, on
/// `device`), gathered from the ranks; `mine` are this rank's (`[1]` each, micro-batches
/// `rank, rank + N, …` in order).
pub(super) fn all_losses(
    ranks: &Ranks,
    mine: Vec<Tensor<1>>,
    accumulation: usize,
    device: &Device,
) -> Tensor<1> {
    let n = ranks.size();
    // Every rank sends the same count: its share, padded to the largest share.
    let most = accumulation.div_ceil(n);
    let mut values: Vec<f32> = if mine.is_empty() {
        Vec::new()
    } else {
        Tensor::cat(mine, 0).into_data().iter::<f32>().collect()
    };
    values.resize(most, 0.0);
    let all = ranks.all_gather(&values);
    // Micro-batch i is rank (i mod N)'s (i / N)-th.
    let ordered: Vec<f32> = (0..accumulation)
        .map(|i| all[(i % n) * most + i / n])
        .collect();
    Tensor::from_data(TensorData::new(ordered, [accumulation]), device)
}

/// Replaces every gradient in `grads` with its sum over the ranks, added in rank order
/// ([`Ranks::sum_in_rank_order`]), in the model's parameter order.
///
/// # Errors
/// [`crate::TrainError::Mpi`] when the ranks' gradients differ in size.
pub(super) fn sum_across_ranks(
    ranks: &Ranks,
    model: &RelationLm,
    grads: &mut GradientsParams,
) -> Result<()> {
    let mut flatten = Flatten {
        grads,
        values: Vec::new(),
        parts: Vec::new(),
    };
    model.visit(&mut flatten);
    let Flatten {
        grads,
        mut values,
        parts,
    } = flatten;
    ranks.sum_in_rank_order(&mut values)?;
    let mut start = 0;
    for part in parts {
        let end = start + part.shape.iter().product::<usize>();
        part.register(grads, values[start..end].to_vec());
        start = end;
    }
    Ok(())
}

/// Registers summed values (a gradient's shape, on its device) under its parameter.
type Put = Box<dyn FnOnce(&mut GradientsParams, TensorData)>;

/// One gradient taken out of the step's gradients: its shape (its values sit in the flat buffer
/// in parameter order), and how to put its sum back.
struct Part {
    shape: Vec<usize>,
    put: Put,
}

impl Part {
    fn register(self, grads: &mut GradientsParams, values: Vec<f32>) {
        let data = TensorData::new(values, self.shape);
        (self.put)(grads, data);
    }
}

/// Takes every gradient out, in the model's parameter order, and appends its values (as f32)
/// to one buffer.
struct Flatten<'a> {
    grads: &'a mut GradientsParams,
    values: Vec<f32>,
    parts: Vec<Part>,
}

impl ModuleVisitor for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(g) = self.grads.remove::<D>(param.id) else {
            return;
        };
        let id: ParamId = param.id;
        let device = g.device();
        let shape = g.dims().to_vec();
        self.values.extend(g.into_data().iter::<f32>());
        self.parts.push(Part {
            shape,
            put: Box::new(move |grads, data| {
                grads.register::<D>(id, Tensor::from_data(data, &device));
            }),
        });
    }
}
