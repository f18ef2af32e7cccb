//! FlashRelation benchmark: see [`relation_examples::bench::flash`] for what it measures.
//!
//! ```text
//! cargo run --release -p relation-examples --example flash_relation_bench [--features wgpu] -- --help
//! ```

use clap::Parser;
use relation_examples::bench::flash::{Args, run};
use relation_examples::counting::Counting;

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() {
    run(&Args::parse());
}
