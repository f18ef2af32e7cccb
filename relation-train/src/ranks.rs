//! The processes of one training run: this process's rank among them, their number, and the
//! few messages a data-parallel run sends between them — over MPI with the `mpi` feature, when
//! a launcher (`mpirun`, `srun`) started the process as one of several.
//!
//! A run of `N` ranks trains on the tokens a one-process run trains on: every rank draws the
//! step's micro-batches in the same order and takes its share (micro-batch `i` on rank
//! `i mod N`); the gradients are summed across ranks once per step by
//! [`Ranks::sum_in_rank_order`] (each rank's own sum first, then the ranks' sums added in rank
//! order — a fixed order, whatever MPI's algorithms do), so every rank holds the same gradient,
//! takes the same update, and the weights stay equal without being sent. Rank 0 alone touches
//! the run directory; it sends the others what they need at the start (the data, a checkpoint to
//! resume from).

use crate::{Result, TrainError};

/// Elements of `f32` per message of [`Ranks::sum_in_rank_order`]: 16 MiB buckets keep each MPI
/// call's counts far below `i32::MAX` and its buffers bounded, whatever the model's size.
#[cfg(feature = "mpi")]
const BUCKET: usize = 4 << 20;

/// The processes of a run and this one's place among them.
///
/// One process ([`Ranks::single`]) is the whole run: every exchange is the identity. With the
/// `mpi` feature, [`Ranks::from_launcher`] joins the MPI world a launcher started, and the
/// exchanges go through MPI's world communicator until the [`MpiSession`] it returned is dropped.
pub struct Ranks {
    rank: usize,
    size: usize,
    /// Whether the exchanges go through MPI (an MPI world of more than one process).
    #[cfg(feature = "mpi")]
    mpi: bool,
}

/// MPI, initialized by [`Ranks::from_launcher`] and finalized when this is dropped: keep it
/// alive for as long as the [`Ranks`] exchange anything. Empty without MPI.
#[must_use = "dropping the session finalizes MPI"]
#[derive(Default)]
pub struct MpiSession {
    #[cfg(feature = "mpi")]
    _universe: Option<mpi::environment::Universe>,
}

/// MPI's world communicator (a handle: MPI is initialized while an [`MpiSession`] lives).
#[cfg(feature = "mpi")]
fn world() -> mpi::topology::SimpleCommunicator {
    mpi::topology::SimpleCommunicator::world()
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ranks {{ rank: {}, size: {} }}", self.rank, self.size)
    }
}

impl Default for Ranks {
    fn default() -> Self {
        Self::single()
    }
}

/// The launcher variables that give the world size: Open MPI's, then the PMI one (MPICH, Intel
/// MPI, Slurm's `srun --mpi=pmi2`).
const SIZE_VARIABLES: [&str; 2] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"];

/// The world size a launcher announced in the environment, with the variable that said so; `None`
/// without a launcher (or with a world of one).
pub fn launcher_size() -> Option<(&'static str, usize)> {
    SIZE_VARIABLES.into_iter().find_map(|variable| {
        let size = std::env::var(variable).ok()?.trim().parse::<usize>().ok()?;
        (size > 1).then_some((variable, size))
    })
}

impl Ranks {
    /// One process: rank 0 of 1.
    pub fn single() -> Self {
        Self {
            rank: 0,
            size: 1,
            #[cfg(feature = "mpi")]
            mpi: false,
        }
    }

    /// The ranks a launcher started: with the `mpi` feature, MPI is initialized (until the
    /// returned session is dropped) and this is the process's place in its world; without a
    /// launcher (or a world of one), [`Ranks::single`].
    ///
    /// # Errors
    /// [`TrainError::MultiProcess`] for a build without the `mpi` feature started as one of
    /// several processes (each would train the whole run alone); [`TrainError::Mpi`] when MPI
    /// cannot be initialized.
    pub fn from_launcher() -> Result<(Self, MpiSession)> {
        let Some((variable, size)) = launcher_size() else {
            return Ok((Self::single(), MpiSession::default()));
        };
        #[cfg(feature = "mpi")]
        {
            use mpi::traits::Communicator;
            let _ = (variable, size);
            let universe = mpi::initialize().ok_or_else(|| TrainError::Mpi {
                reason: "MPI was initialized already".into(),
            })?;
            let world = universe.world();
            let (rank, size) = (world.rank() as usize, world.size() as usize);
            let ranks = Self {
                rank,
                size,
                mpi: size > 1,
            };
            Ok((
                ranks,
                MpiSession {
                    _universe: Some(universe),
                },
            ))
        }
        #[cfg(not(feature = "mpi"))]
        Err(TrainError::MultiProcess { variable, size })
    }

    /// This process's rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this is rank 0, the one that reads and writes the run directory.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Whether micro-batch `index` of a step is this rank's.
    pub(crate) fn owns(&self, index: usize) -> bool {
        index % self.size == self.rank
    }

    /// Ends every process of the run at once (`MPI_Abort`) with `code`: what a rank that failed
    /// does, so that the others do not wait for it in the next exchange. One process exits.
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if self.mpi {
            use mpi::traits::Communicator;
            world().abort(code);
        }
        std::process::exit(code)
    }

    /// Makes a panic on any thread of this rank end every process of the run (after the usual
    /// panic message), as [`Ranks::abort`] does for an error: the others would otherwise wait
    /// for this one in the next exchange. Nothing in one process.
    pub fn abort_on_panic(&self) {
        #[cfg(feature = "mpi")]
        if self.mpi {
            let report = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                use mpi::traits::Communicator;
                report(info);
                world().abort(101);
            }));
        }
    }

    /// Rank 0's `bytes` on every rank (the others' are replaced).
    pub fn broadcast(&self, bytes: &mut Vec<u8>) {
        #[cfg(feature = "mpi")]
        if self.mpi {
            use mpi::traits::{Communicator, Root};
            let world = world();
            let root = world.process_at_rank(0);
            let mut len = [bytes.len() as u64];
            root.broadcast_into(&mut len[..]);
            bytes.resize(len[0] as usize, 0);
            for chunk in bytes.chunks_mut(BUCKET * 4) {
                root.broadcast_into(chunk);
            }
        }
        let _ = bytes;
    }

    /// Every rank's `mine` (each rank the same count), concatenated in rank order.
    pub fn all_gather(&self, mine: &[f32]) -> Vec<f32> {
        #[cfg(feature = "mpi")]
        if self.mpi {
            use mpi::traits::CommunicatorCollectives;
            let mut all = vec![0.0f32; mine.len() * self.size];
            world().all_gather_into(mine, &mut all[..]);
            return all;
        }
        mine.to_vec()
    }

    /// Whether `flag` is set on any rank.
    pub fn any(&self, flag: bool) -> bool {
        #[cfg(feature = "mpi")]
        if self.mpi {
            use mpi::collective::SystemOperation;
            use mpi::traits::CommunicatorCollectives;
            let mut any = 0u8;
            world().all_reduce_into(&(flag as u8), &mut any, SystemOperation::max());
            return any != 0;
        }
        flag
    }

    /// Replaces `values` (the same length on every rank) with their sum over the ranks, added in
    /// rank order — `((v₀ + v₁) + v₂) + …` element by element, the same bits on every rank and
    /// in every run of this size.
    ///
    /// In buckets of 4 Mi elements (16 MiB), each cut into `size` pieces: rank `p` receives piece
    /// `p` of every rank (all-to-all), adds them in rank order, and every rank gathers the summed
    /// pieces (all-gather) — each rank sends and receives `2 (N − 1) / N` of the bytes, a ring
    /// all-reduce's traffic.
    ///
    /// # Errors
    /// [`TrainError::Mpi`] when the ranks' lengths differ.
    pub fn sum_in_rank_order(&self, values: &mut [f32]) -> Result<()> {
        #[cfg(feature = "mpi")]
        if self.mpi {
            use mpi::datatype::{Partition, PartitionMut};
            use mpi::traits::CommunicatorCollectives;
            let world = world();
            let n = self.size;
            let mut lens = vec![0u64; n];
            world.all_gather_into(&(values.len() as u64), &mut lens[..]);
            if lens.iter().any(|&l| l != values.len() as u64) {
                return Err(TrainError::Mpi {
                    reason: format!(
                        "the ranks' gradients differ in size ({lens:?} values by rank): every rank must run the same model"
                    ),
                });
            }
            let mut gathered = Vec::new();
            for bucket in values.chunks_mut(BUCKET) {
                let len = bucket.len();
                let piece = |p: usize| (p * len / n, (p + 1) * len / n);
                let counts: Vec<i32> = (0..n).map(|p| (piece(p).1 - piece(p).0) as i32).collect();
                let displs: Vec<i32> = (0..n).map(|p| piece(p).0 as i32).collect();
                let (lo, hi) = piece(self.rank);
                let mine = hi - lo;
                // Piece `rank` of every rank, rank after rank.
                gathered.clear();
                gathered.resize(mine * n, 0.0f32);
                let recv_counts = vec![mine as i32; n];
                let recv_displs: Vec<i32> = (0..n).map(|r| (r * mine) as i32).collect();
                {
                    let send = Partition::new(&*bucket, &counts[..], &displs[..]);
                    let mut recv =
                        PartitionMut::new(&mut gathered[..], &recv_counts[..], &recv_displs[..]);
                    world.all_to_all_varcount_into(&send, &mut recv);
                }
                let (sum, rest) = gathered.split_at_mut(mine);
                for other in rest.chunks_exact(mine.max(1)).take(n - 1) {
                    for (s, o) in sum.iter_mut().zip(other) {
                        *s += *o;
                    }
                }
                let summed = sum.to_vec();
                let mut all = PartitionMut::new(&mut *bucket, &counts[..], &displs[..]);
                world.all_gather_varcount_into(&summed[..], &mut all);
            }
            return Ok(());
        }
        let _ = values;
        Ok(())
    }
}

/// Under a launcher, the rank this process was given (`OMPI_COMM_WORLD_RANK`, `PMI_RANK`), read
/// from the environment without MPI: what a message of a process that failed before joining
/// names it by.
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .into_iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}
