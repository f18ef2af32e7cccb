//! Admission: prompts prefilled (packed together where the model allows, else grouped by
//! length) and their caches joined to a part's, with room reserved for their tokens.

use std::collections::BTreeMap;

use burn::tensor::{Int, Tensor, TensorData};
use relation_core::rng::SplitMix64;

use super::{
    DecodeBatch, PACKED_PREFILL_BELOW, PACKED_PREFILL_TOKENS, RESERVE_AHEAD, Request, Row,
};
use crate::cache::LmCache;
use crate::error::{ModelError, Result};
use crate::generate::PREFILL_CHUNK;

impl DecodeBatch<'_> {
    /// Prefills the `requests` and adds them to the batch: for a model of Full Relation, Linear
    /// Relation and attention layers, prompts shorter than [`PACKED_PREFILL_BELOW`] together
    /// whatever their lengths in packed passes ([`prefill_packed`], up to
    /// [`PACKED_PREFILL_TOKENS`] per pass); other prompts (every prompt, for other models) with
    /// those of equal length ([`prefill`], chunks of [`PREFILL_CHUNK`] where a pass cannot take
    /// the whole prompt); then joins them to the batch's caches. A request with
    /// `max_new_tokens` 0 is not added.
    ///
    /// [`prefill_packed`]: crate::RelationLm::prefill_packed
    /// [`prefill`]: crate::RelationLm::prefill
    ///
    /// # Errors
    /// More requests than [`DecodeBatch::room`] ([`ModelError::Batch`]); as
    /// [`DecodeBatch::check`]. Nothing is added then.
    pub fn admit(&mut self, requests: Vec<Request>) -> Result<()> {
        if requests.len() > self.room() {
            return Err(ModelError::Batch(format!(
                "{} sequences do not fit: the batch holds {} of at most {}",
                requests.len(),
                self.len(),
                self.capacity
            )));
        }
        for request in &requests {
            Self::check(self.model, request)?;
        }
        let requests: Vec<Request> = requests
            .into_iter()
            .filter(|r| r.sampling.max_new_tokens > 0)
            .collect();
        let mut admitted: Vec<(LmCache, Vec<Row>)> = Vec::new();
        for (packed, group) in self.prefill_groups(requests) {
            let mut cache = self.fresh_cache();
            let logits = if packed {
                let prompts: Vec<&[u32]> = group.iter().map(|r| r.prompt.as_slice()).collect();
                self.model.prefill_packed(&prompts, &mut cache)? // [n, V]
            } else {
                let len = group[0].prompt.len();
                let ids: Vec<i64> = group
                    .iter()
                    .flat_map(|r| r.prompt.iter().map(|&t| t as i64))
                    .collect();
                let device = self.model.embedding.weight.val().device();
                let ids =
                    Tensor::<2, Int>::from_data(TensorData::new(ids, [group.len(), len]), &device); // [n, len]
                self.model.prefill(ids, &mut cache, PREFILL_CHUNK)? // [n, V]
            };
            // The whole pool prefills (a prompt is many tokens), whatever the parts.
            let vocab = self.model.vocab_size();
            let logits: Vec<f32> = logits.into_data().iter::<f32>().collect();
            let rows = group
                .into_iter()
                .zip(logits.chunks(vocab))
                .map(|(request, logits)| Row {
                    rng: SplitMix64::new(request.sampling.seed),
                    request,
                    logits: logits.to_vec(),
                    drawn: 0,
                })
                .collect();
            admitted.push((cache, rows));
        }
        // Each new sequence joins the part with the fewest (the first such part on a tie).
        let mut joining: Vec<(Vec<LmCache>, Vec<Row>)> =
            (0..self.parts.len()).map(|_| Default::default()).collect();
        let mut sizes: Vec<usize> = self.parts.iter().map(|p| p.rows.len()).collect();
        for (cache, rows) in admitted {
            let mut at: Vec<Vec<usize>> = vec![Vec::new(); self.parts.len()];
            for (i, row) in rows.into_iter().enumerate() {
                let part = (0..sizes.len()).min_by_key(|&p| sizes[p]).unwrap_or(0);
                sizes[part] += 1;
                at[part].push(i);
                joining[part].1.push(row);
            }
            for (part, picked) in at.into_iter().enumerate() {
                if picked.len() == cache.lens().len() {
                    joining[part].0.push(cache);
                    break;
                }
                if !picked.is_empty() {
                    joining[part].0.push(cache.select(&picked)?);
                }
            }
        }
        for (part, (caches, rows)) in joining.into_iter().enumerate() {
            if !rows.is_empty() {
                self.join_into(part, caches, rows)?;
            }
        }
        Ok(())
    }

    /// The prefill passes of `requests`: for a model of `F`, `L` and `A` layers, prompts
    /// shorter than [`PACKED_PREFILL_BELOW`] packed together whatever their lengths, up to
    /// [`PACKED_PREFILL_TOKENS`] per pass; the others (every prompt, for other models) with
    /// those of equal length. `true` marks a packed pass.
    fn prefill_groups(&self, requests: Vec<Request>) -> Vec<(bool, Vec<Request>)> {
        let packs = self.model.packs_prefill();
        let mut equal: BTreeMap<usize, Vec<Request>> = BTreeMap::new();
        let mut packed: Vec<Vec<Request>> = Vec::new();
        let mut tokens = 0; // in the last pack
        for request in requests {
            let len = request.prompt.len();
            if !packs || len >= PACKED_PREFILL_BELOW {
                equal.entry(len).or_default().push(request);
                continue;
            }
            match packed.last_mut() {
                Some(pack) if tokens + len <= PACKED_PREFILL_TOKENS => {
                    tokens += len;
                    pack.push(request);
                }
                _ => {
                    tokens = len;
                    packed.push(vec![request]);
                }
            }
        }
        let packed = packed.into_iter().map(|group| (true, group));
        packed
            .chain(equal.into_values().map(|group| (false, group)))
            .collect()
    }

    /// Appends sequences to part `part`: their caches (`caches`, in order) joined after the
    /// part's, their rows after its rows.
    ///
    /// # Errors
    /// A cache error; the batch is empty afterwards (the part's cache is gone).
    pub(super) fn join_into(
        &mut self,
        part: usize,
        mut caches: Vec<LmCache>,
        rows: Vec<Row>,
    ) -> Result<()> {
        let fresh = self.fresh_cache();
        let current = std::mem::replace(&mut self.parts[part].cache, fresh);
        if !current.is_empty() {
            caches.insert(0, current);
        }
        // Room for every sequence's remaining tokens (up to RESERVE_AHEAD past the longest), so
        // that decoding writes in place instead of growing the buffers.
        let lens: Vec<usize> = caches.iter().flat_map(|c| c.lens().to_vec()).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let reserve = self.parts[part]
            .rows
            .iter()
            .chain(&rows)
            .zip(&lens)
            .map(|(row, len)| {
                len + row
                    .request
                    .sampling
                    .max_new_tokens
                    .saturating_sub(row.drawn)
            })
            .max()
            .unwrap_or(0)
            .min(longest + RESERVE_AHEAD);
        self.parts[part].cache = match LmCache::join_reserving(caches, reserve) {
            Ok(cache) => cache,
            Err(e) => {
                self.clear();
                return Err(e);
            }
        };
        self.parts[part].rows.extend(rows);
        Ok(())
    }
}
