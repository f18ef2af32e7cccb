//! `relation`: train, evaluate and sample from Relation language models.

use clap::Parser;
use relation_train::cli::{Cli, run};

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
