//! `relation`: train, evaluate and sample from Relation language models.

use clap::Parser;
use relation_train::cli::{Cli, Command, run};
use relation_train::keep_freed_memory;

fn main() {
    // Before any other thread exists: see `keep_freed_memory` for why and what it costs.
    keep_freed_memory();
    let cli = Cli::parse();
    // The server logs one line per request unless told otherwise.
    init_tracing(matches!(cli.command, Command::Serve(_)).then_some("relation_train=info"));
    if let Err(e) = run(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Sends `tracing` events to stderr, filtered by `RUST_LOG` (e.g.
/// `RUST_LOG=relation_train=debug`), else by `default` if given. Without either nothing is
/// installed, so the command's output is exactly what it is without tracing; a `RUST_LOG` that
/// does not parse is reported and ignored rather than failing the command.
fn init_tracing(default: Option<&str>) {
    let filter = match (std::env::var_os("RUST_LOG"), default) {
        (None, None) => return,
        (None, Some(default)) => Ok(tracing_subscriber::EnvFilter::new(default)),
        (Some(_), _) => tracing_subscriber::EnvFilter::try_from_default_env(),
    };
    match filter {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Plain text even when another crate of the build (burn-train) turns on
            // tracing-subscriber's `ansi` feature: logs are read by programs and files too.
            .with_ansi(false)
            .init(),
        Err(e) => eprintln!("warning: RUST_LOG ignored ({e})"),
    }
}
