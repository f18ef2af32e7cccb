//! `POST /v1/completions`: the request read and checked against the context, its jobs queued
//! on the engine, and the answer built from the engine's events, whole or as server-sent events.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use relation_model::{Finish, Request, Sampling};
use serde_json::{Value, json};
use tokenizers::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::api::{self, ApiError, Completion};
use super::engine::{Event, Job, Refused, Scored, Work};
use super::{Shared, error_response};
use crate::cli::unix_seconds;
use crate::data;

/// One choice to produce: which prompt, its tokens, its seed.
struct Choice {
    index: usize,
    prompt: String,
    tokens: Vec<u32>,
    seed: u64,
}

/// A choice's answer channels: its scores (echo + logprobs) and its generated tokens.
struct Pending {
    choice: Choice,
    scores: Option<UnboundedReceiver<Event>>,
    tokens: Option<UnboundedReceiver<Event>>,
}

pub(super) async fn completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let started = Instant::now();
    match start(&shared, &body) {
        Ok((request, pending)) => {
            if request.stream {
                stream_response(shared, request, pending, started)
            } else {
                complete_response(&shared, &request, pending, started).await
            }
        }
        Err(e) => {
            tracing::info!(status = e.status.as_u16(), error = %e.message, "completion refused");
            error_response(&e)
        }
    }
}

/// Reads the request, checks it against the context and queues its jobs.
fn start(
    shared: &Shared,
    body: &[u8],
) -> std::result::Result<(Completion, Vec<Pending>), ApiError> {
    let request = api::parse(body, shared.limits)?;
    if let Some(name) = &request.model
        && name != &shared.model
    {
        return Err(ApiError::invalid(
            "model",
            format!(
                "no model named {name:?}: this server serves {:?}",
                shared.model
            ),
        ));
    }
    let mut choices = Vec::new();
    let base_seed = request.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    for (p, prompt) in request.prompts.iter().enumerate() {
        let tokens = data::encode(&shared.tokenizer, prompt).map_err(|e| {
            ApiError::invalid("prompt", format!("the prompt cannot be encoded: {e}"))
        })?;
        if tokens.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                "the prompt must encode to at least one token",
            ));
        }
        if tokens.len() + request.max_tokens > shared.context {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "this model's context is {} tokens, but {} were requested ({} in the prompt, {} for the completion)",
                    shared.context,
                    tokens.len() + request.max_tokens,
                    tokens.len(),
                    request.max_tokens
                ),
            ));
        }
        for i in 0..request.n {
            choices.push(Choice {
                index: p * request.n + i,
                prompt: prompt.clone(),
                tokens: tokens.clone(),
                seed: base_seed.wrapping_add(i as u64),
            });
        }
    }
    let mut pending = Vec::new();
    for choice in choices {
        let scores = if request.echo && request.logprobs.is_some() {
            let (events, receiver) = unbounded_channel();
            let work = Work::Score {
                tokens: choice.tokens.clone(),
                top: request.logprobs.unwrap_or(0),
            };
            submit(shared, Job { work, events })?;
            Some(receiver)
        } else {
            None
        };
        let tokens = if request.max_tokens > 0 {
            let (events, receiver) = unbounded_channel();
            let sampling = Sampling {
                max_new_tokens: request.max_tokens,
                temperature: request.temperature,
                top_k: request.top_k,
                top_p: (request.top_p < 1.0).then_some(request.top_p),
                seed: choice.seed,
                stop_tokens: if request.ignore_eos {
                    Vec::new()
                } else {
                    shared.end_of_text.into_iter().collect()
                },
            };
            let work = Work::Generate(Request {
                id: 0,
                prompt: choice.tokens.clone(),
                sampling,
                logprobs: request.logprobs,
            });
            submit(shared, Job { work, events })?;
            Some(receiver)
        } else {
            None
        };
        pending.push(Pending {
            choice,
            scores,
            tokens,
        });
    }
    Ok((request, pending))
}

fn submit(shared: &Shared, job: Job) -> std::result::Result<(), ApiError> {
    shared.engine.submit(job).map_err(|e| match e {
        Refused::Full => ApiError::status(
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests are waiting (the server's --queue limit); retry later",
        ),
        Refused::Stopped => {
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
        }
    })
}

/// A choice's text and log-probabilities as they are built.
struct ChoiceText<'t> {
    text: crate::sample::ContinuationText<'t>,
    /// `tokens`, `token_logprobs`, `top_logprobs`, `text_offset` of the OpenAI `logprobs` object.
    tokens: Vec<String>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    /// Characters of text before the continuation (the prompt when echoed).
    offset: usize,
    generated: usize,
}

impl<'t> ChoiceText<'t> {
    fn new(tokenizer: &'t Tokenizer, stops: &[String]) -> Self {
        Self {
            text: crate::sample::ContinuationText::new(tokenizer, stops),
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
            offset: 0,
            generated: 0,
        }
    }

    /// One token's entry of the `logprobs` object (`logprob` `None` for the first prompt
    /// token); returns the token's text length in characters.
    fn record(
        &mut self,
        tokenizer: &Tokenizer,
        token: u32,
        logprob: Option<f32>,
        top: &[(u32, f32)],
        at: usize,
    ) -> usize {
        let piece = |t: u32| data::decode(tokenizer, &[t]).unwrap_or_default();
        let text = piece(token);
        let chars = text.chars().count();
        self.tokens.push(text);
        self.token_logprobs
            .push(logprob.map_or(Value::Null, |l| json!(l)));
        self.top_logprobs.push(if logprob.is_none() {
            Value::Null
        } else {
            let mut map = serde_json::Map::new();
            for &(t, l) in top {
                map.insert(piece(t), json!(l));
            }
            Value::Object(map)
        });
        self.text_offset.push(at);
        chars
    }

    /// The `logprobs` object of the last token recorded alone (a streamed chunk's).
    fn last_logprobs(&self) -> Value {
        let last = |v: &[Value]| v.last().cloned().map_or(vec![], |x| vec![x]);
        json!({
            "tokens": self.tokens.last().map_or(vec![], |t| vec![t.clone()]),
            "token_logprobs": last(&self.token_logprobs),
            "top_logprobs": last(&self.top_logprobs),
            "text_offset": self.text_offset.last().map_or(vec![], |&o| vec![o]),
        })
    }

    fn logprobs(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

/// Echo: the prompt's tokens with their scores (the first without one).
fn echo_prompt(
    shared: &Shared,
    choice: &Choice,
    scores: Option<Vec<Scored>>,
    out: &mut ChoiceText<'_>,
    with_logprobs: bool,
) {
    if !with_logprobs {
        out.offset = choice.prompt.chars().count();
        return;
    }
    let scores = scores.unwrap_or_default();
    let mut at = 0;
    for (i, &token) in choice.tokens.iter().enumerate() {
        let (logprob, top) = match i.checked_sub(1).and_then(|j| scores.get(j)) {
            Some((l, top)) => (Some(*l), top.as_slice()),
            None => (None, &[][..]),
        };
        at += out.record(&shared.tokenizer, token, logprob, top, at);
    }
    out.offset = choice.prompt.chars().count();
}

fn finish_reason(finish: Option<Finish>, stopped: bool) -> &'static str {
    if stopped {
        return "stop";
    }
    match finish {
        Some(Finish::Stop) => "stop",
        Some(Finish::Length) | None => "length",
    }
}

/// Waits for a job's scores.
async fn scores_of(
    receiver: Option<UnboundedReceiver<Event>>,
) -> std::result::Result<Option<Vec<Scored>>, ApiError> {
    let Some(mut receiver) = receiver else {
        return Ok(None);
    };
    match receiver.recv().await {
        Some(Event::Scores(s)) => Ok(Some(s)),
        Some(Event::Failed(e)) => Err(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e)),
        _ => Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is stopping",
        )),
    }
}

/// How a choice's generation ended.
#[derive(Default)]
struct Ended {
    /// The engine's reason, if it gave one.
    finish: Option<Finish>,
    /// A stop string ended it.
    stopped: bool,
    /// The reader went away (a streaming client disconnected).
    gone: bool,
}

/// Reads a choice's tokens until it ends: each goes into `out` (the text, and its
/// log-probabilities when the request asks), and `on_piece(text that became final, this token's
/// logprobs object or null)` is called for every token that adds text or has log-probabilities;
/// `on_piece` returning `false` (the client went away) ends the choice. Returning ends the
/// sequence in the engine too (its receiver is dropped).
async fn read_tokens(
    shared: &Shared,
    request: &Completion,
    receiver: &mut UnboundedReceiver<Event>,
    out: &mut ChoiceText<'_>,
    first_token: &mut Option<f64>,
    started: Instant,
    on_piece: &mut (dyn FnMut(&str, Value) -> bool + Send),
) -> std::result::Result<Ended, ApiError> {
    let ended = |finish, stopped, gone| Ended {
        finish,
        stopped,
        gone,
    };
    while let Some(event) = receiver.recv().await {
        match event {
            Event::Token {
                token,
                logprob,
                top,
            } => {
                first_token.get_or_insert_with(|| started.elapsed().as_secs_f64());
                out.generated += 1;
                let before = out.text.text().chars().count();
                let (piece, stop) = out.text.push(token).map_err(|e| {
                    ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                })?;
                if stop {
                    let gone = !piece.is_empty() && !on_piece(&piece, Value::Null);
                    return Ok(ended(None, true, gone));
                }
                let logprobs = if request.logprobs.is_some() {
                    let at = out.offset + before;
                    out.record(&shared.tokenizer, token, logprob, &top, at);
                    out.last_logprobs()
                } else {
                    Value::Null
                };
                if (!piece.is_empty() || request.logprobs.is_some()) && !on_piece(&piece, logprobs)
                {
                    return Ok(ended(None, false, true));
                }
            }
            Event::Done(why) => return Ok(ended(Some(why), false, false)),
            Event::Failed(e) => {
                return Err(ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, e));
            }
            Event::Scores(_) => {}
        }
    }
    Ok(ended(None, false, false))
}

/// The whole answer at once.
async fn complete_response(
    shared: &Shared,
    request: &Completion,
    pending: Vec<Pending>,
    started: Instant,
) -> Response {
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    let mut first_token: Option<f64> = None;
    for p in pending {
        prompt_tokens += p.choice.tokens.len();
        let mut out = ChoiceText::new(&shared.tokenizer, &request.stop);
        let scores = match scores_of(p.scores).await {
            Ok(s) => s,
            Err(e) => return error_response(&e),
        };
        if request.echo {
            echo_prompt(
                shared,
                &p.choice,
                scores,
                &mut out,
                request.logprobs.is_some(),
            );
        }
        let mut ended = Ended::default();
        if let Some(mut receiver) = p.tokens {
            let mut keep_all = |_: &str, _: Value| true;
            let read = read_tokens(
                shared,
                request,
                &mut receiver,
                &mut out,
                &mut first_token,
                started,
                &mut keep_all,
            );
            ended = match read.await {
                Ok(ended) => ended,
                Err(e) => return error_response(&e),
            };
        }
        completion_tokens += out.generated;
        let continuation = out.text.text().to_string();
        let text = if request.echo {
            format!("{}{continuation}", p.choice.prompt)
        } else {
            continuation
        };
        choices.push(json!({
            "text": text,
            "index": p.choice.index,
            "logprobs": if request.logprobs.is_some() { out.logprobs() } else { Value::Null },
            "finish_reason": finish_reason(ended.finish, ended.stopped),
        }));
    }
    log_request(
        prompt_tokens,
        completion_tokens,
        first_token,
        started,
        false,
    );
    axum::Json(json!({
        "id": completion_id(),
        "object": "text_completion",
        "created": unix_seconds(),
        "model": shared.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }))
    .into_response()
}

fn completion_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cmpl-{nanos:x}")
}

fn log_request(
    prompt: usize,
    completion: usize,
    first: Option<f64>,
    started: Instant,
    stream: bool,
) {
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        prompt_tokens = prompt,
        completion_tokens = completion,
        ttft_ms = first.map_or(0.0, |s| (s * 1e4).round() / 10.0),
        tokens_per_s = ((completion as f64 / seconds.max(1e-9)) * 10.0).round() / 10.0,
        seconds = (seconds * 1e3).round() / 1e3,
        stream,
        "completion"
    );
}

/// The answer as server-sent events: one chunk per piece of text, a last chunk per choice with
/// its `finish_reason`, then `[DONE]`. Choices are streamed one after another.
fn stream_response(
    shared: Arc<Shared>,
    request: Completion,
    pending: Vec<Pending>,
    started: Instant,
) -> Response {
    let (sender, receiver) =
        unbounded_channel::<std::result::Result<SseEvent, std::convert::Infallible>>();
    tokio::spawn(async move {
        let id = completion_id();
        let created = unix_seconds();
        let chunk = |index: usize, text: &str, logprobs: Value, finish: Value| {
            let body = json!({
                "id": id,
                "object": "text_completion",
                "created": created,
                "model": shared.model,
                "choices": [{"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}],
            });
            Ok(SseEvent::default().data(body.to_string()))
        };
        let (mut prompt_tokens, mut completion_tokens) = (0, 0);
        let mut first_token = None;
        for p in pending {
            prompt_tokens += p.choice.tokens.len();
            let mut out = ChoiceText::new(&shared.tokenizer, &request.stop);
            let scores = match scores_of(p.scores).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = sender.send(Ok(SseEvent::default().data(e.body().to_string())));
                    break;
                }
            };
            if request.echo {
                echo_prompt(
                    &shared,
                    &p.choice,
                    scores,
                    &mut out,
                    request.logprobs.is_some(),
                );
                let logprobs = if request.logprobs.is_some() {
                    out.logprobs()
                } else {
                    Value::Null
                };
                if sender
                    .send(chunk(
                        p.choice.index,
                        &p.choice.prompt,
                        logprobs,
                        Value::Null,
                    ))
                    .is_err()
                {
                    break;
                }
            }
            let mut ended = Ended::default();
            if let Some(mut receiver) = p.tokens {
                let index = p.choice.index;
                let mut send = |piece: &str, logprobs: Value| {
                    sender
                        .send(chunk(index, piece, logprobs, Value::Null))
                        .is_ok()
                };
                let read = read_tokens(
                    &shared,
                    &request,
                    &mut receiver,
                    &mut out,
                    &mut first_token,
                    started,
                    &mut send,
                );
                match read.await {
                    Ok(e) if e.gone => break, // the client went away
                    Ok(e) => ended = e,
                    Err(e) => {
                        let _ = sender.send(Ok(SseEvent::default().data(e.body().to_string())));
                        break;
                    }
                }
            }
            completion_tokens += out.generated;
            let rest = out.text.finish();
            let reason = finish_reason(ended.finish, ended.stopped);
            if sender
                .send(chunk(p.choice.index, &rest, Value::Null, json!(reason)))
                .is_err()
            {
                break;
            }
        }
        let _ = sender.send(Ok(SseEvent::default().data("[DONE]")));
        log_request(prompt_tokens, completion_tokens, first_token, started, true);
    });
    let stream = tokio_stream(receiver);
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A receiver as a stream of events.
fn tokio_stream<T: Send + 'static>(
    mut receiver: UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}
