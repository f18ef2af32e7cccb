//! `relation serve` end to end over HTTP on localhost: the completions API against `relation
//! generate` and `relation eval --per-token`, streaming, concurrency, every refusal with its
//! status, the queue limit, and SIGTERM finishing what is in flight. The server runs on a free
//! port and every test stops it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use relation_train::serve::api::{Limits, parse};
use serde_json::{Value, json};

use crate::common::*;

/// A running `relation serve`; killed when dropped.
struct Server {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(run: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_relation"))
            .args(["serve", "--run-dir", run.to_str().unwrap(), "--port", "0"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(120);
        let port = loop {
            let line = lines
                .next()
                .expect("the server prints its address")
                .unwrap();
            if let Some(rest) = line.split("http://127.0.0.1:").nth(1) {
                break rest.split(' ').next().unwrap().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "no address printed");
        };
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        Self { child, port, log }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
    }

    /// Sends a request; returns the open connection.
    fn send(&self, method: &str, path: &str, body: &str) -> TcpStream {
        let mut stream = self.connect();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        stream
    }

    /// Status and body (de-chunked) of one request.
    fn call(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut raw = Vec::new();
        self.send(method, path, body).read_to_end(&mut raw).unwrap();
        response(&raw)
    }

    fn post(&self, body: &Value) -> (u16, Value) {
        let (status, text) = self.call("POST", "/v1/completions", &body.to_string());
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status and body of a raw HTTP/1.1 response (chunked transfer decoded).
fn response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, body.to_string());
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    (status, out)
}

/// The `data:` payloads of a server-sent event stream.
fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

fn completion(prompt: &str, max_tokens: usize) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
}

#[test]
fn the_completions_api_answers_like_generate_and_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let run = sat_run(tmp.path());
    let server = Server::start(&run, &["--max-batch", "8"]);

    let (status, body) = server.call("GET", "/health", "");
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, body) = server.call("GET", "/v1/models", "");
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "run");
    assert_eq!(models["data"][0]["max_context"], 32);

    // Greedy: the same continuation as `relation generate`, stopped by end-of-text.
    let generate = ok(&[
        "generate".into(),
        "--run-dir".into(),
        run.to_str().unwrap().into(),
        "--temperature".into(),
        "0".into(),
        "--prompt".into(),
        "the owl".into(),
        "--max-new-tokens".into(),
        "20".into(),
    ]);
    let (status, answer) = server.post(&completion("the owl", 20));
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    assert_eq!(
        format!("the owl{}\n", choice["text"].as_str().unwrap()),
        generate
    );
    assert_eq!(choice["text"], " sat on the mat.");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(answer["object"], "text_completion");
    let usage = &answer["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        )
    );
    // A stop string; a length limit; echo; n choices and several prompts.
    let (_, a) = server.post(&json!({"prompt": "the owl", "temperature": 0, "stop": [" on"]}));
    assert_eq!(
        (&a["choices"][0]["text"], &a["choices"][0]["finish_reason"]),
        (&json!(" sat"), &json!("stop"))
    );
    let (_, a) = server.post(&completion("the owl", 1));
    assert_eq!(
        (&a["choices"][0]["text"], &a["choices"][0]["finish_reason"]),
        (&json!(" sat"), &json!("length"))
    );
    let (_, a) = server.post(&json!({"prompt": "the owl", "temperature": 0, "echo": true}));
    assert_eq!(a["choices"][0]["text"], "the owl sat on the mat.");
    let (_, a) = server.post(&json!({"prompt": ["the owl", "the dog"], "n": 2, "temperature": 0}));
    let texts: Vec<&str> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, [" sat on the mat."; 4]);
    let indices: Vec<u64> = a["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    // A seed gives the same sample twice; ignore_eos decodes to exactly max_tokens.
    let sample = json!({"prompt": "the", "max_tokens": 12, "temperature": 1.0, "seed": 3, "ignore_eos": true});
    let (_, one) = server.post(&sample);
    let (_, two) = server.post(&sample);
    assert_eq!(one["choices"], two["choices"]);
    assert_eq!(one["usage"]["completion_tokens"], 12);

    // Streaming: the same text in pieces, a last chunk with the finish reason, then [DONE].
    let (status, body) = server.call(
        "POST",
        "/v1/completions",
        &json!({"prompt": "the owl", "max_tokens": 20, "temperature": 0, "stream": true})
            .to_string(),
    );
    assert_eq!(status, 200);
    let payloads = events(&body);
    assert_eq!(
        payloads.last().map(String::as_str),
        Some("[DONE]"),
        "{body}"
    );
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert!(chunks.len() > 2, "{body}");
    let streamed: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, " sat on the mat.");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );

    // Streamed with log-probabilities: one chunk per token, each with its own entry, the same
    // values as the answer at once.
    let body = json!({"prompt": "the owl", "max_tokens": 20, "temperature": 0, "logprobs": 2});
    let (_, whole) = server.post(&body);
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (_, text) = server.call("POST", "/v1/completions", &streamed_body.to_string());
    let payloads = events(&text);
    let per_token: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap()["choices"][0]["logprobs"].clone())
        .filter(|l| !l.is_null())
        .collect();
    let want = &whole["choices"][0]["logprobs"];
    assert_eq!(per_token.len(), want["tokens"].as_array().unwrap().len());
    for (i, entry) in per_token.iter().enumerate() {
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            assert_eq!(entry[key].as_array().unwrap().len(), 1, "{entry}");
            assert_eq!(entry[key][0], want[key][i], "{key} of token {i}");
        }
    }

    // echo + logprobs + max_tokens 0 scores a text: equal to `relation eval --per-token`.
    let text = "the cat sat on the mat. the dog sat on the mat.";
    let file = tmp.path().join("text.txt");
    std::fs::write(&file, text).unwrap();
    let per_token = tmp.path().join("tokens.jsonl");
    ok(&[
        "eval".into(),
        "--run-dir".into(),
        run.to_str().unwrap().into(),
        "--data".into(),
        file.to_str().unwrap().into(),
        "--packing".into(),
        "windows".into(),
        "--per-token".into(),
        per_token.to_str().unwrap().into(),
    ]);
    let window: Value = serde_json::from_str(
        std::fs::read_to_string(&per_token)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let (_, a) =
        server.post(&json!({"prompt": text, "max_tokens": 0, "echo": true, "logprobs": 2}));
    let logprobs = &a["choices"][0]["logprobs"];
    let served = logprobs["token_logprobs"].as_array().unwrap();
    let want = window["logprobs"].as_array().unwrap();
    assert!(
        served[0].is_null(),
        "the first token has no log-probability"
    );
    let n = served.len() - 1;
    assert!(
        n >= 10 && n <= want.len(),
        "{n} scored tokens, eval has {}",
        want.len()
    );
    for (i, (s, w)) in served[1..].iter().zip(want).enumerate() {
        let (s, w) = (s.as_f64().unwrap(), w.as_f64().unwrap());
        assert!(
            (s - w).abs() < 1e-4,
            "token {}: served {s}, eval {w}",
            i + 1
        );
    }
    let tokens: String = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens, text);
    let top = logprobs["top_logprobs"][1].as_object().unwrap();
    assert_eq!(top.len(), 2);
    assert_eq!(a["choices"][0]["text"], text);
    // Generated tokens' log-probabilities are the model's too: the first generated token after
    // "the owl" has the log-probability that scoring "the owl sat" gives it.
    let (_, g) = server
        .post(&json!({"prompt": "the owl", "max_tokens": 1, "temperature": 0, "logprobs": 1}));
    let (_, s) = server
        .post(&json!({"prompt": "the owl sat", "max_tokens": 0, "echo": true, "logprobs": 0}));
    let generated = g["choices"][0]["logprobs"]["token_logprobs"][0]
        .as_f64()
        .unwrap();
    let scored = s["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_f64()
        .unwrap();
    assert!((generated - scored).abs() < 1e-4, "{generated} vs {scored}");

    // 32 concurrent requests: no error, every greedy answer the same.
    let server = Arc::new(server);
    let handles: Vec<_> = (0..32)
        .map(|i| {
            let server = server.clone();
            std::thread::spawn(move || {
                let prompt = ["the owl", "the dog", "the cat", "the fox"][i % 4];
                let stream = i % 3 == 0;
                let body =
                    json!({"prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": stream});
                let (status, text) = server.call("POST", "/v1/completions", &body.to_string());
                assert_eq!(status, 200, "{text}");
                if stream {
                    let payloads = events(&text);
                    payloads[..payloads.len() - 1]
                        .iter()
                        .map(|p| {
                            serde_json::from_str::<Value>(p).unwrap()["choices"][0]["text"]
                                .as_str()
                                .unwrap()
                                .to_string()
                        })
                        .collect::<String>()
                } else {
                    serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["text"]
                        .as_str()
                        .unwrap()
                        .to_string()
                }
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), " sat on the mat.");
    }
    let log = server.log.lock().unwrap().clone();
    let lines = log
        .lines()
        .filter(|l| l.contains("completion_tokens="))
        .count();
    assert!(lines >= 32, "one log line per request:\n{log}");
    assert!(
        log.contains("prompt_tokens=") && log.contains("ttft_ms="),
        "{log}"
    );
}

#[test]
fn bad_requests_get_their_status_and_the_server_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let run = sat_run(tmp.path());
    let server = Server::start(
        &run,
        &["--max-batch", "1", "--queue", "1", "--max-context", "4096"],
    );
    let refused = |status: u16, body: &str, needle: &str| {
        assert_eq!(
            {
                let (s, text) = server.call("POST", "/v1/completions", body);
                let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"));
                let message = v["error"]["message"].as_str().unwrap().to_string();
                assert!(message.contains(needle), "{body}: {message}");
                assert_eq!(v["error"]["code"], status);
                s
            },
            status,
            "{body}"
        );
    };
    refused(400, r#"{"prompt": "the owl""#, "not valid JSON");
    refused(400, r#"{"max_tokens": 3}"#, "`prompt` is required");
    refused(
        400,
        r#"{"prompt": "the owl", "temperature": 9}"#,
        "[0, 2], got 9",
    );
    refused(
        400,
        r#"{"prompt": "the owl", "model": "other"}"#,
        "no model named \"other\"",
    );
    let long = "the cat sat on the mat. ".repeat(800);
    refused(
        400,
        &json!({"prompt": long}).to_string(),
        "this model's context is 4096 tokens",
    );
    refused(
        400,
        &json!({"prompt": "the owl", "max_tokens": 5000}).to_string(),
        "this model's context is 4096 tokens",
    );
    let (status, _) = server.call("GET", "/nowhere", "");
    assert_eq!(status, 404);
    let (status, _) = server.call("GET", "/v1/completions", "");
    assert_eq!(status, 405);

    // The queue: one sequence decoding (--max-batch 1), one waiting (--queue 1); of six more
    // requests sent together while the first decodes, one at most is queued and the rest get 429.
    let long_request = json!({"prompt": "the", "max_tokens": 4000, "temperature": 1.0, "ignore_eos": true, "stream": true, "seed": 1});
    let mut first = server.send("POST", "/v1/completions", &long_request.to_string());
    let mut seen = String::new();
    let mut buffer = [0u8; 4096];
    while !seen.contains("data: ") {
        let n = first.read(&mut buffer).unwrap();
        assert!(n > 0, "the stream ended early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    let short = json!({"prompt": "the", "max_tokens": 8, "temperature": 0});
    let others: Vec<TcpStream> = (0..6)
        .map(|_| server.send("POST", "/v1/completions", &short.to_string()))
        .collect();
    let answers: Vec<(u16, String)> = others
        .into_iter()
        .map(|mut stream| {
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).unwrap();
            response(&raw)
        })
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().filter(|&&s| s == 200).count() <= 1,
        "{statuses:?}"
    );
    for (status, body) in &answers {
        if *status == 429 {
            assert!(body.contains("--queue"), "{body}");
        }
    }
    // The first request was not disturbed: it runs to its end.
    let mut rest = Vec::new();
    first.read_to_end(&mut rest).unwrap();
    seen.push_str(&String::from_utf8_lossy(&rest));
    assert!(seen.contains("data: [DONE]") && seen.contains(r#""finish_reason":"length""#));
    let (status, a) = server.post(&completion("the owl", 20));
    assert_eq!(
        (status, &a["choices"][0]["text"]),
        (200, &json!(" sat on the mat."))
    );
}

#[test]
fn sigterm_finishes_what_is_in_flight_then_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let run = sat_run(tmp.path());
    let server = Server::start(&run, &["--max-context", "4096"]);
    let port = server.port;
    let request = json!({"prompt": "the", "max_tokens": 1500, "temperature": 1.0, "ignore_eos": true, "stream": true, "seed": 2});
    let mut stream = server.send("POST", "/v1/completions", &request.to_string());
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = stream.read(&mut buffer).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buffer[..n]);
    }
    let reader = std::thread::spawn(move || {
        stream.read_to_end(&mut seen).unwrap();
        seen
    });
    std::thread::sleep(Duration::from_millis(100));
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
    let (code, body) = response(&reader.join().unwrap());
    assert_eq!(code, 200);
    let payloads = events(&body);
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(
        last["choices"][0]["finish_reason"], "length",
        "the request in flight ran to its end"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "no new connections"
    );
}

#[test]
fn request_fields_are_read_with_named_errors() {
    let limits = Limits {
        max_choices: 8,
        max_logprobs: 5,
    };
    let c = parse(br#"{"prompt": "hi"}"#, limits).unwrap();
    assert_eq!(c.prompts, vec!["hi"]);
    assert_eq!(
        (c.max_tokens, c.temperature, c.top_p, c.n),
        (16, 1.0, 1.0, 1)
    );
    assert_eq!(
        (c.logprobs, c.echo, c.stream, c.seed, c.ignore_eos),
        (None, false, false, None, false)
    );
    let c = parse(
        br#"{"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "temperature": 0,
            "top_p": 0.5, "top_k": 4, "stop": ["x", "y"], "seed": 9, "n": 2,
            "logprobs": 2, "echo": true, "stream": true, "user": "ignored"}"#,
        limits,
    )
    .unwrap();
    assert_eq!(c.prompts, vec!["a", "b"]);
    assert_eq!(
        (c.max_tokens, c.temperature, c.top_p, c.top_k),
        (3, 0.0, 0.5, Some(4))
    );
    assert_eq!(c.stop, vec!["x", "y"]);
    assert_eq!(
        (c.seed, c.n, c.logprobs, c.echo, c.stream),
        (Some(9), 2, Some(2), true, true)
    );
    assert_eq!(c.model.as_deref(), Some("m"));
    for (body, param, text) in [
        (r#"{"prompt": 3}"#, Some("prompt"), "must be a string"),
        (r#"{"prompt": []}"#, Some("prompt"), "non-empty array"),
        (
            r#"{"prompt": "a", "max_tokens": -1}"#,
            Some("max_tokens"),
            "non-negative integer, got -1",
        ),
        (
            r#"{"prompt": "a", "top_p": 0}"#,
            Some("top_p"),
            "(0, 1], got 0",
        ),
        (r#"{"prompt": "a", "n": 0}"#, Some("n"), "at least 1"),
        (r#"{"prompt": ["a", "b"], "n": 5}"#, Some("n"), "limit of 8"),
        (
            r#"{"prompt": "a", "logprobs": 6}"#,
            Some("logprobs"),
            "at most 5, got 6",
        ),
        (
            r#"{"prompt": "a", "stop": [1]}"#,
            Some("stop"),
            "array of strings",
        ),
        (
            r#"{"prompt": "a", "stop": ["a","b","c","d","e"]}"#,
            Some("stop"),
            "at most 4",
        ),
        (
            r#"{"prompt": "a", "echo": "yes"}"#,
            Some("echo"),
            "true or false",
        ),
        (r#"{"prompt": "a", "seed": "x"}"#, Some("seed"), "integer"),
        (
            r#"{"prompt": "a", "frequency_penalty": 1}"#,
            Some("frequency_penalty"),
            "not supported",
        ),
        (r#"[1]"#, None, "JSON object"),
    ] {
        let e = parse(body.as_bytes(), limits).unwrap_err();
        assert_eq!(e.status.as_u16(), 400, "{body}");
        assert_eq!(e.param, param, "{body}");
        assert!(e.message.contains(text), "{body}: {}", e.message);
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }
}
