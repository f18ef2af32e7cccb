#!/usr/bin/env python3
"""Checks a Relation model folder through Hugging Face transformers and PyTorch.

    python scripts/hf/check_torch.py FOLDER PER_TOKEN.jsonl [--tol 1e-4] [--prompt TEXT]

Loads the folder as a user would, `AutoModelForCausalLM.from_pretrained(FOLDER,
trust_remote_code=True)` in float32, and:

1. recomputes every log-probability of the per-token file (`relation eval --per-token FILE`)
   and prints the worst absolute difference;
2. compares the same log-probabilities with the float64 NumPy reference
   (`numpy_reference.py`), which shares no code with the folder's `modeling_relation.py`;
3. loads the tokenizer with `AutoTokenizer.from_pretrained(FOLDER)`, continues `--prompt`
   greedily with `model.generate(max_new_tokens=40, do_sample=False)` and prints the text, and
   says how many of the new tokens the NumPy reference's greedy decoding agrees with.

Exit status: 0 when both worst differences are at most `--tol`, 1 when one is larger, 2 for
input that cannot be checked (as `check_numpy.py`, plus a folder transformers cannot load).
Needs torch and transformers; not part of CI.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from numpy_reference import FolderError, load_folder  # noqa: E402
from per_token import Difference, PerTokenError, batches, read_per_token  # noqa: E402


def load_model(folder, torch, transformers):
    """The folder's model in float32 through the Auto classes; raises `FolderError` when
    transformers cannot load it or reports missing, unexpected or misshapen weights."""
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    # transformers 4.56 renamed `torch_dtype` to `dtype`.
    dtype_arg = {"dtype": torch.float32} if version >= (4, 56) else {"torch_dtype": torch.float32}
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            folder, trust_remote_code=True, output_loading_info=True, **dtype_arg
        )
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise FolderError(f"{folder}: transformers cannot load it: {err}") from None
    problems = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if problems or info.get("error_msgs"):
        raise FolderError(f"{folder}: loading reported {problems or info['error_msgs']}")
    return model.eval()


def torch_logprobs(model, tokens, device, torch):
    """`out[b, k] = log p(tokens[b, k+1] | tokens[b, :k+1])` from the model, `[B, T-1]`
    float64 (log-softmax of the float32 logits taken in float64)."""
    ids = torch.as_tensor(tokens, device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.double()  # [B, T, V]
    logp = torch.log_softmax(logits, dim=-1)[:, :-1]
    return logp.gather(-1, ids[:, 1:, None])[..., 0].cpu().numpy()


def generate(model, folder, prompt, new_tokens, device, torch, transformers):
    """Greedy continuation of `prompt` through `generate`; returns `(prompt ids, new ids,
    text)`. Raises `FolderError` when the tokenizer cannot be loaded."""
    try:
        # transformers 5 reads config.json first, whose auto_map names the folder's code.
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    except (OSError, ValueError, KeyError) as err:
        raise FolderError(f"{folder}: the tokenizer cannot be loaded: {err}") from None
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not prompt_ids:
        if model.config.bos_token_id is None:
            raise FolderError("the prompt encodes to no token and the config has no bos_token_id")
        prompt_ids = [model.config.bos_token_id]
    ids = torch.tensor([prompt_ids], device=device)
    eos = model.config.eos_token_id
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=eos if eos is not None else 0,
        )
    new_ids = out[0, len(prompt_ids) :].tolist()
    return prompt_ids, new_ids, tokenizer.decode(out[0].tolist(), skip_special_tokens=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the exported model folder")
    parser.add_argument("per_token", help="the per-token JSON Lines file")
    parser.add_argument("--tol", type=float, default=1e-4, help="largest accepted |difference| (nats)")
    parser.add_argument("--prompt", default="Once upon a time", help="text to continue")
    parser.add_argument("--new-tokens", type=int, default=40, help="tokens to generate")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    args = parser.parse_args(argv)

    try:
        reference = load_folder(args.folder)
        sequences = read_per_token(args.per_token, reference.config.vocab_size)
    except (FolderError, PerTokenError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    import torch
    import transformers

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    # Full float32 products: TF32 would round the matmuls to 10-bit mantissas on the GPU.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        model = load_model(args.folder, torch, transformers).to(device)
    except FolderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {device}")

    config = reference.config

    def cost(t):  # elements per token of the largest intermediates, both implementations
        return max(config.heads * t * 8, config.vocab_size * 4, config.d_ff * 4)

    vs_file, vs_numpy = Difference(), Difference()
    for indices, tokens in batches(sequences, cost):
        computed = torch_logprobs(model, tokens, device, torch)  # [B, T-1]
        reference_lp = reference.token_logprobs(tokens)
        for row, index in enumerate(indices):
            vs_file.add(index, sequences[index][1], computed[row])
            vs_numpy.add(index, reference_lp[row], computed[row])
    print(f"{len(sequences)} sequences, {vs_file.count} tokens")
    print(vs_file.describe("torch vs file", args.tol))
    print(vs_numpy.describe("torch vs numpy reference", args.tol))

    try:
        prompt_ids, new_ids, text = generate(
            model, args.folder, args.prompt, args.new_tokens, device, torch, transformers
        )
    except FolderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"generate (greedy, {len(new_ids)} new tokens): {text!r}")
    expected = reference.greedy(prompt_ids, len(new_ids))
    agree = next((k for k, (a, b) in enumerate(zip(new_ids, expected)) if a != b), len(new_ids))
    print(f"numpy greedy decoding agrees on the first {agree} of {len(new_ids)} new tokens")

    return 0 if vs_file.passes(args.tol) and vs_numpy.passes(args.tol) else 1


if __name__ == "__main__":
    sys.exit(main())
