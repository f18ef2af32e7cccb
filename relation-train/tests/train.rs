//! relation-train's test binary: the `relation` command end to end (train, stop, resume, eval,
//! generate, crashes, corruption, divergence, bad input) and the pieces it is built from.

mod common;

mod cli;
mod failures;
mod parts;
mod recovery;
