//! The command line end to end on a tiny model, one file per subject: a run's life (train,
//! stop and resume with bit-identical losses, eval, generate), `train`'s flags, devices and
//! data parallel (devices of one process, MPI ranks), mixed precision, `generate` and `export`, Hugging Face folders, `report`.

mod devices;
mod flags;
mod generate;
mod hf;
// Needs the system's MPI (`mpirun`) and a build with it.
#[cfg(feature = "mpi")]
mod mpi;
mod packing;
mod precision;
mod report;
mod run;
mod serve;
