//! The command line end to end on a tiny model, one file per subject: a run's life (train,
//! stop and resume with bit-identical losses, eval, generate), `train`'s flags, devices and
//! data parallel, mixed precision, `generate` and `export`, Hugging Face folders, `report`.

mod devices;
mod flags;
mod generate;
mod hf;
mod packing;
mod precision;
mod report;
mod run;
mod serve;
