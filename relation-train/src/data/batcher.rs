//! Token windows out: the deterministic, resumable order of training batches and the
//! evaluation windows.

use relation_core::rng::SplitMix64;
use serde::{Deserialize, Serialize};

use super::data_err;
use crate::Result;

/// Position in the training stream: the epoch and the next window of its shuffled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Passes over the training windows completed.
    pub epoch: u64,
    /// Next window index in this epoch's order.
    pub index: u64,
}

/// Deterministic batches of `seq_len + 1`-token windows from a token stream.
///
/// Windows start at multiples of `seq_len` (consecutive windows share one token: the last
/// target of one is the first input of the next). Each epoch visits every window once in an
/// order drawn from `(seed, epoch)`; the position is two integers, so a resumed run continues
/// with exactly the batches an uninterrupted one would have seen.
pub struct Batcher {
    windows: u64,
    seq_len: usize,
    seed: u64,
    order: Vec<u64>,
    position: DataPosition,
}

impl Batcher {
    /// A batcher over a stream of `tokens` tokens.
    ///
    /// # Errors
    /// [`TrainError::Data`](crate::TrainError::Data) if the stream is shorter than one window.
    pub fn new(tokens: usize, seq_len: usize, seed: u64, position: DataPosition) -> Result<Self> {
        let windows = if tokens > seq_len {
            ((tokens - 1) / seq_len) as u64
        } else {
            0
        };
        if windows == 0 {
            return Err(data_err(format!(
                "the training split has {tokens} tokens, fewer than seq_len + 1 = {}; use a shorter seq_len or more text",
                seq_len + 1
            )));
        }
        let mut batcher = Self {
            windows,
            seq_len,
            seed,
            order: Vec::new(),
            position,
        };
        batcher.shuffle();
        Ok(batcher)
    }

    /// Number of windows per epoch.
    pub fn windows(&self) -> u64 {
        self.windows
    }

    /// Where the next batch starts.
    pub fn position(&self) -> DataPosition {
        self.position
    }

    fn shuffle(&mut self) {
        // Fisher–Yates with a generator seeded by (seed, epoch).
        let mut rng =
            SplitMix64::new(self.seed ^ self.position.epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        self.order = (0..self.windows).collect();
        for i in (1..self.order.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            self.order.swap(i, j);
        }
    }

    /// The next `rows` windows as `(inputs, targets)`, each `rows * seq_len` tokens, row-major
    /// `[rows, seq_len]`.
    pub fn next_batch(&mut self, stream: &[u32], rows: usize) -> (Vec<i64>, Vec<i64>) {
        let t = self.seq_len;
        let mut inputs = Vec::with_capacity(rows * t);
        let mut targets = Vec::with_capacity(rows * t);
        for _ in 0..rows {
            if self.position.index >= self.windows {
                self.position = DataPosition {
                    epoch: self.position.epoch + 1,
                    index: 0,
                };
                self.shuffle();
            }
            let start = self.order[self.position.index as usize] as usize * t;
            let window = &stream[start..start + t + 1];
            inputs.extend(window[..t].iter().map(|&x| x as i64));
            targets.extend(window[1..].iter().map(|&x| x as i64));
            self.position.index += 1;
        }
        (inputs, targets)
    }
}

/// Non-overlapping evaluation windows over a stream of `tokens` tokens, as `(start, n)`: inputs
/// `start .. start + n`, targets one further. All have `n = seq_len` except possibly the last,
/// which takes the remainder; stops once `max_tokens` targets are covered (0 = all).
pub fn eval_windows(tokens: usize, seq_len: usize, max_tokens: usize) -> Vec<(usize, usize)> {
    let mut windows = Vec::new();
    let mut start = 0;
    let mut covered = 0;
    while start + 1 < tokens {
        let n = seq_len.min(tokens - 1 - start);
        windows.push((start, n));
        start += n;
        covered += n;
        if max_tokens > 0 && covered >= max_tokens {
            break;
        }
    }
    windows
}

/// The `cu_seqlens` of `rows` windows of `seq_len` input tokens laid back to back
/// (`inputs.len() = rows · seq_len`) under `--packing documents`: a segment starts at every row
/// start and at every `eot` token (the end-of-text marker begins the next document and is its
/// first token, so the last token of a document still learns to predict it, within its own
/// document). Offsets are strictly increasing, `0 … inputs.len()`.
///
/// A window that begins inside a document holds that document's remainder as its first
/// segment: a document longer than a row continues, restarted, in the next one.
pub fn document_segments(inputs: &[i64], seq_len: usize, eot: u32) -> Vec<usize> {
    let eot = i64::from(eot);
    let mut offsets = Vec::with_capacity(inputs.len() / seq_len.max(1) + 2);
    for (i, &token) in inputs.iter().enumerate() {
        if i % seq_len == 0 || token == eot {
            offsets.push(i);
        }
    }
    offsets.push(inputs.len());
    offsets
}
