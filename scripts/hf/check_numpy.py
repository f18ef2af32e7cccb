#!/usr/bin/env python3
"""Checks a Relation model folder against per-token log-probabilities, with NumPy only.

    python scripts/hf/check_numpy.py FOLDER PER_TOKEN.jsonl [--tol 1e-4]

Recomputes every log-probability of the per-token file (`relation eval --per-token FILE`)
with the float64 reference of `numpy_reference.py` from the folder's `config.json` and
`model.safetensors`, and prints the worst absolute difference and the number of tokens.

Exit status: 0 when the worst difference is at most `--tol`, 1 when it is larger, 2 for
input that cannot be checked (a folder that is not a Relation model, a missing or misshapen
tensor, a malformed per-token file, a token id outside the vocabulary).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from numpy_reference import FolderError, load_folder  # noqa: E402
from per_token import Difference, PerTokenError, batches, read_per_token  # noqa: E402


def reference_cost(config):
    """Elements per token of the reference's largest intermediate for a length-`T` batch."""
    return lambda t: max(config.heads * t * 4, config.vocab_size * 2, config.d_ff * 4)


def compare_reference(model, sequences):
    """The reference's log-probabilities against the file's: a `Difference`."""
    difference = Difference()
    for indices, tokens in batches(sequences, reference_cost(model.config)):
        computed = model.token_logprobs(tokens)  # [B, T-1]
        for row, index in enumerate(indices):
            difference.add(index, sequences[index][1], computed[row])
    return difference


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the exported model folder")
    parser.add_argument("per_token", help="the per-token JSON Lines file")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest accepted |difference| (nats)")
    args = parser.parse_args(argv)

    try:
        model = load_folder(args.folder)
        sequences = read_per_token(args.per_token, model.config.vocab_size)
    except (FolderError, PerTokenError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    difference = compare_reference(model, sequences)
    print(f"{len(sequences)} sequences, {difference.count} tokens")
    print(difference.describe("numpy reference vs file", args.tol))
    return 0 if difference.passes(args.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
