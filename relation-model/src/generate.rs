//! Sampling from a model with its cache: temperature, top-k, top-p, a seed, batches of prompts.

use burn::tensor::{DType, Int, Tensor, TensorData};
use relation_core::Segments;
use relation_core::rng::SplitMix64;
use relation_kernels::KernelError;

use crate::batch::{DecodeBatch, Next, Request};
use crate::cache::{LayerCache, LmCache};
use crate::error::{ModelError, Result};
use crate::model::{Mixer, RelationLm, norm};

/// How tokens are drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// Tokens to generate after each prompt.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f64,
    /// Keep only the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p` (nucleus).
    pub top_p: Option<f64>,
    /// Seed of the sampler: the same seed, model and prompts give the same tokens.
    pub seed: u64,
    /// Tokens that end a continuation (typically the tokenizer's end-of-text): drawing one
    /// stops that prompt's continuation, and the stop token itself is not returned.
    pub stop_tokens: Vec<u32>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            temperature: 0.8,
            top_k: Some(50),
            top_p: Some(0.95),
            seed: 42,
            stop_tokens: Vec::new(),
        }
    }
}

impl Sampling {
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(ModelError::Sampling(what.to_string()));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(&format!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            ));
        }
        if self.top_k == Some(0) {
            return bad("top_k must be >= 1");
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad(&format!("top_p must be in (0, 1], got {p}"));
        }
        Ok(())
    }

    /// Draws one token from a row of logits.
    ///
    /// The weights are `e^{(logit - max) / temperature}` in f32
    /// ([`relation_kernels::softmax_weights`]: one vectorised pass, the same bits on every CPU),
    /// summed in f64. With a top-k or top-p cut the kept tokens are ordered most likely first and
    /// the draw walks them in that order; without one it walks every token in id order (no sort:
    /// a draw costs two passes over the vocabulary). A token whose logit is -inf is never drawn;
    /// a row whose weights do not sum to a positive finite number (NaN logits) gives its argmax.
    pub fn draw(&self, logits: &[f32], rng: &mut SplitMix64) -> u32 {
        let argmax = || {
            logits
                .iter()
                .enumerate()
                .fold(0, |best, (i, &x)| if x > logits[best] { i } else { best }) as u32
        };
        let scale = (1.0 / self.temperature) as f32;
        if self.temperature == 0.0 || !scale.is_finite() || logits.is_empty() {
            return argmax();
        }
        let top = logits
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        let mut weights = Vec::new();
        let total = relation_kernels::softmax_weights(logits, top, scale, &mut weights);
        if !(total.is_finite() && total > 0.0) {
            return argmax();
        }
        let u = (rng.next_signed() + 1.0) / 2.0;
        if self.top_k.is_none_or(|k| k >= logits.len()) && self.top_p.is_none() {
            return walk((0..logits.len()).map(|i| (i, weights[i] as f64)), u * total)
                .unwrap_or_else(argmax);
        }
        let descending = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        let mut order: Vec<usize> = (0..logits.len()).collect();
        match self.top_k {
            Some(k) if k < logits.len() && self.top_p.is_none() => {
                let k = k.max(1); // `validate` refuses 0; a direct call keeps the top token
                order.select_nth_unstable_by(k - 1, descending);
                order.truncate(k);
                order.sort_unstable_by(descending);
            }
            k => {
                order.sort_unstable_by(descending);
                order.truncate(k.unwrap_or(order.len()).min(order.len()));
            }
        }
        if let Some(p) = self.top_p {
            let kept: f64 = order.iter().map(|&i| weights[i] as f64).sum();
            let mut mass = 0.0;
            let keep = order.iter().position(|&i| {
                mass += weights[i] as f64 / kept;
                mass >= p
            });
            order.truncate(keep.map_or(order.len(), |k| k + 1));
        }
        let kept: f64 = order.iter().map(|&i| weights[i] as f64).sum();
        walk(order.iter().map(|&i| (i, weights[i] as f64)), u * kept).unwrap_or_else(argmax)
    }
}

/// The first token at which the running sum of `weighted` passes `u` (`u` in `[0, total)`), or
/// the last token of positive weight when rounding leaves `u` at the end; `None` when no token
/// has weight.
fn walk(weighted: impl Iterator<Item = (usize, f64)>, mut u: f64) -> Option<u32> {
    let mut last = None;
    for (token, q) in weighted {
        if q > 0.0 {
            if u < q {
                return Some(token as u32);
            }
            last = Some(token as u32);
        }
        u -= q;
    }
    last
}

/// Prompt tokens per forward pass when [`RelationLm::generate`] prefills a prompt of a model
/// with layers other than `F`, `L` and `A`, or on a backend without the fused kernels (the
/// others take the prompt in one pass; see [`RelationLm::prefill`]).
pub const PREFILL_CHUNK: usize = 2048;

impl RelationLm {
    /// Feeds `tokens` into `cache` and returns the logits after the last token: the start of
    /// decoding. Only the last position's logits are computed (never `[n, V]`).
    ///
    /// On a device with the fused kernels (Flex, CubeCL runtimes), a model whose layers are all
    /// Relation (`F`), Linear Relation (`L`) or attention (`A`) takes the prompt in one pass,
    /// whatever the cache already holds: FlashRelation's forward, the Linear Relation scan and
    /// the tiled rows of the new tokens against the cache keep `O(n D)` memory, so any length
    /// costs its activations plus the cache. Otherwise (RealFormer, retention or KDA layers, or
    /// a backend that runs the references) the prompt goes `chunk` tokens per pass (the last pass
    /// may be shorter): a chunk's rows are then computed against every cached position with the
    /// reference, whose scores take `H · chunk · context` floats — lower `chunk` for long
    /// contexts.
    ///
    /// # Shapes
    /// - `tokens`: `[B, n]`, output: `[B, V]`
    ///
    /// # Errors
    /// [`ModelError::Zero`] for an empty prompt or a chunk of 0; as
    /// [`RelationLm::forward_cached`].
    pub fn prefill(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut LmCache,
        chunk: usize,
    ) -> Result<Tensor<2>> {
        let [_, n] = tokens.dims();
        if n == 0 {
            return Err(ModelError::Zero {
                name: "prompt length",
            });
        }
        if chunk == 0 {
            return Err(ModelError::Zero {
                name: "prefill chunk",
            });
        }
        let fused_layers = self.blocks.iter().all(|b| {
            matches!(
                b.mixer,
                Mixer::Full(_) | Mixer::Linear(_) | Mixer::Attention(_)
            )
        });
        let chunk = if fused_layers && relation_kernels::has_kernels(&tokens.device()) {
            n
        } else {
            chunk
        };
        let mut last = None;
        for start in (0..n).step_by(chunk) {
            let len = chunk.min(n - start);
            let h = self.hidden_cached(tokens.clone().narrow(1, start, len), cache)?; // [B, len, d]
            last = Some(h);
        }
        self.last_logits(last.expect("at least one chunk")) // [B, V]
    }

    /// Checks a prompt: at least one token, every token in the vocabulary.
    ///
    /// # Errors
    /// [`ModelError::Zero`] for an empty prompt, [`ModelError::TokenOutOfRange`] naming the first
    /// token outside the vocabulary.
    pub fn check_prompt(&self, prompt: &[u32]) -> Result<()> {
        if prompt.is_empty() {
            return Err(ModelError::Zero {
                name: "prompt length",
            });
        }
        let vocab = self.vocab_size();
        match prompt.iter().find(|&&t| t as usize >= vocab) {
            Some(&token) => Err(ModelError::TokenOutOfRange { token, vocab }),
            None => Ok(()),
        }
    }

    /// Whether [`prefill_packed`](Self::prefill_packed) can run this model: every layer a Full
    /// Relation, a Linear Relation or attention (the layers whose caches a packed forward hands
    /// back).
    pub fn packs_prefill(&self) -> bool {
        self.blocks.iter().all(|b| {
            matches!(
                b.mixer,
                Mixer::Full(_) | Mixer::Linear(_) | Mixer::Attention(_)
            )
        })
    }

    /// Prefills prompts of any lengths in one pass, packed back to back as documents (each
    /// computed as if alone: positions restart, no token reads another prompt, recurrent states
    /// start from zero), into the empty `cache`, which then holds one sequence per prompt with
    /// its own length (a batch of sequences of different lengths, as [`LmCache::join`] makes).
    /// Returns each prompt's last logits. One pass over many short prompts keeps the products
    /// as tall as one long prompt's, where prefilling them one by one would not.
    ///
    /// # Shapes
    /// - `prompts`: `N` token sequences; output: `[N, V]`
    ///
    /// # Errors
    /// A model with other layers than `F`, `L` and `A` ([`packs_prefill`](Self::packs_prefill)),
    /// a cache that is not empty or is for another model ([`ModelError::Batch`],
    /// [`ModelError::CacheMismatch`]); no prompt, an empty prompt or a token id outside the
    /// vocabulary; operator errors.
    pub fn prefill_packed(&self, prompts: &[&[u32]], cache: &mut LmCache) -> Result<Tensor<2>> {
        if !self.packs_prefill() {
            return Err(ModelError::Batch(
                "a packed prefill takes models of F, L and A layers only".into(),
            ));
        }
        if !cache.is_empty() || cache.layers.len() != self.blocks.len() {
            return Err(ModelError::CacheMismatch(format!(
                "a packed prefill fills an empty cache of {} layers",
                self.blocks.len()
            )));
        }
        if prompts.is_empty() {
            return Err(ModelError::Zero { name: "prompts" });
        }
        for prompt in prompts {
            self.check_prompt(prompt)?;
        }
        let ids: Vec<i64> = prompts
            .iter()
            .flat_map(|p| p.iter().map(|&t| i64::from(t)))
            .collect();
        let lengths: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        let segments = Segments::from_lengths(&lengths).map_err(KernelError::from)?;
        let total = segments.total();
        let device = self.embedding.weight.val().device();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, total]), &device);
        let mut h = self.embedding.forward(tokens); // [1, total, d]
        // The layers' caches, stored only once every layer has run (an error leaves `cache` empty).
        let mut layers = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let normed = norm(&block.norm_mixer, h.clone())?;
            let (y, filled) = match &block.mixer {
                Mixer::Full(m) => m.forward_packed_cached(normed, &segments)?,
                Mixer::Attention(m) => m.forward_packed_cached(normed, &segments)?,
                Mixer::Linear(m) => {
                    let (y, state) = m.forward_packed(normed, &segments)?;
                    let lens = lengths.clone();
                    (y, LayerCache::Linear { state, lens })
                }
                _ => unreachable!("packs_prefill checked every layer"),
            };
            layers.push(filled);
            h = h + y;
            h = h.clone() + block.ffn.forward(norm(&block.norm_ffn, h)?)?;
        }
        cache.layers = layers;
        cache.keep_storage();
        // Each prompt's last position.
        let last: Vec<i64> = segments.bounds().map(|(_, end)| end as i64 - 1).collect();
        let last = Tensor::<1, Int>::from_data(TensorData::new(last, [prompts.len()]), &device);
        let d = h.dims()[2];
        self.head_rows(h.reshape([total, d]).select(0, last)) // [N, d] -> [N, V]
    }

    /// Continues every prompt by up to `sampling.max_new_tokens` tokens (fewer where a
    /// [stop token](Sampling::stop_tokens) is drawn), all prompts in one [`DecodeBatch`]
    /// (prompts of equal length prefilled together with [`RelationLm::prefill`], then decoded
    /// together whatever their lengths). Prompt `i` draws from its own random stream, seeded
    /// `sampling.seed + i`, so its tokens are those it would get alone with that seed.
    ///
    /// # Errors
    /// Empty prompts, token ids outside the vocabulary, invalid sampling settings.
    pub fn generate(&self, prompts: &[Vec<u32>], sampling: &Sampling) -> Result<Vec<Vec<u32>>> {
        let mut outputs = vec![Vec::new(); prompts.len()];
        self.generate_batched(prompts, sampling, prompts.len(), &mut |i, token| {
            outputs[i].push(token);
            true
        })?;
        Ok(outputs)
    }

    /// Continues one prompt, handing each token to `on_token` as soon as it is drawn (for
    /// streaming output); `on_token` returning `false` ends the continuation there (e.g. at a
    /// stop string). Returns the tokens drawn, the same as [`RelationLm::generate`] would.
    ///
    /// # Errors
    /// As [`RelationLm::generate`].
    pub fn generate_stream(
        &self,
        prompt: &[u32],
        sampling: &Sampling,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        self.generate_stream_in(prompt, sampling, None, on_token)
    }

    /// [`RelationLm::generate_stream`] with the decoding caches kept in `cache_dtype` (see
    /// [`crate::LmCache::with_storage`]; `None`: the compute dtype).
    ///
    /// # Errors
    /// As [`RelationLm::generate`]; a cache dtype that is not a float one.
    pub fn generate_stream_in(
        &self,
        prompt: &[u32],
        sampling: &Sampling,
        cache_dtype: Option<DType>,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        self.generate_batched_in(
            &[prompt.to_vec()],
            sampling,
            1,
            cache_dtype,
            &mut |_, token| {
                out.push(token);
                on_token(token)
            },
        )?;
        Ok(out)
    }

    /// Continuous batching over a list of prompts: at most `max_batch` decode together, and
    /// whenever one ends the next waiting prompt takes its place. `on_token(prompt index,
    /// token)` gets every token drawn, as it is drawn (prompts interleaved); a prompt ends at a
    /// stop token (not passed on), at `max_new_tokens`, or when `on_token` returns `false`.
    /// Prompt `i` draws from its own random stream seeded `sampling.seed + i`, so its tokens do
    /// not depend on `max_batch` or on the other prompts.
    ///
    /// # Errors
    /// As [`RelationLm::generate`]; every prompt is checked before any is decoded.
    pub fn generate_batched(
        &self,
        prompts: &[Vec<u32>],
        sampling: &Sampling,
        max_batch: usize,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<()> {
        self.generate_batched_in(prompts, sampling, max_batch, None, on_token)
    }

    /// [`RelationLm::generate_batched`] with the decoding caches kept in `cache_dtype`.
    ///
    /// # Errors
    /// As [`RelationLm::generate_batched`]; a cache dtype that is not a float one.
    pub fn generate_batched_in(
        &self,
        prompts: &[Vec<u32>],
        sampling: &Sampling,
        max_batch: usize,
        cache_dtype: Option<DType>,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<()> {
        let requests: Vec<Request> = prompts
            .iter()
            .enumerate()
            .map(|(i, prompt)| Request {
                id: i as u64,
                prompt: prompt.clone(),
                sampling: Sampling {
                    seed: sampling.seed.wrapping_add(i as u64),
                    ..sampling.clone()
                },
                logprobs: None,
            })
            .collect();
        for request in &requests {
            DecodeBatch::check(self, request)?;
        }
        let mut waiting = requests.into_iter();
        let mut batch = DecodeBatch::new(self, max_batch).with_cache_dtype(cache_dtype)?;
        loop {
            let joining: Vec<Request> = waiting.by_ref().take(batch.room()).collect();
            if !joining.is_empty() {
                batch.admit(joining)?;
            }
            if batch.is_empty() {
                return Ok(());
            }
            batch.step(&mut |drawn| {
                if on_token(drawn.id as usize, drawn.token) {
                    Next::Continue
                } else {
                    Next::End
                }
            })?;
        }
    }
}
