"""The per-token log-probability file of `relation eval --per-token FILE`, and comparisons
against it.

Format (JSON Lines): one object per evaluated sequence,
`{"tokens": [id0, ..., idn], "logprobs": [lp1, ..., lpn]}`, where
`logprobs[k] = log p(tokens[k+1] | tokens[0..=k])` in nats and every sequence starts at
position 0 on its own. Other keys are ignored; blank lines are skipped.
"""

import json
import math

import numpy as np


class PerTokenError(ValueError):
    """A per-token file that cannot be used: the message names the line and the problem."""


def read_per_token(path, vocab_size):
    """The sequences of a per-token file: a list of `(tokens [n+1] int64, logprobs [n]
    float64)`. Raises `PerTokenError` for unreadable JSON, missing or mistyped keys, a length
    mismatch, or a token id outside `[0, vocab_size)`."""
    sequences = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except OSError as err:
        raise PerTokenError(f"{path}: {err}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except ValueError as err:
            raise PerTokenError(f"{where}: not JSON: {err}") from None
        if not isinstance(record, dict) or "tokens" not in record or "logprobs" not in record:
            raise PerTokenError(f"{where}: expected an object with 'tokens' and 'logprobs'")
        tokens, logprobs = record["tokens"], record["logprobs"]
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise PerTokenError(f"{where}: 'tokens' must be a list of integers")
        if not isinstance(logprobs, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in logprobs
        ):
            raise PerTokenError(f"{where}: 'logprobs' must be a list of numbers")
        if not tokens:
            raise PerTokenError(f"{where}: 'tokens' is empty")
        if len(logprobs) != len(tokens) - 1:
            raise PerTokenError(
                f"{where}: {len(tokens)} tokens need {len(tokens) - 1} logprobs, got {len(logprobs)}"
            )
        bad = [t for t in tokens if not 0 <= t < vocab_size]
        if bad:
            raise PerTokenError(
                f"{where}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})"
            )
        sequences.append((np.array(tokens, dtype=np.int64), np.array(logprobs, dtype=np.float64)))
    if not sequences:
        raise PerTokenError(f"{path}: no sequences")
    return sequences


def batches(sequences, cost_per_token, budget=1 << 24):
    """Groups sequences of equal length into batches: yields `(indices, tokens [B, T])`.

    `cost_per_token(T)` is the number of elements one token of a length-`T` sequence makes the
    largest intermediate hold (e.g. `H * T` for a `T x T` relation per head); a batch stays
    within `budget` elements (at least one sequence)."""
    by_length = {}
    for index, (tokens, _) in enumerate(sequences):
        by_length.setdefault(len(tokens), []).append(index)
    for length, indices in sorted(by_length.items()):
        size = max(1, budget // max(1, length * cost_per_token(length)))
        for start in range(0, len(indices), size):
            chunk = indices[start : start + size]
            yield chunk, np.stack([sequences[i][0] for i in chunk])


class Difference:
    """The worst and mean absolute difference between two sets of per-token values."""

    def __init__(self):
        self.worst = 0.0
        self.where = None
        self.total = 0.0
        self.count = 0

    def add(self, sequence, expected, computed):
        """Adds one sequence's values (`[n]` each)."""
        if len(expected) == 0:
            return
        diff = np.abs(np.asarray(expected, dtype=np.float64) - np.asarray(computed, dtype=np.float64))
        diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN on either side fails
        position = int(np.argmax(diff))
        if self.where is None or diff[position] > self.worst:
            self.worst, self.where = float(diff[position]), (sequence, position)
        self.total += float(np.sum(diff))
        self.count += len(diff)

    def describe(self, what, tol):
        """One line: the worst difference, where, the mean, and the verdict against `tol`."""
        mean = self.total / self.count if self.count else 0.0
        at = f" (sequence {self.where[0]}, position {self.where[1]})" if self.where else ""
        verdict = "ok" if self.passes(tol) else "FAIL"
        return (
            f"{what}: worst |diff| {self.worst:.3e}{at}, mean {mean:.3e} over {self.count} tokens; "
            f"tol {tol:g}: {verdict}"
        )

    def passes(self, tol):
        return math.isfinite(self.worst) and self.worst <= tol
