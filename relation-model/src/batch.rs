//! Batched decoding of different prompts with continuous batching: [`DecodeBatch`].
//!
//! The sequences of a batch keep their own lengths (their caches are ragged: each token sits at
//! its sequence's own position, each attention or Relation row reads its own cached rows), their
//! own sampling settings and their own random stream. A step draws one token for every
//! sequence and runs the model once over the whole batch, so the weights are read once per step
//! for all of them. A sequence that ends leaves the batch between two steps, and a waiting
//! prompt joins it (prefilled on its own, then its cache joined to the others'): nobody waits
//! for the longest sequence to finish.
//!
//! A sequence's tokens depend only on its prompt, its settings and its seed, not on which other
//! sequences share its batch, up to the rounding of the batched products (greedy decoding gives
//! the same tokens whenever the top two logits are not within that rounding of each other).

use std::collections::BTreeMap;

use burn::tensor::{DType, Int, Tensor, TensorData};
use relation_core::rng::SplitMix64;

use crate::cache::LmCache;
use crate::error::{ModelError, Result};
use crate::generate::{PREFILL_CHUNK, Sampling};
use crate::model::RelationLm;

/// A prompt waiting to be decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The caller's name for this sequence, handed back with each of its tokens.
    pub id: u64,
    /// Token ids of the prompt (at least one).
    pub prompt: Vec<u32>,
    /// How its tokens are drawn (its own seed, stop tokens and length).
    pub sampling: Sampling,
    /// Log-probabilities to report with each token: `None` for none (nothing computed),
    /// `Some(k)` for the token's own and the `k` most likely alternatives'.
    pub logprobs: Option<usize>,
}

/// One drawn token.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    /// The request it belongs to.
    pub id: u64,
    /// The token.
    pub token: u32,
    /// Its log-probability under the model (the softmax of the logits at temperature 1, before
    /// any top-k / top-p cut), if the request asked for log-probabilities.
    pub logprob: Option<f32>,
    /// The `k` most likely tokens of [`Request::logprobs`] and their log-probabilities, most
    /// likely first.
    pub top: Vec<(u32, f32)>,
    /// How many tokens the request has drawn, this one included.
    pub index: usize,
}

/// Why a sequence left the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was drawn (it is not handed on), or the caller ended it (a stop string).
    Stop,
    /// `max_new_tokens` were drawn.
    Length,
}

/// What the caller says after each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Keep decoding this sequence.
    Continue,
    /// End it here ([`Finish::Stop`]): a stop string appeared, or its reader went away.
    End,
}

/// A sequence in the batch, at the same index as its row of the cache.
#[derive(Debug)]
struct Row {
    request: Request,
    rng: SplitMix64,
    /// Logits of its next token, `[V]`.
    logits: Vec<f32>,
    /// Tokens drawn so far.
    drawn: usize,
}

/// Sequences decoded together, joining and leaving between steps (continuous batching).
///
/// ```text
/// let mut batch = DecodeBatch::new(&model, 16);
/// batch.admit(requests)?;                 // prefill, join the batch
/// while !batch.is_empty() {
///     let done = batch.step(&mut |drawn| { /* hand on drawn.token */ Next::Continue })?;
///     // done: the (id, Finish) of the sequences that left; admit waiting ones here
/// }
/// ```
#[derive(Debug)]
pub struct DecodeBatch<'m> {
    model: &'m RelationLm,
    cache: LmCache,
    rows: Vec<Row>,
    capacity: usize,
}

impl<'m> DecodeBatch<'m> {
    /// An empty batch of at most `capacity` sequences (at least one).
    pub fn new(model: &'m RelationLm, capacity: usize) -> Self {
        Self {
            model,
            cache: model.new_cache(),
            rows: Vec::new(),
            capacity: capacity.max(1),
        }
    }

    /// The same batch with its caches' per-token buffers kept in `storage` (f16 or bf16: a
    /// half-precision Relation Cache, see [`LmCache::with_storage`]); `None`: the compute dtype.
    /// Call before admitting any sequence.
    ///
    /// # Errors
    /// As [`LmCache::with_storage`]; a batch that already holds sequences.
    pub fn with_cache_dtype(mut self, storage: Option<DType>) -> Result<Self> {
        if !self.rows.is_empty() {
            return Err(ModelError::Batch(
                "the cache dtype is chosen before any sequence is admitted".into(),
            ));
        }
        self.cache = self.model.new_cache_in(storage)?;
        Ok(self)
    }

    /// An empty cache kept like this batch's.
    fn fresh_cache(&self) -> LmCache {
        LmCache {
            storage: self.cache.storage,
            ..self.model.new_cache()
        }
    }

    /// Sequences in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no sequence is in the batch.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Whether the sequence of request `id` is in the batch.
    pub fn contains(&self, id: u64) -> bool {
        self.rows.iter().any(|r| r.request.id == id)
    }

    /// Room left: how many more sequences [`DecodeBatch::admit`] takes now.
    pub fn room(&self) -> usize {
        self.capacity - self.rows.len()
    }

    /// Tokens each sequence has in its cache (prompt and drawn tokens but the last drawn one),
    /// in batch order.
    pub fn lens(&self) -> &[usize] {
        self.cache.lens()
    }

    /// Bytes of the batch's caches.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    /// Checks a request before it is admitted: a prompt of at least one token, every token in
    /// the vocabulary, valid sampling settings.
    ///
    /// # Errors
    /// [`ModelError::Zero`], [`ModelError::TokenOutOfRange`], [`ModelError::Sampling`].
    pub fn check(model: &RelationLm, request: &Request) -> Result<()> {
        request.sampling.validate()?;
        if request.prompt.is_empty() {
            return Err(ModelError::Zero {
                name: "prompt length",
            });
        }
        let vocab = model.vocab_size();
        if let Some(&token) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { token, vocab });
        }
        Ok(())
    }

    /// Prefills the `requests` and adds them to the batch: prompts of equal length are prefilled
    /// together ([`RelationLm::prefill`], chunks of [`PREFILL_CHUNK`] where a pass cannot take
    /// the whole prompt), then joined to the batch's caches. A request with `max_new_tokens` 0
    /// is not added.
    ///
    /// # Errors
    /// More requests than [`DecodeBatch::room`] ([`ModelError::Batch`]); as
    /// [`DecodeBatch::check`]. Nothing is added then.
    pub fn admit(&mut self, requests: Vec<Request>) -> Result<()> {
        if requests.len() > self.room() {
            return Err(ModelError::Batch(format!(
                "{} sequences do not fit: the batch holds {} of at most {}",
                requests.len(),
                self.rows.len(),
                self.capacity
            )));
        }
        for request in &requests {
            Self::check(self.model, request)?;
        }
        let device = self.model.embedding.weight.val().device();
        let mut groups: BTreeMap<usize, Vec<Request>> = BTreeMap::new();
        for request in requests {
            if request.sampling.max_new_tokens > 0 {
                groups
                    .entry(request.prompt.len())
                    .or_default()
                    .push(request);
            }
        }
        let mut caches = vec![std::mem::take(&mut self.cache)];
        let vocab = self.model.vocab_size();
        let mut rows = Vec::new();
        for (len, group) in groups {
            let ids: Vec<i64> = group
                .iter()
                .flat_map(|r| r.prompt.iter().map(|&t| t as i64))
                .collect();
            let ids =
                Tensor::<2, Int>::from_data(TensorData::new(ids, [group.len(), len]), &device); // [n, len]
            let mut cache = self.fresh_cache();
            let logits = self.model.prefill(ids, &mut cache, PREFILL_CHUNK); // [n, V]
            let logits = match logits {
                Ok(logits) => logits,
                Err(e) => {
                    self.cache = caches.swap_remove(0);
                    return Err(e);
                }
            };
            let logits: Vec<f32> = logits.into_data().iter::<f32>().collect();
            caches.push(cache);
            for (request, logits) in group.into_iter().zip(logits.chunks(vocab)) {
                rows.push(Row {
                    rng: SplitMix64::new(request.sampling.seed),
                    request,
                    logits: logits.to_vec(),
                    drawn: 0,
                });
            }
        }
        caches.retain(|c| !c.is_empty());
        self.cache = match caches.len() {
            0 => self.fresh_cache(),
            1 => caches.pop().expect("one cache"),
            _ => LmCache::join(caches)?,
        };
        self.rows.extend(rows);
        Ok(())
    }

    /// One step: draws a token for every sequence, hands each to `on_token` (in batch order),
    /// lets the sequences that ended leave, and runs the model once over the others. Returns
    /// the sequences that left, with why.
    ///
    /// # Errors
    /// A model error; the batch is empty afterwards (its caches would no longer match).
    pub fn step(&mut self, on_token: &mut dyn FnMut(Drawn) -> Next) -> Result<Vec<(u64, Finish)>> {
        let mut next = Vec::with_capacity(self.rows.len());
        let mut keep = Vec::with_capacity(self.rows.len());
        let mut done = Vec::new();
        for (i, row) in self.rows.iter_mut().enumerate() {
            let sampling = &row.request.sampling;
            let token = sampling.draw(&row.logits, &mut row.rng);
            row.drawn += 1;
            if sampling.stop_tokens.contains(&token) {
                done.push((row.request.id, Finish::Stop));
                continue;
            }
            let (logprob, top) = match row.request.logprobs {
                Some(k) => {
                    let (logprob, top) = log_probs(&row.logits, token, k);
                    (Some(logprob), top)
                }
                None => (None, Vec::new()),
            };
            let drawn = Drawn {
                id: row.request.id,
                token,
                logprob,
                top,
                index: row.drawn,
            };
            if on_token(drawn) == Next::End {
                done.push((row.request.id, Finish::Stop));
            } else if row.drawn >= sampling.max_new_tokens {
                done.push((row.request.id, Finish::Length));
            } else {
                keep.push(i);
                next.push(token as i64);
            }
        }
        if keep.len() < self.rows.len() {
            let mut at = 0;
            self.rows.retain(|_| {
                at += 1;
                keep.binary_search(&(at - 1)).is_ok()
            });
            self.cache = if keep.is_empty() {
                self.fresh_cache()
            } else {
                self.cache.select(&keep)?
            };
        }
        if self.rows.is_empty() {
            return Ok(done);
        }
        let device = self.model.embedding.weight.val().device();
        let b = next.len();
        let input = Tensor::<2, Int>::from_data(TensorData::new(next, [b, 1]), &device); // [B, 1]
        let logits = match self.model.forward_cached(input, &mut self.cache) {
            Ok(logits) => logits, // [B, 1, V]
            Err(e) => {
                self.rows.clear();
                self.cache = self.fresh_cache();
                return Err(e);
            }
        };
        let logits: Vec<f32> = logits.into_data().iter::<f32>().collect();
        let vocab = self.model.vocab_size();
        for (row, logits) in self.rows.iter_mut().zip(logits.chunks(vocab)) {
            row.logits.copy_from_slice(logits);
        }
        Ok(done)
    }
}

/// `log softmax(logits)[token]` and the `top` most likely tokens with theirs (in f64, then
/// rounded).
pub fn log_probs(logits: &[f32], token: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_total = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let logprob = |i: usize| (logits[i] as f64 - log_total) as f32;
    let best = if top == 0 {
        Vec::new()
    } else {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let k = top.min(order.len());
        order.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        order.truncate(k);
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        order.into_iter().map(|i| (i as u32, logprob(i))).collect()
    };
    (logprob(token as usize), best)
}
