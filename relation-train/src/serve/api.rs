//! The request body of `POST /v1/completions`, read field by field into typed settings with an
//! error that names the field, the value and the rule; and the error body every refusal sends.

use axum::http::StatusCode;
use serde_json::{Map, Value, json};

/// A refusal: its HTTP status and the OpenAI-style error body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// 400, 404, 405, 429, 500 or 503.
    pub status: StatusCode,
    /// What went wrong, naming the value and the limit.
    pub message: String,
    /// The request field at fault, if one.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
        }
    }

    /// Any status, no field.
    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        let kind = match self.status.as_u16() {
            400 | 404 | 405 => "invalid_request_error",
            429 => "rate_limit_error",
            503 => "unavailable",
            _ => "server_error",
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

/// The settings of one completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// One or more prompts.
    pub prompts: Vec<String>,
    /// Tokens to generate per choice (default 16).
    pub max_tokens: usize,
    /// Softmax temperature (default 1; 0 = greedy).
    pub temperature: f64,
    /// Nucleus cut (default 1 = none).
    pub top_p: f64,
    /// Keep the k most likely tokens (default: all; an extension).
    pub top_k: Option<usize>,
    /// Stop strings (at most 4).
    pub stop: Vec<String>,
    /// Seed of choice 0 (choice `i` uses `seed + i`); `None`: drawn by the server.
    pub seed: Option<u64>,
    /// Choices per prompt.
    pub n: usize,
    /// Alternatives reported per token (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
    /// Return the prompt before the completion (with its log-probabilities if asked).
    pub echo: bool,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// Keep decoding past the end-of-text token, to exactly `max_tokens` (an extension, for
    /// benchmarks; default false).
    pub ignore_eos: bool,
    /// The model named in the request, if any.
    pub model: Option<String>,
}

/// Limits of the server that bound what a request may ask.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most choices per request (`n` times the number of prompts).
    pub max_choices: usize,
    /// Most alternatives per token.
    pub max_logprobs: usize,
}

/// Reads a request body.
///
/// # Errors
/// A 400 naming the field for malformed JSON, a missing prompt, a value of the wrong type or
/// out of range, or an option this server does not implement with a non-default value.
pub fn parse(body: &[u8], limits: Limits) -> Result<Completion, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::status(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {e}"),
        )
    })?;
    let Value::Object(fields) = value else {
        return Err(ApiError::status(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        ));
    };
    let f = Fields(&fields);
    let prompts = match fields.get("prompt") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("prompt", "`prompt` is required"));
        }
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::invalid(
                    "prompt",
                    format!("`prompt` must be a string or an array of strings; found {other} in the array"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("`prompt` must be a string or a non-empty array of strings, got {other}"),
            ));
        }
    };
    let max_tokens = f.uint("max_tokens")?.unwrap_or(16);
    let temperature = f.number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("`temperature` must be in [0, 2], got {temperature}"),
        ));
    }
    let top_p = f.number("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("`top_p` must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match f.uint("top_k")? {
        Some(0) | None => None,
        Some(k) => Some(k),
    };
    let stop = match fields.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::invalid(
                    "stop",
                    format!("`stop` must be a string or an array of strings; found {other}"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` must be a string or an array of strings, got {other}"),
            ));
        }
    };
    if stop.len() > 4 {
        return Err(ApiError::invalid(
            "stop",
            format!("`stop` takes at most 4 strings, got {}", stop.len()),
        ));
    }
    let seed = match fields.get("seed") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
        Some(Value::Number(n)) if n.as_i64().is_some() => Some(n.as_i64().unwrap_or(0) as u64),
        Some(other) => {
            return Err(ApiError::invalid(
                "seed",
                format!("`seed` must be an integer, got {other}"),
            ));
        }
    };
    let n = f.uint("n")?.unwrap_or(1);
    if n == 0 {
        return Err(ApiError::invalid("n", "`n` must be at least 1"));
    }
    let choices = n.saturating_mul(prompts.len());
    if choices > limits.max_choices {
        return Err(ApiError::invalid(
            "n",
            format!(
                "{choices} choices ({} prompts x n = {n}) exceed this server's limit of {} per request",
                prompts.len(),
                limits.max_choices
            ),
        ));
    }
    let logprobs = f.uint("logprobs")?;
    if let Some(k) = logprobs
        && k > limits.max_logprobs
    {
        return Err(ApiError::invalid(
            "logprobs",
            format!(
                "`logprobs` must be at most {}, got {k}",
                limits.max_logprobs
            ),
        ));
    }
    let echo = f.boolean("echo")?.unwrap_or(false);
    let stream = f.boolean("stream")?.unwrap_or(false);
    let ignore_eos = f.boolean("ignore_eos")?.unwrap_or(false);
    if let Some(best_of) = f.uint("best_of")?
        && best_of != n
        && best_of != 1
    {
        return Err(ApiError::invalid(
            "best_of",
            format!("`best_of` other than `n` is not supported by this server, got {best_of}"),
        ));
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = f.number(name)?
            && v != 0.0
        {
            return Err(ApiError::invalid(
                name,
                format!("`{name}` is not supported by this server (only 0), got {v}"),
            ));
        }
    }
    if let Some(v) = fields.get("logit_bias")
        && !(v.is_null() || v.as_object().is_some_and(Map::is_empty))
    {
        return Err(ApiError::invalid(
            "logit_bias",
            "`logit_bias` is not supported by this server",
        ));
    }
    if let Some(Value::String(s)) = fields.get("suffix")
        && !s.is_empty()
    {
        return Err(ApiError::invalid(
            "suffix",
            "`suffix` (insertion) is not supported by this server",
        ));
    }
    let model = match fields.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(ApiError::invalid(
                "model",
                format!("`model` must be a string, got {other}"),
            ));
        }
    };
    Ok(Completion {
        prompts,
        max_tokens,
        temperature,
        top_p,
        top_k,
        stop,
        seed,
        n,
        logprobs,
        echo,
        stream,
        ignore_eos,
        model,
    })
}

/// Typed reads of optional fields (`null` is absent).
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn uint(&self, name: &'static str) -> Result<Option<usize>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    ApiError::invalid(
                        name,
                        format!("`{name}` must be a non-negative integer, got {v}"),
                    )
                }),
        }
    }

    fn number(&self, name: &'static str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    ApiError::invalid(name, format!("`{name}` must be a number, got {v}"))
                }),
        }
    }

    fn boolean(&self, name: &'static str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                ApiError::invalid(name, format!("`{name}` must be true or false, got {v}"))
            }),
        }
    }
}
