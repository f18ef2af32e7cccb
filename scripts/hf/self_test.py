#!/usr/bin/env python3
"""Self-test of the Hugging Face export's Python side, on random folders (no Rust needed).

    python scripts/hf/self_test.py [--torch] [--keep DIR]

With NumPy and safetensors only, it checks the NumPy reference (causality, the first row of
a Full Relation being pure Self) and `check_numpy.py` (its verdicts and exit codes). With
`--torch` (needs torch and transformers) it also loads random folders through
`AutoModelForCausalLM` and checks the PyTorch implementation against the reference on every
mixer and ablation, in float32 and float64, plus causality, batching, the loss, the chunk
size of Linear Relation, padding, a save/load round trip and `generate`.

Prints one line per check and exits 1 if any fails.
"""

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import check_numpy  # noqa: E402
import make_random_folder  # noqa: E402
import numpy_reference as nr  # noqa: E402

#: Random folders: name -> make_random_folder arguments.
FOLDERS = {
    "f": ["--pattern", "F", "--layers", "2"],
    "l": ["--pattern", "L", "--layers", "2"],
    "a": ["--pattern", "A", "--layers", "2"],
    "lllf": ["--pattern", "LLLF", "--layers", "4"],
    "fla-no-givens": ["--pattern", "FLA", "--layers", "3", "--no-givens"],
    "f-info-from-input": ["--pattern", "FL", "--layers", "3", "--info-from-input"],
    "f-exchange-only": ["--pattern", "FL", "--layers", "3", "--exchange-only"],
    "lf-wide-gate": ["--pattern", "LF", "--layers", "2", "--gate-rank", "5", "--heads", "2", "--tau", "0.7"],
}


class Checks:
    """Collects pass/fail lines."""

    def __init__(self):
        self.failed = []

    def check(self, name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""))
        if not ok:
            self.failed.append(name)


def make(root, name, extra=()):
    path = os.path.join(root, name)
    args = make_random_folder.parser().parse_args([path, *FOLDERS.get(name, []), *extra])
    make_random_folder.make_folder(path, args)
    return path


def random_tokens(rng, vocab, batch, length):
    return rng.integers(0, vocab, size=(batch, length))


def run_check_numpy(argv):
    """Exit status and output of check_numpy.py."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = check_numpy.main(argv)
    return status, (out.getvalue() + err.getvalue()).strip().replace("\n", " | ")


def per_token_record(model, tokens, **extra):
    """A per-token file's record of `tokens` `[n]` with the reference's log-probabilities."""
    logprobs = model.token_logprobs(tokens[None])[0].tolist()
    return {"tokens": tokens.tolist(), "logprobs": logprobs, **extra}


def write_per_token(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def quarter_turns_ok(givens_mix, to_array):
    """A quarter turn of angle slot `m` moves head `a` of pair `m` to `b` and `-b` to `a`,
    leaving the other heads alone: pairing A on layer 0, B (with the wrap-around) on layer 1."""
    info = np.random.default_rng(5).standard_normal((1, 3, 8, 4))
    for layer, slot, a, b in ((0, 0, 0, 1), (0, 3, 6, 7), (1, 0, 1, 2), (1, 3, 7, 0)):
        angles = np.zeros(4)
        angles[slot] = math.pi / 2
        mixed = np.asarray(to_array(givens_mix(info, angles, layer)))
        others = [h for h in range(8) if h not in (a, b)]
        if not (
            np.allclose(mixed[:, :, b], info[:, :, a], atol=1e-12)
            and np.allclose(mixed[:, :, a], -info[:, :, b], atol=1e-12)
            and np.array_equal(mixed[:, :, others], info[:, :, others])
        ):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# NumPy
# ---------------------------------------------------------------------------------------------


def numpy_checks(root, checks):
    rng = np.random.default_rng(7)

    # The first row of the Full Relation is pure Self, whatever lambda, tau and the evidence.
    p1, p2, info = (rng.standard_normal((2, 6, 4, 8)) * 3 for _ in range(3))
    for exchange_only in (False, True):
        for lam, tau in ((0.5, 2.0), (3.0, 0.1)):
            y = nr.full_relation(p1, p2, info, lam, tau, exchange_only)
            checks.check(
                f"numpy F row 1 is I~_1 (exchange_only={exchange_only}, lambda={lam}, tau={tau})",
                np.array_equal(y[:, 0], info[:, 0]),
            )
    # Rows of the relation sum to one: a constant information vector passes unchanged.
    const = np.ones_like(info)
    y = nr.full_relation(p1, p2, const, 0.5, 2.0, False)
    checks.check("numpy F rows are distributions", np.allclose(y, 1.0, atol=1e-12))

    # Givens mixing is a rotation: preserves the norm, identity at angle 0.
    angles = rng.uniform(-3, 3, 2)
    mixed = nr.givens_mix(info, angles, layer=1)
    checks.check(
        "numpy Givens preserves norms",
        np.allclose(np.linalg.norm(mixed, axis=2), np.linalg.norm(info, axis=2), atol=1e-12),
    )
    checks.check("numpy Givens pairing B", nr.givens_pairs(4, 1) == [(1, 2), (3, 0)])
    checks.check("numpy Givens quarter turns", quarter_turns_ok(nr.givens_mix, np.asarray))

    # Causality of whole models: changing token k leaves log-probabilities before k alone.
    for name in FOLDERS:
        model = nr.load_folder(make(root, name))
        tokens = random_tokens(rng, model.config.vocab_size, 1, 24)
        base = model.token_logprobs(tokens)
        worst = 0.0
        for k in (1, 9, 23):
            changed = tokens.copy()
            changed[0, k] = (changed[0, k] + 1) % model.config.vocab_size
            # logprobs[j] reads tokens[0..=j] and scores tokens[j+1]: j < k - 1 is untouched.
            moved = model.token_logprobs(changed)[0, : k - 1] - base[0, : k - 1]
            worst = max(worst, np.abs(moved).max(initial=0))
        checks.check(f"numpy causal ({name})", worst <= 1e-12, f"{worst:.1e}")

    # check_numpy.py: verdicts and exit codes.
    folder = os.path.join(root, "lllf")
    model = nr.load_folder(folder)
    seqs = [random_tokens(rng, model.config.vocab_size, 1, n)[0] for n in (1, 5, 17, 17, 40)]
    records = [per_token_record(model, s, loss=0) for s in seqs]  # extra keys are ignored
    good = os.path.join(root, "good.jsonl")
    write_per_token(good, records)
    status, text = run_check_numpy([folder, good])
    checks.check("check_numpy exact file -> 0", status == 0, text)

    records[3]["logprobs"][5] += 3e-4
    off = os.path.join(root, "off.jsonl")
    write_per_token(off, records)
    status, text = run_check_numpy([folder, off])
    checks.check("check_numpy 3e-4 off -> 1", status == 1 and "sequence 3, position 5" in text, text)
    status, _ = run_check_numpy([folder, off, "--tol", "1e-3"])
    checks.check("check_numpy 3e-4 off with --tol 1e-3 -> 0", status == 0)

    bad_token = os.path.join(root, "bad_token.jsonl")
    write_per_token(bad_token, [{"tokens": [0, model.config.vocab_size], "logprobs": [-1.0]}])
    status, text = run_check_numpy([folder, bad_token])
    checks.check("check_numpy token outside vocabulary -> 2", status == 2, text)

    bad_len = os.path.join(root, "bad_len.jsonl")
    write_per_token(bad_len, [{"tokens": [0, 1, 2], "logprobs": [-1.0]}])
    status, text = run_check_numpy([folder, bad_len])
    checks.check("check_numpy logprobs length mismatch -> 2", status == 2, text)

    broken = os.path.join(root, "broken")
    shutil.copytree(folder, broken)
    config_path = os.path.join(broken, "config.json")
    config = json.load(open(config_path))
    json.dump({**config, "model_type": "llama"}, open(config_path, "w"))
    status, text = run_check_numpy([broken, good])
    checks.check("check_numpy model_type llama -> 2", status == 2, text)

    from safetensors.numpy import load_file, save_file

    json.dump(config, open(config_path, "w"))
    weights_path = os.path.join(broken, "model.safetensors")
    weights = load_file(os.path.join(folder, "model.safetensors"))
    save_file({k: v for k, v in weights.items() if k != "model.layers.3.mixer.count_lambda"}, weights_path)
    status, text = run_check_numpy([broken, good])
    checks.check("check_numpy missing tensor -> 2", status == 2, text)
    save_file({**weights, "model.layers.0.mixer.gate.A_log": np.zeros(3, np.float32)}, weights_path)
    status, text = run_check_numpy([broken, good])
    checks.check("check_numpy misshapen tensor -> 2", status == 2, text)

    # bfloat16 weights: read through the hand-written reader, values of the rounded weights.
    bf16 = make(root, "lllf-bf16", ["--pattern", "LLLF", "--dtype", "bfloat16"])
    full = nr.load_folder(folder).w["model.layers.0.mixer.p1_proj.weight"]
    half = nr.load_folder(bf16).w["model.layers.0.mixer.p1_proj.weight"]
    rel = np.abs(full - half).max() / np.abs(full).max()
    checks.check("numpy reads bfloat16 folders", 0 < rel < 2 ** -8, f"relative rounding {rel:.1e}")


# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------


def torch_checks(root, checks):
    import torch
    import transformers

    rng = np.random.default_rng(11)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")

    def load(folder, dtype):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            folder, trust_remote_code=True, dtype=dtype, output_loading_info=True
        )
        bad = {k: v for k, v in info.items() if v}
        checks.check(f"loads cleanly ({os.path.basename(folder)}, {dtype})", not bad, str(bad) if bad else "")
        return model.eval()

    def logprobs(model, tokens):
        ids = torch.as_tensor(tokens)
        with torch.no_grad():
            logits = model(input_ids=ids).logits.double()
        return torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].numpy()

    modeling = None
    for name in FOLDERS:
        folder = os.path.join(root, name)
        reference = nr.load_folder(folder)
        tokens = random_tokens(rng, reference.config.vocab_size, 3, 150)  # > 2 chunks of 64
        expected = reference.token_logprobs(tokens)
        for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-10)):
            model = load(folder, dtype)
            diff = np.abs(logprobs(model, tokens) - expected).max()
            checks.check(
                f"torch {str(dtype)[6:]} vs numpy ({name})", diff <= tol, f"worst {diff:.2e}, tol {tol:g}"
            )
        modeling = sys.modules[type(model).__module__]
        tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        checks.check(f"lm_head tied ({name})", tied)

        # Causality and batching (float64: exact up to summation order).
        ids = tokens[:1, :40]
        base = logprobs(model, ids)
        changed = ids.copy()
        changed[0, 20] = (changed[0, 20] + 1) % reference.config.vocab_size
        moved = np.abs(logprobs(model, changed)[0, :19] - base[0, :19]).max()
        checks.check(f"torch causal ({name})", moved <= 1e-12, f"{moved:.1e}")
        alone = np.concatenate([logprobs(model, tokens[i : i + 1]) for i in range(3)])
        batched = np.abs(alone - logprobs(model, tokens)).max()
        checks.check(f"torch batch rows independent ({name})", batched <= 1e-12, f"{batched:.1e}")

    # The first row of the factorized Full Relation is pure Self; it equals the materialized one.
    g = torch.Generator().manual_seed(3)
    p1, p2, info = (torch.randn(2, 70, 4, 8, generator=g, dtype=torch.float64) * 3 for _ in range(3))
    for exchange_only in (False, True):
        lam = torch.tensor([0.7], dtype=torch.float64)
        y = modeling.full_relation(p1, p2, info, lam, 0.5, exchange_only)
        checks.check(
            f"torch F row 1 is I~_1 (exchange_only={exchange_only})", torch.equal(y[:, 0], info[:, 0])
        )
        materialized = nr.full_relation(p1.numpy(), p2.numpy(), info.numpy(), 0.7, 0.5, exchange_only)
        diff = np.abs(y.numpy() - materialized).max()
        checks.check(
            f"torch factorized F = numpy materialized F (exchange_only={exchange_only})",
            diff <= 1e-12,
            f"{diff:.1e}",
        )
    def torch_givens(x, angles, layer):
        return modeling.givens_mix(torch.as_tensor(x), torch.as_tensor(angles), layer).numpy()

    checks.check("torch Givens quarter turns", quarter_turns_ok(torch_givens, np.asarray))
    # Strong evidence: the factorized form stays finite where exp(U) would overflow.
    y = modeling.full_relation(p1 * 40, p2 * 40, info, lam, 2.0, False)
    checks.check("torch F finite at |U| ~ 1e4", bool(torch.isfinite(y).all()))

    # Linear Relation: the chunk size does not change the function; strong gates are exact.
    log_alpha = -torch.rand(2, 70, 4, 8, generator=g, dtype=torch.float64) * 30
    outs = [modeling.linear_relation(p1, p2, info, log_alpha, 2.0, chunk=c) for c in (1, 7, 64, 128)]
    spread = max((o - outs[0]).abs().max().item() for o in outs)
    expected = nr.linear_relation(p1.numpy(), p2.numpy(), info.numpy(), log_alpha.numpy(), 2.0)
    diff = np.abs(outs[2].numpy() - expected).max()
    checks.check("torch L chunk sizes 1/7/64/128 agree", spread <= 1e-12, f"{spread:.1e}")
    checks.check("torch chunked L = numpy recurrent L (gates down to -30)", diff <= 1e-12, f"{diff:.1e}")

    # Loss: mean next-token cross entropy, labels shifted inside, -100 ignored.
    folder = os.path.join(root, "lllf")
    model = load(folder, torch.float64)
    tokens = random_tokens(rng, model.config.vocab_size, 2, 30)
    labels = tokens.copy()
    labels[1, 10:] = -100
    with torch.no_grad():
        loss = model(input_ids=torch.as_tensor(tokens), labels=torch.as_tensor(labels)).loss.item()
    lp = nr.load_folder(folder).token_logprobs(tokens)
    expected = -np.concatenate([lp[0], lp[1, :9]]).mean()
    checks.check(
        "torch loss = mean NLL, -100 ignored", abs(loss - expected) <= 1e-10, f"{loss:.6f} vs {expected:.6f}"
    )

    # Padding: left padding is refused, right padding leaves the real tokens alone.
    ids = torch.as_tensor(tokens)
    left = torch.ones_like(ids)
    left[0, :3] = 0
    try:
        model(input_ids=ids, attention_mask=left)
        refused = False
    except ValueError as err:
        refused = "left padding" in str(err)
    checks.check("torch refuses left padding", refused)
    right = torch.ones_like(ids)
    right[0, -3:] = 0
    with torch.no_grad():
        same = torch.equal(model(input_ids=ids, attention_mask=right).logits, model(input_ids=ids).logits)
    checks.check("torch accepts right padding", same)

    # save_pretrained round trip keeps the tie and the function.
    saved = os.path.join(root, "saved")
    model.save_pretrained(saved)
    again = load(saved, torch.float64)
    with torch.no_grad():
        same = torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)
    checks.check("save_pretrained round trip", same)

    # generate without a cache: greedy tokens equal the NumPy reference's greedy decoding.
    for dtype in (torch.float32, torch.float64):
        model = load(folder, dtype)
        prompt = [int(t) for t in random_tokens(rng, model.config.vocab_size, 1, 5)[0]]
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0
            )
        new = out[0, len(prompt) :].tolist()
        expected = nr.load_folder(folder).greedy(prompt, 20)
        checks.check(f"generate {str(dtype)[6:]} = numpy greedy", new == expected, f"{new[:8]}...")
        with torch.no_grad():
            batch = model.generate(
                input_ids=torch.tensor([prompt, prompt[::-1]]),
                max_new_tokens=8,
                do_sample=False,
                pad_token_id=0,
            )
        checks.check(f"generate batch of 2 ({str(dtype)[6:]})", batch[0, len(prompt) :].tolist() == new[:8])

    # bfloat16 parameters: loads, runs, and stays close to the reference of the same weights.
    bf16 = os.path.join(root, "lllf-bf16")
    model = load(bf16, torch.bfloat16)
    tokens = random_tokens(rng, model.config.vocab_size, 2, 40)
    diff = np.abs(logprobs(model, tokens) - nr.load_folder(bf16).token_logprobs(tokens)).max()
    checks.check("torch bfloat16 runs near the reference", diff < 0.5, f"worst {diff:.2e}")

    # A folder with a tokenizer: the check_torch.py flow end to end.
    text = os.path.join(HERE, "..", "..", "relation-train", "data", "moby_dick.txt")
    if os.path.isfile(text):
        folder = make(root, "lllf-tok", ["--pattern", "LLLF", "--vocab", "300", "--tokenizer-from", text])
        reference = nr.load_folder(folder)
        seqs = [random_tokens(rng, reference.config.vocab_size, 1, n)[0] for n in (12, 33)]
        per_token = os.path.join(root, "tok.jsonl")
        write_per_token(per_token, [per_token_record(reference, s) for s in seqs])
        import check_torch

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = check_torch.main([folder, per_token, "--device", "cpu"])
        print("  | " + out.getvalue().strip().replace("\n", "\n  | "))
        checks.check("check_torch on a folder with a tokenizer -> 0", status == 0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", action="store_true", help="also check the PyTorch implementation")
    parser.add_argument("--keep", metavar="DIR", help="write the random folders here and keep them")
    args = parser.parse_args(argv)
    root = args.keep or tempfile.mkdtemp(prefix="relation-hf-")
    os.makedirs(root, exist_ok=True)
    checks = Checks()
    try:
        numpy_checks(root, checks)
        if args.torch:
            torch_checks(root, checks)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{len(checks.failed)} failed" if checks.failed else "all checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
