//! How data parallel sums the replicas' gradients: Burn's collective engine
//! (`burn::tensor::distributed`) where the devices have one, the ordered sum on the first
//! device everywhere else, and the choice between them, made once in setup.
//!
//! Burn 0.22.1 implements `all_reduce` for CubeCL devices whose runtime moves data between its
//! devices itself — CUDA, through NCCL, when the NCCL library is found — and for Remote devices
//! (which forward it to the server's devices). Flex and NdArray have none (`DistributedContext`
//! panics on them), the other CubeCL runtimes (wgpu, Vulkan, Metal, ROCm, the CPU runtime)
//! refuse it at the first all-reduce, and a collective spans devices of one backend. So the
//! choice is made here, from the devices, before anything runs: [`collective_support`] says
//! why not in a [`NoCollective`], and the run falls back to [`Reduction::Ordered`] (or, asked
//! for the collective, refuses to start).

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::distributed::{
    CollectiveTensor, DistributedConfig, DistributedContext, ReduceOperation, all_reduce,
};
use burn::tensor::{Device, Tensor};
use relation_model::RelationLm;

use crate::config::Reduce;
use crate::error::NoCollective;
use crate::{Result, TrainError};

/// What a device is, as far as collectives go.
enum Kind {
    /// A CubeCL device: its runtime's name, whether that runtime moves data between its devices
    /// itself (what `all_reduce` needs), and the runtime's variant (to tell runtimes apart).
    #[cfg(any(
        feature = "wgpu",
        feature = "vulkan",
        feature = "metal",
        feature = "cuda",
        feature = "rocm",
        feature = "cpu"
    ))]
    Cube {
        runtime: &'static str,
        transport: bool,
        variant: std::mem::Discriminant<burn::backend::CubeDevice>,
    },
    /// Any other backend, by name.
    Other(&'static str),
}

impl Kind {
    fn of(device: &Device) -> Self {
        use burn::backend::DispatchDevice;
        match device.clone().inner().as_dispatch() {
            #[cfg(any(
                feature = "wgpu",
                feature = "vulkan",
                feature = "metal",
                feature = "cuda",
                feature = "rocm",
                feature = "cpu"
            ))]
            DispatchDevice::Cube(cube) => {
                let client = cube.client();
                Self::Cube {
                    runtime: client.name(),
                    transport: client.has_device_transport(),
                    variant: std::mem::discriminant(cube),
                }
            }
            #[cfg(feature = "flex")]
            DispatchDevice::Flex(_) => Self::Other("Flex"),
            #[cfg(feature = "ndarray")]
            DispatchDevice::NdArray(_) => Self::Other("NdArray"),
            #[allow(unreachable_patterns)]
            _ => Self::Other("non-CubeCL"),
        }
    }

    /// Whether two devices belong to one backend (and, on CubeCL, one runtime).
    fn same_backend(&self, other: &Self) -> bool {
        match (self, other) {
            #[cfg(any(
                feature = "wgpu",
                feature = "vulkan",
                feature = "metal",
                feature = "cuda",
                feature = "rocm",
                feature = "cpu"
            ))]
            (Self::Cube { variant: a, .. }, Self::Cube { variant: b, .. }) => a == b,
            (Self::Other(a), Self::Other(b)) => a == b,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// Whether Burn's collective engine can all-reduce over `devices` (named `names`, as given):
/// one backend, one that has collectives, each device once.
///
/// # Errors
/// The first reason it cannot, as a [`NoCollective`].
pub fn collective_support(
    names: &[String],
    devices: &[Device],
) -> std::result::Result<(), NoCollective> {
    let kinds: Vec<Kind> = devices.iter().map(Kind::of).collect();
    if let Some(i) = kinds.iter().position(|k| !k.same_backend(&kinds[0])) {
        return Err(NoCollective::MixedBackends {
            first: names[0].clone(),
            other: names[i].clone(),
        });
    }
    let unsupported = match &kinds[0] {
        #[cfg(any(
            feature = "wgpu",
            feature = "vulkan",
            feature = "metal",
            feature = "cuda",
            feature = "rocm",
            feature = "cpu"
        ))]
        Kind::Cube {
            transport: false,
            runtime,
            ..
        } => Some(NoCollective::NoTransport {
            device: names[0].clone(),
            runtime,
        }),
        Kind::Other(backend) => Some(NoCollective::Backend {
            device: names[0].clone(),
            backend,
        }),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    if let Some(reason) = unsupported {
        return Err(reason);
    }
    if let Some(i) = (1..devices.len()).find(|&i| devices[..i].contains(&devices[i])) {
        return Err(NoCollective::Repeated {
            device: names[i].clone(),
        });
    }
    Ok(())
}

/// How a data-parallel step sums its gradients, chosen in setup and kept for the run.
pub(super) enum Reduction {
    /// Every micro-batch's gradient is moved to the first device and added there in
    /// micro-batch order: bit for bit the single-device sum, on any devices.
    Ordered,
    /// Each replica sums its own micro-batches in order, then Burn's `all_reduce` (`Sum`)
    /// adds the replicas' sums, device to device.
    Collective(Collective),
    /// [`Faults::host_all_reduce`](crate::faults::Faults::host_all_reduce): the collective's
    /// arrangement, its all-reduce done by the host.
    HostAllReduce,
}

impl Reduction {
    /// The reduction `reduce` asks for over `devices` (named `names`): with `Auto`, Burn's
    /// collective where [`collective_support`] allows it and the ordered sum elsewhere. Starts
    /// Burn's distributed context when the collective is chosen; it lives as long as the
    /// returned value (the run) and is closed when that is dropped.
    ///
    /// # Errors
    /// [`TrainError::Collective`] for `Reduce::Collective` over devices Burn's collective
    /// cannot reduce over.
    pub(super) fn open(
        reduce: Reduce,
        names: &[String],
        devices: &[Device],
        host_all_reduce: bool,
    ) -> Result<Self> {
        let joined = names.join(" + ");
        if devices.len() < 2 {
            return Ok(Self::Ordered);
        }
        if host_all_reduce {
            tracing::warn!(
                devices = %joined,
                fault = "host-all-reduce",
                "data parallel: replica sums all-reduced by the host (test hook)"
            );
            return Ok(Self::HostAllReduce);
        }
        if reduce == Reduce::Ordered {
            tracing::info!(devices = %joined, reduce = %reduce, "data parallel: ordered sum on the first device");
            return Ok(Self::Ordered);
        }
        match collective_support(names, devices) {
            Ok(()) => Ok(Self::Collective(Collective::init(&joined, devices))),
            Err(reason) if reduce == Reduce::Auto => {
                tracing::info!(
                    devices = %joined,
                    reduce = %reduce,
                    reason = %reason,
                    "data parallel: no Burn collective over these devices; ordered sum on the first device"
                );
                Ok(Self::Ordered)
            }
            Err(reason) => Err(TrainError::Collective {
                devices: joined,
                reason,
            }),
        }
    }

    /// How the run's banner describes it (`None` on one device).
    pub(super) fn describe(&self, names: &[String]) -> Option<String> {
        if names.len() < 2 {
            return None;
        }
        Some(match self {
            Self::Ordered => format!(
                "gradients summed in micro-batch order on {} (bit for bit one device)",
                names[0]
            ),
            Self::Collective(_) => {
                "gradients summed by Burn's collective (all-reduce Sum over the replicas)".into()
            }
            Self::HostAllReduce => "gradients: replica sums added by the host (test hook)".into(),
        })
    }
}

/// Burn's distributed context over the run's devices, held for the run.
pub(super) struct Collective {
    /// The devices, the first holding the optimizer.
    devices: Vec<Device>,
    /// How the trace names them.
    names: String,
    /// Started in [`Collective::init`]; dropping it closes Burn's communication server.
    _context: DistributedContext,
}

impl Collective {
    /// Starts Burn's distributed context over `devices`. Its configured reduction is `Sum`, the
    /// one [`all_reduce_grads`] asks for: each micro-batch's loss is already divided by
    /// the step's micro-batch count, as on one device, so the sum is the step's gradient (a
    /// `Mean` would divide a second time).
    fn init(names: &str, devices: &[Device]) -> Self {
        let config = DistributedConfig {
            all_reduce_op: ReduceOperation::Sum,
        };
        tracing::info!(
            devices = names,
            replicas = devices.len(),
            op = ?config.all_reduce_op,
            "data parallel: starting Burn's distributed context (all-reduce of the replicas' gradient sums)"
        );
        let context = DistributedContext::init(devices.to_vec(), config);
        tracing::debug!(devices = names, "distributed context started");
        Self {
            devices: devices.to_vec(),
            names: names.into(),
            _context: context,
        }
    }

    /// The first `n` devices: the group a step with fewer micro-batches than devices reduces
    /// over (a collective's every member must take part).
    pub(super) fn group(&self, n: usize) -> &[Device] {
        &self.devices[..n]
    }
}

impl Drop for Collective {
    fn drop(&mut self) {
        tracing::info!(devices = %self.names, "data parallel: closing Burn's distributed context");
    }
}

/// All-reduces (`Sum`) every parameter gradient of `model` in `grads` over `group`, in the
/// module's parameter order — the same on every replica, as a collective requires — and waits
/// for the results. Called on every member's own thread at once.
pub(super) fn all_reduce_grads(model: &RelationLm, grads: &mut GradientsParams, group: &[Device]) {
    let mut issue = Issue {
        grads,
        group,
        pending: Vec::new(),
    };
    model.visit(&mut issue);
    let Issue { grads, pending, .. } = issue;
    tracing::trace!(params = pending.len(), "all-reduce issued");
    for finish in pending {
        finish(grads);
    }
}

/// One all-reduce not yet waited for: registers its result once it has resolved.
type Pending = Box<dyn FnOnce(&mut GradientsParams)>;

/// Issues one all-reduce per parameter gradient (all before the first wait).
struct Issue<'a> {
    grads: &'a mut GradientsParams,
    group: &'a [Device],
    pending: Vec<Pending>,
}

impl ModuleVisitor for Issue<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            let id = param.id;
            let reduced: CollectiveTensor<D> =
                all_reduce(g, ReduceOperation::Sum, self.group.to_vec());
            self.pending
                .push(Box::new(move |grads| grads.register(id, reduced.resolve())));
        }
    }
}

/// Where the members of a collective meet before the all-reduce, so that one member that
/// failed (an error or a panic in its micro-batches) stops them all instead of leaving the
/// others waiting in the all-reduce for ever.
pub(super) struct Meeting {
    barrier: Barrier,
    failed: AtomicBool,
}

impl Meeting {
    /// A meeting of `n` members.
    pub(super) fn new(n: usize) -> Self {
        Self {
            barrier: Barrier::new(n),
            failed: AtomicBool::new(false),
        }
    }

    /// Waits for every member; `true` when all of them arrived with their gradients.
    pub(super) fn all_ready(&self, ready: bool) -> bool {
        if !ready {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.barrier.wait();
        !self.failed.load(Ordering::SeqCst)
    }
}
