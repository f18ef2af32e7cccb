//! FlashRelation benchmark: see [`relation_examples::flash_bench`] for what it measures.
//!
//! ```text
//! cargo run --release -p relation-examples --example flash_relation_bench [--features wgpu] -- --help
//! ```

use clap::Parser;
use relation_examples::counting::Counting;
use relation_examples::flash_bench::{Args, run};

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() {
    run(&Args::parse());
}
