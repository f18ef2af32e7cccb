//! relation-train's test binary: the `relation` command end to end (train, stop, resume, eval,
//! generate, crashes, corruption, divergence, bad input) and the pieces it is built from.

/// The `relation` binary's allocator, so every test here allocates through it too.
#[global_allocator]
static ALLOC: relation_train::memory::HugePages = relation_train::memory::HugePages;

mod common;

mod cli;
mod failures;
mod parts;
mod recovery;
