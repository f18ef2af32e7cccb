//! The decoding engine of `relation serve`: one thread that owns the model and a
//! [`DecodeBatch`], fed by a bounded queue of jobs, answering each job on its own channel.
//!
//! Between two decoding steps the engine takes waiting jobs: scoring jobs (a prompt's
//! log-likelihoods, for `echo`) run at once, one forward pass each; generation jobs join the
//! batch while it has room (continuous batching). A job whose reader has gone away (its client
//! disconnected, or a stop string ended it) leaves the batch at the next token.

use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use burn::tensor::{DType, Int, Tensor, TensorData};
use relation_model::batch::log_probs;
use relation_model::{DecodeBatch, Finish, Next, RelationLm, Request};
use tokio::sync::mpsc::UnboundedSender;

/// What a job asks for.
#[derive(Debug)]
pub enum Work {
    /// Continue a prompt.
    Generate(Request),
    /// The log-probability of every prompt token after the first (and the top alternatives),
    /// one forward pass over the prompt.
    Score {
        /// Token ids, at least one.
        tokens: Vec<u32>,
        /// Alternatives per position.
        top: usize,
    },
}

/// A token's log-probability and the most likely alternatives with theirs, most likely first.
pub type Scored = (f32, Vec<(u32, f32)>);

/// One answer to a job, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A drawn token.
    Token {
        /// The token.
        token: u32,
        /// Its log-probability under the model, if the request asked for it.
        logprob: Option<f32>,
        /// The most likely alternatives, most likely first.
        top: Vec<(u32, f32)>,
    },
    /// The prompt's scores: per position after the first, the token's log-probability and the
    /// alternatives.
    Scores(Vec<Scored>),
    /// The job is over.
    Done(Finish),
    /// The job failed (a model error).
    Failed(String),
}

/// A job and where its answers go.
#[derive(Debug)]
pub struct Job {
    /// What to do.
    pub work: Work,
    /// Its answers; dropping the receiving end cancels the job.
    pub events: UnboundedSender<Event>,
}

/// The handle of the engine thread: submit jobs, then [`Engine::shut_down`].
#[derive(Debug)]
pub struct Engine {
    queue: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue holds as many waiting jobs as it may.
    Full,
    /// The engine has stopped (shutting down, or it failed).
    Stopped,
}

impl Engine {
    /// Starts the engine thread with `model`: at most `max_batch` sequences decode together and
    /// at most `queue` jobs wait.
    pub fn start(
        model: RelationLm,
        max_batch: usize,
        queue: usize,
        cache_dtype: Option<DType>,
    ) -> Self {
        let (sender, receiver) = sync_channel::<Job>(queue.max(1));
        let thread = std::thread::Builder::new()
            .name("relation-engine".into())
            .spawn(move || run(&model, max_batch, cache_dtype, &receiver))
            .expect("the engine thread starts");
        Self {
            queue: Some(sender),
            thread: Some(thread),
        }
    }

    /// Queues a job without waiting.
    ///
    /// # Errors
    /// [`Refused::Full`] when `queue` jobs are waiting; [`Refused::Stopped`] after shutdown.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        let queue = self.queue.as_ref().ok_or(Refused::Stopped)?;
        queue.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => Refused::Full,
            TrySendError::Disconnected(_) => Refused::Stopped,
        })
    }

    /// Closes the queue and waits until every job taken has finished.
    pub fn shut_down(&mut self) {
        self.queue = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The engine loop: until the queue is closed and the batch is empty.
fn run(model: &RelationLm, max_batch: usize, cache_dtype: Option<DType>, queue: &Receiver<Job>) {
    let mut batch = DecodeBatch::new(model, max_batch);
    if cache_dtype.is_some() {
        // A float dtype from the command line: `with_cache_dtype` cannot refuse it.
        batch = match batch.with_cache_dtype(cache_dtype) {
            Ok(batch) => batch,
            Err(e) => {
                tracing::error!("engine: {e}");
                return;
            }
        };
    }
    let mut readers: Vec<(u64, UnboundedSender<Event>)> = Vec::new();
    let mut next_id = 0u64;
    let mut closed = false;
    loop {
        // Take waiting jobs: block when there is nothing to decode, else only what is there.
        let mut joining = Vec::new();
        while !closed && batch.room() > joining.len() {
            let job = if batch.is_empty() && joining.is_empty() {
                match queue.recv_timeout(Duration::from_millis(200)) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            } else {
                match queue.try_recv() {
                    Ok(job) => job,
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            };
            match job.work {
                Work::Score { tokens, top } => {
                    let event = match score(model, &tokens, top) {
                        Ok(scores) => Event::Scores(scores),
                        Err(e) => Event::Failed(e),
                    };
                    let _ = job.events.send(event);
                }
                Work::Generate(mut request) => {
                    request.id = next_id;
                    next_id += 1;
                    readers.push((request.id, job.events));
                    joining.push(request);
                }
            }
        }
        if !joining.is_empty() {
            let ids: Vec<u64> = joining.iter().map(|r| r.id).collect();
            if let Err(e) = batch.admit(joining) {
                fail(&mut readers, &ids, &e.to_string());
            }
            // Requests of zero new tokens never join the batch: they are done.
            let zero: Vec<u64> = ids
                .iter()
                .copied()
                .filter(|id| !batch.contains(*id))
                .collect();
            for id in zero {
                finish(&mut readers, id, Finish::Length);
            }
        }
        if batch.is_empty() {
            if closed {
                return;
            }
            continue;
        }
        let started = Instant::now();
        let result = batch.step(&mut |drawn| {
            let Some((_, reader)) = readers.iter().find(|(id, _)| *id == drawn.id) else {
                return Next::End;
            };
            let event = Event::Token {
                token: drawn.token,
                logprob: drawn.logprob,
                top: drawn.top,
            };
            if reader.send(event).is_ok() {
                Next::Continue
            } else {
                Next::End // nobody reads this sequence any more
            }
        });
        tracing::trace!(
            sequences = batch.len(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "step"
        );
        match result {
            Ok(done) => {
                for (id, why) in done {
                    finish(&mut readers, id, why);
                }
            }
            Err(e) => {
                let ids: Vec<u64> = readers.iter().map(|(id, _)| *id).collect();
                fail(&mut readers, &ids, &e.to_string());
            }
        }
    }
}

/// Sends `Done(why)` to sequence `id`'s reader and forgets it.
fn finish(readers: &mut Vec<(u64, UnboundedSender<Event>)>, id: u64, why: Finish) {
    if let Some(at) = readers.iter().position(|(r, _)| *r == id) {
        let (_, reader) = readers.remove(at);
        let _ = reader.send(Event::Done(why));
    }
}

/// Sends `Failed(message)` to each of `ids` and forgets them.
fn fail(readers: &mut Vec<(u64, UnboundedSender<Event>)>, ids: &[u64], message: &str) {
    readers.retain(|(id, reader)| {
        if ids.contains(id) {
            let _ = reader.send(Event::Failed(message.to_string()));
            false
        } else {
            true
        }
    });
}

/// The log-probability of each token of `tokens` after the first given those before it, and
/// the `top` most likely alternatives at each position: one forward pass.
fn score(model: &RelationLm, tokens: &[u32], top: usize) -> Result<Vec<Scored>, String> {
    let n = tokens.len();
    if n < 2 {
        return Ok(Vec::new());
    }
    let device = model.embedding.weight.val().device();
    let ids: Vec<i64> = tokens[..n - 1].iter().map(|&t| t as i64).collect();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n - 1]), &device);
    let logits = model.forward(input).map_err(|e| e.to_string())?; // [1, n - 1, V]
    let vocab = model.vocab_size();
    let values: Vec<f32> = logits.into_data().iter::<f32>().collect();
    Ok(values
        .chunks(vocab)
        .zip(&tokens[1..])
        .map(|(row, &t)| log_probs(row, t, top))
        .collect())
}
