//! `relation serve`: a trained model behind the OpenAI-compatible completions API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/completions` | `prompt` (string or array), `max_tokens`, `temperature`, `top_p`, `top_k`, `stop`, `seed`, `n`, `logprobs`, `echo`, `stream` (server-sent events), `ignore_eos` |
//! | `GET /v1/models` | the one model served |
//! | `GET /health` | `{"status": "ok"}` while the engine runs |
//!
//! Requests are decoded together by one engine thread ([`engine`]): continuous batching over a
//! [`relation_model::DecodeBatch`] of at most `--max-batch` sequences, at most `--queue` waiting.
//! A bad request is answered with a JSON error and its status (400 for malformed JSON or
//! fields and for a prompt past the context, 429 when the queue is full); nothing a client sends
//! stops the server or other requests. SIGTERM or Ctrl-C stops accepting connections, lets the
//! requests in flight finish, then exits.

pub mod api;
mod completions;
pub mod engine;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use serde_json::json;
use tokenizers::Tokenizer;

use self::api::{ApiError, Limits};
use self::completions::completions;
use self::engine::Engine;
use crate::cli::{RunSource, unix_seconds};
use crate::data;
use crate::error::io;
use crate::{Result, TrainError};

/// `relation serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The run, and which of its checkpoints (a Hugging Face folder: `relation import` it first).
    #[command(flatten)]
    pub source: RunSource,
    /// Address to listen on (localhost by default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the address is logged on standard error).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The longest prompt plus completion, in tokens (default: the run's train.seq_len).
    #[arg(long, value_name = "TOKENS")]
    pub max_context: Option<usize>,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch (more are answered 429).
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Most choices per request (`n` times the prompts).
    #[arg(long, default_value_t = 16)]
    pub max_choices: usize,
    /// The model's name in the API (default: the run directory's name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// The dtype of the decoding caches (see `relation generate --cache-dtype`).
    #[arg(long, value_enum, default_value_t = crate::cli::CacheDtype::Model)]
    pub cache_dtype: crate::cli::CacheDtype,
    /// Device (default: the run's).
    #[arg(long)]
    pub device: Option<String>,
}

/// What every handler shares.
struct Shared {
    engine: Engine,
    tokenizer: Tokenizer,
    model: String,
    context: usize,
    limits: Limits,
    end_of_text: Option<u32>,
    created: u64,
}

/// Runs `relation serve` until SIGTERM or Ctrl-C.
///
/// # Errors
/// A run that cannot be loaded; a flag out of range; an address that cannot be bound.
pub fn run_serve(args: &ServeArgs) -> Result<()> {
    for (name, value) in [
        ("--max-batch", args.max_batch),
        ("--queue", args.queue),
        ("--max-choices", args.max_choices),
    ] {
        if value == 0 {
            return Err(TrainError::Invalid {
                name,
                value: "0".into(),
                rule: "must be >= 1".into(),
            });
        }
    }
    let run = args.source.load(&args.device)?;
    let context = args.max_context.unwrap_or(run.config.train.seq_len);
    if context < 2 {
        return Err(TrainError::Invalid {
            name: "--max-context",
            value: context.to_string(),
            rule: "must be >= 2 (a prompt token and a new one)".into(),
        });
    }
    let model = args.model_name.clone().unwrap_or_else(|| {
        args.source
            .run_dir
            .canonicalize()
            .unwrap_or_else(|_| args.source.run_dir.clone())
            .file_name()
            .map_or_else(|| "relation".into(), |n| n.to_string_lossy().into_owned())
    });
    let end_of_text = run.tokenizer.token_to_id(data::EOT);
    let shared = Arc::new(Shared {
        engine: Engine::start(
            run.model,
            args.max_batch,
            args.queue,
            args.cache_dtype.dtype(),
        ),
        tokenizer: run.tokenizer,
        model,
        context,
        limits: Limits {
            max_choices: args.max_choices,
            max_logprobs: 5,
        },
        end_of_text,
        created: unix_seconds(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io("the server's runtime"))?;
    let address = format!("{}:{}", args.host, args.port);
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(io(format!("listening on {address}")))?;
        let bound: SocketAddr = listener
            .local_addr()
            .map_err(io(format!("listening on {address}")))?;
        tracing::info!(
            "serving {} on http://{bound} (context {context} tokens, batch {}, queue {}); SIGTERM or Ctrl-C stops",
            shared.model,
            args.max_batch,
            args.queue
        );
        axum::serve(listener, router(shared.clone()))
            .with_graceful_shutdown(stop_signal())
            .await
            .map_err(io(format!("serving on {address}")))
    })?;
    tracing::info!("stopped: every request in flight has finished");
    drop(runtime);
    if let Ok(mut shared) = Arc::try_unwrap(shared) {
        shared.engine.shut_down();
    }
    Ok(())
}

/// The routes.
fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .fallback(|| async {
            error_response(&ApiError::status(
                StatusCode::NOT_FOUND,
                "no such route: this server has POST /v1/completions, GET /v1/models, GET /health",
            ))
        })
        .method_not_allowed_fallback(|| async {
            error_response(&ApiError::status(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            ))
        })
        .with_state(shared)
}

/// SIGTERM or Ctrl-C.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("stopping: no new connections; finishing the requests in flight");
}

fn error_response(error: &ApiError) -> Response {
    (error.status, axum::Json(error.body())).into_response()
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": shared.model,
            "object": "model",
            "created": shared.created,
            "owned_by": "relation",
            "max_context": shared.context,
        }],
    }))
    .into_response()
}
