//! Drawing a sequence's next token in its part ([`Row::pick`]) and the log-probabilities
//! reported with it ([`log_probs`]).

use super::Row;

impl Row {
    /// Draws the sequence's next token from its logits (and, if its request asks, the
    /// log-probabilities to report with it; none for a stop token, which is not handed on).
    pub(super) fn pick(&mut self) -> Pick {
        let sampling = &self.request.sampling;
        let token = sampling.draw(&self.logits, &mut self.rng);
        let (logprob, top) = match self.request.logprobs {
            Some(k) if !sampling.stop_tokens.contains(&token) => {
                let (logprob, top) = log_probs(&self.logits, token, k);
                (Some(logprob), top)
            }
            _ => (None, Vec::new()),
        };
        Pick {
            token,
            logprob,
            top,
        }
    }
}

/// A token drawn for a sequence, not yet handed on ([`Row::pick`]).
pub(super) struct Pick {
    pub token: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
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
