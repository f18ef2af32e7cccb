//! Batched decoding of different prompts with continuous batching: [`DecodeBatch`].
//!
//! The sequences of a batch keep their own lengths (their caches are ragged: each token sits at
//! its sequence's own position, each attention or Relation row reads its own cached rows), their
//! own sampling settings and their own random stream. A step draws one token for every
//! sequence and runs the model once over the whole batch, so the weights are read once per step
//! for all of them. On a CPU with several threads the batch is kept in as many parts, each with
//! its own cache and a one-thread pool, and a step runs the parts side by side, each thread
//! every operation of its part on its own: at 16 sequences the operations are too small to
//! split among threads without the threads waiting on each other more than they compute. A
//! sequence that ends leaves the batch between two steps, and a waiting prompt joins it
//! (prefilled, in one packed pass with the other newcomers where the model allows, then its
//! cache joined to the others', with room reserved for the tokens the part's sequences may
//! still draw, so that the steps write the cache in place instead of copying it to grow it):
//! nobody waits for the longest sequence to finish. Each part also draws its sequences' next
//! tokens on its own thread.
//!
//! A sequence's tokens depend only on its prompt, its settings and its seed, not on which other
//! sequences share its batch, up to the rounding of the batched products (greedy decoding gives
//! the same tokens whenever the top two logits are not within that rounding of each other).

use burn::tensor::{DType, Int, Tensor, TensorData};
use relation_core::rng::SplitMix64;

use crate::cache::LmCache;
use crate::error::{ModelError, Result};
use crate::generate::Sampling;
use crate::model::RelationLm;

mod admit;
mod draw;

use draw::Pick;
pub use draw::log_probs;

/// Tokens past the longest sequence for which a part's caches reserve room when sequences
/// join it ([`LmCache::join_reserving`]): enough for most requests' remaining tokens, so the
/// per-token buffers are not copied as they grow; longer requests grow them beyond it.
const RESERVE_AHEAD: usize = 1024;

/// Prompt tokens per packed prefill pass at most, when several prompts join at once (see
/// [`DecodeBatch::admit`]): enough for the products to be as tall as a long prompt's, few
/// enough that a pass's activations stay small.
pub const PACKED_PREFILL_TOKENS: usize = 16_384;

/// Prompts of at least this many tokens are not packed with others: their products are tall
/// already, and packing would only size every packed sequence's buffers to the longest.
pub const PACKED_PREFILL_BELOW: usize = 512;

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
    /// The sequences, in parts run side by side (one part off a CPU).
    parts: Vec<Part>,
    /// A one-thread pool per part (none with one part).
    pools: Vec<rayon::ThreadPool>,
    /// Dtype of the caches' per-token buffers (`None`: the compute dtype).
    storage: Option<DType>,
    capacity: usize,
}

/// Sequences that share a cache and run on one thread during a step.
#[derive(Debug)]
struct Part {
    cache: LmCache,
    rows: Vec<Row>,
}

impl<'m> DecodeBatch<'m> {
    /// An empty batch of at most `capacity` sequences (at least one), in as many parts as the
    /// thread pool has threads on a CPU device (see the module documentation), one part
    /// elsewhere.
    pub fn new(model: &'m RelationLm, capacity: usize) -> Self {
        let device = model.embedding.weight.val().device();
        let threads = if relation_kernels::is_flex(&device) {
            rayon::current_num_threads()
        } else {
            1
        };
        Self::with_parts(model, capacity, threads)
    }

    /// [`DecodeBatch::new`] with the sequences kept in `parts` parts (at least one; at most one
    /// per sequence). One part runs every step on the whole thread pool.
    pub fn with_parts(model: &'m RelationLm, capacity: usize, parts: usize) -> Self {
        let capacity = capacity.max(1);
        let parts = parts.clamp(1, capacity);
        let pools: Vec<rayon::ThreadPool> = (0..parts)
            .take_while(|_| parts > 1)
            .map_while(|_| rayon::ThreadPoolBuilder::new().num_threads(1).build().ok())
            .collect();
        // A pool that cannot start (no threads left) leaves the batch in one part.
        let (parts, pools) = if pools.len() == parts {
            (parts, pools)
        } else {
            (1, Vec::new())
        };
        Self {
            model,
            parts: (0..parts)
                .map(|_| Part {
                    cache: model.new_cache(),
                    rows: Vec::new(),
                })
                .collect(),
            pools,
            storage: None,
            capacity,
        }
    }

    /// The same batch with its caches' per-token buffers kept in `storage` (f16 or bf16: a
    /// half-precision Relation Cache, see [`LmCache::with_storage`]); `None`: the compute dtype.
    /// Call before admitting any sequence.
    ///
    /// # Errors
    /// As [`LmCache::with_storage`]; a batch that already holds sequences.
    pub fn with_cache_dtype(mut self, storage: Option<DType>) -> Result<Self> {
        if !self.is_empty() {
            return Err(ModelError::Batch(
                "the cache dtype is chosen before any sequence is admitted".into(),
            ));
        }
        self.model.new_cache_in(storage)?; // checks the dtype
        self.storage = storage;
        for i in 0..self.parts.len() {
            self.parts[i].cache = self.fresh_cache();
        }
        Ok(self)
    }

    /// An empty cache kept like this batch's.
    fn fresh_cache(&self) -> LmCache {
        LmCache {
            storage: self.storage,
            ..self.model.new_cache()
        }
    }

    /// Sequences in the batch.
    pub fn len(&self) -> usize {
        self.parts.iter().map(|p| p.rows.len()).sum()
    }

    /// Whether no sequence is in the batch.
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(|p| p.rows.is_empty())
    }

    /// Whether the sequence of request `id` is in the batch.
    pub fn contains(&self, id: u64) -> bool {
        self.rows().any(|r| r.request.id == id)
    }

    /// Room left: how many more sequences [`DecodeBatch::admit`] takes now.
    pub fn room(&self) -> usize {
        self.capacity - self.len()
    }

    /// Tokens each sequence has in its cache (prompt and drawn tokens but the last drawn one),
    /// in batch order.
    pub fn lens(&self) -> Vec<usize> {
        self.parts
            .iter()
            .flat_map(|p| p.cache.lens().iter().copied())
            .collect()
    }

    /// Sequences in each part (see [`DecodeBatch::with_parts`]).
    pub fn part_lens(&self) -> Vec<usize> {
        self.parts.iter().map(|p| p.rows.len()).collect()
    }

    /// Bytes of the batch's caches.
    pub fn cache_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.cache.bytes()).sum()
    }

    /// The sequences in batch order (part by part).
    fn rows(&self) -> impl Iterator<Item = &Row> {
        self.parts.iter().flat_map(|p| p.rows.iter())
    }

    /// Empties the batch (after a model error: its caches would no longer match).
    fn clear(&mut self) {
        for i in 0..self.parts.len() {
            self.parts[i].rows.clear();
            self.parts[i].cache = self.fresh_cache();
        }
    }

    /// Checks a request before it is admitted: a prompt of at least one token, every token in
    /// the vocabulary, valid sampling settings.
    ///
    /// # Errors
    /// [`ModelError::Zero`], [`ModelError::TokenOutOfRange`], [`ModelError::Sampling`].
    pub fn check(model: &RelationLm, request: &Request) -> Result<()> {
        request.sampling.validate()?;
        model.check_prompt(&request.prompt)
    }

    /// One step: draws a token for every sequence, hands each to `on_token` (in batch order),
    /// lets the sequences that ended leave, and runs the model once over the others. Returns
    /// the sequences that left, with why.
    ///
    /// # Errors
    /// A model error; the batch is empty afterwards (its caches would no longer match).
    pub fn step(&mut self, on_token: &mut dyn FnMut(Drawn) -> Next) -> Result<Vec<(u64, Finish)>> {
        // Each part draws its sequences' tokens on its own thread (a pass over the vocabulary
        // per sequence); the tokens are then handed on in batch order.
        let busy = self.parts.iter().filter(|p| !p.rows.is_empty()).count();
        let picks = self.each_part(busy, vec![(); self.parts.len()], |part, ()| {
            part.rows.iter_mut().map(Row::pick).collect::<Vec<Pick>>()
        });
        let mut done = Vec::new();
        let mut inputs = Vec::with_capacity(self.parts.len());
        for (part, picks) in picks.into_iter().enumerate() {
            let next = self.hand_on(part, picks, on_token, &mut done)?;
            inputs.push(next);
        }
        self.rebalance(&mut inputs)?;
        let device = self.model.embedding.weight.val().device();
        let (model, vocab) = (self.model, self.model.vocab_size());
        let busy = inputs.iter().filter(|next| !next.is_empty()).count();
        let results = self.each_part(busy, inputs, |part, next| -> Result<()> {
            if next.is_empty() {
                return Ok(());
            }
            let b = next.len();
            let input = Tensor::<2, Int>::from_data(TensorData::new(next, [b, 1]), &device); // [B, 1]
            let logits = model.forward_cached(input, &mut part.cache)?; // [B, 1, V]
            let logits: Vec<f32> = logits.into_data().iter::<f32>().collect();
            for (row, logits) in part.rows.iter_mut().zip(logits.chunks(vocab)) {
                row.logits.copy_from_slice(logits);
            }
            Ok(())
        });
        if let Err(e) = results.into_iter().collect::<Result<()>>() {
            self.clear();
            return Err(e);
        }
        Ok(done)
    }

    /// `f(part, input)` for every part with its input, side by side on the parts' one-thread
    /// pools when more than one part has work (`busy`), else one after the other on the caller's
    /// pool (one part with sequences runs on the whole pool).
    fn each_part<I: Send, T: Send>(
        &mut self,
        busy: usize,
        inputs: Vec<I>,
        f: impl Fn(&mut Part, I) -> T + Sync,
    ) -> Vec<T> {
        if busy <= 1 {
            return self
                .parts
                .iter_mut()
                .zip(inputs)
                .map(|(part, input)| f(part, input))
                .collect();
        }
        use rayon::prelude::*;
        let pools = &self.pools;
        self.parts
            .par_iter_mut()
            .zip(inputs)
            .enumerate()
            .map(|(i, (part, input))| pools[i].install(|| f(part, input)))
            .collect()
    }

    /// Moves sequences from the fullest part to the emptiest until no two parts differ by more
    /// than one (`inputs`, each part's next tokens, move with them), so that no thread idles
    /// while another steps most of the batch after sequences left unevenly. The moved rows'
    /// caches are copied out of their part and joined to the other's (a copy of both parts'
    /// caches, only when sequences left unevenly).
    ///
    /// # Errors
    /// A cache error; the batch is empty afterwards.
    fn rebalance(&mut self, inputs: &mut [Vec<i64>]) -> Result<()> {
        loop {
            let sizes: Vec<usize> = self.parts.iter().map(|p| p.rows.len()).collect();
            let from = (0..sizes.len()).max_by_key(|&i| sizes[i]).unwrap_or(0);
            let to = (0..sizes.len()).min_by_key(|&i| sizes[i]).unwrap_or(0);
            if sizes[from] <= sizes[to] + 1 {
                return Ok(());
            }
            let (n, moving) = (sizes[from], (sizes[from] - sizes[to]) / 2);
            let keep: Vec<usize> = (0..n - moving).collect();
            let moved: Vec<usize> = (n - moving..n).collect();
            let cache = &self.parts[from].cache;
            let (kept, taken) = match (cache.select(&keep), cache.select(&moved)) {
                (Ok(kept), Ok(taken)) => (kept, taken),
                (Err(e), _) | (_, Err(e)) => {
                    self.clear();
                    return Err(e);
                }
            };
            self.parts[from].cache = kept;
            let rows = self.parts[from].rows.split_off(n - moving);
            self.join_into(to, vec![taken], rows)?;
            let tokens = inputs[from].split_off(n - moving);
            inputs[to].extend(tokens);
        }
    }

    /// Hands on the tokens drawn for the sequences of part `part` (`picks`, one per sequence,
    /// [`Row::pick`]) to `on_token`, records the sequences that end in `done` and lets them
    /// leave; returns the tokens of the others (the part's next input, in its batch order).
    fn hand_on(
        &mut self,
        part: usize,
        picks: Vec<Pick>,
        on_token: &mut dyn FnMut(Drawn) -> Next,
        done: &mut Vec<(u64, Finish)>,
    ) -> Result<Vec<i64>> {
        let rows = &mut self.parts[part].rows;
        let mut next = Vec::with_capacity(rows.len());
        let mut keep = Vec::with_capacity(rows.len());
        for (i, (row, pick)) in rows.iter_mut().zip(picks).enumerate() {
            let sampling = &row.request.sampling;
            let token = pick.token;
            row.drawn += 1;
            if sampling.stop_tokens.contains(&token) {
                done.push((row.request.id, Finish::Stop));
                continue;
            }
            let drawn = Drawn {
                id: row.request.id,
                token,
                logprob: pick.logprob,
                top: pick.top,
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
        if keep.len() < rows.len() {
            let mut at = 0;
            rows.retain(|_| {
                at += 1;
                keep.binary_search(&(at - 1)).is_ok()
            });
            let cache = if keep.is_empty() {
                Ok(self.fresh_cache())
            } else {
                std::mem::take(&mut self.parts[part].cache).retain(&keep)
            };
            match cache {
                Ok(cache) => self.parts[part].cache = cache,
                Err(e) => {
                    self.clear();
                    return Err(e);
                }
            }
        }
        Ok(next)
    }
}
