#!/usr/bin/env python3
"""Writes a small Relation model folder with random weights, in the layout of
`relation export --format hf`, so that the NumPy reference and the PyTorch implementation can be
compared without the Rust binary.

    python scripts/hf/make_random_folder.py OUT_DIR --pattern LLLF [--layers 4 --hidden 32 ...]

It writes `config.json`, `model.safetensors` and the two Python files of
`relation-train/hf/`; with `--tokenizer-from TEXT` (needs the `tokenizers` package) also a
byte-level BPE `tokenizer.json` trained on TEXT like the trainer's, `tokenizer_config.json` and
`generation_config.json`, with the vocabulary size taken from the tokenizer.

The weights are drawn so that every part of the forward pass matters: unit-variance
activations, Givens angles over the whole circle, `lambda` away from 0, retention gates from
KDA's initialisation with noise.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from numpy_reference import ModelConfig, expected_tensors  # noqa: E402

#: The Python files the exporter copies into every folder.
HF_CODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "relation-train", "hf")
CODE_FILES = ("configuration_relation.py", "modeling_relation.py")
EOT = "<|endoftext|>"


def config_json(args, vocab_size, eot_id):
    """The `config.json` of the folder, with every key the exporter writes."""
    return {
        "model_type": "relation",
        "architectures": ["RelationForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_relation.RelationConfig",
            "AutoModelForCausalLM": "modeling_relation.RelationForCausalLM",
        },
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "intermediate_size": args.ffn,
        "mixer_pattern": args.pattern,
        "tau": args.tau,
        "lambda_init": args.lambda_init,
        "lambda_trainable": True,
        "rope_theta": args.rope_theta,
        "rms_norm_eps": 1e-6,
        "gate_rank": args.gate_rank or args.hidden // args.heads,
        "givens": not args.no_givens,
        "info_projection": not args.info_from_input,
        "exchange_only": args.exchange_only,
        "linear_mode": "recurrent",
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
        "torch_dtype": args.dtype,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "relation_format": 1,
    }


def random_tensor(name, shape, rng, args):
    """A random value for tensor `name` of `shape` (float32)."""
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        value = 1.0 + 0.1 * rng.standard_normal(shape)
    elif name == "model.embed_tokens.weight":
        value = rng.standard_normal(shape) * (2.0 / math.sqrt(shape[1]))  # logits of a few nats
    elif name.endswith("givens_angles"):
        value = rng.uniform(-math.pi, math.pi, shape)
    elif name.endswith("count_lambda"):
        value = rng.uniform(0.2, 0.8, shape)
    elif name.endswith("gate.A_log"):
        value = np.log(rng.uniform(1.0, 16.0, shape))
    elif name.endswith("gate.dt_bias"):
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), shape))
        value = np.log(np.expm1(dt)) + 0.5 * rng.standard_normal(shape)
    elif name.endswith(".weight") and len(shape) == 2:
        value = rng.standard_normal(shape) * (args.scale / math.sqrt(shape[1]))  # [out, in]
    else:
        raise ValueError(f"no random rule for tensor {name}")
    return value.astype(np.float32)


def bfloat16_bytes(values):
    """float32 values rounded to bfloat16 (nearest, ties to even), as little-endian bytes."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path, tensors, dtype):
    """Writes `tensors` as float32 (through `safetensors`) or bfloat16 (by hand: NumPy has
    no bfloat16), with the `format: pt` metadata transformers expects."""
    if dtype == "float32":
        save_file(tensors, path, metadata={"format": "pt"})
        return
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        blob = bfloat16_bytes(tensors[name])
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def train_tokenizer(text_path, vocab_size, out_dir):
    """A byte-level BPE tokenizer trained on `text_path` as the trainer trains its own
    (bytes as the alphabet, `<|endoftext|>` as the one special token); writes
    `tokenizer.json` and returns `(vocabulary size, id of <|endoftext|>)`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = byte_level
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([text_path], trainer)
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    return tokenizer.get_vocab_size(), tokenizer.token_to_id(EOT)


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def make_folder(out_dir, args):
    """Writes the folder described by `args` (the parsed command line) to `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    vocab_size, eot_id = args.vocab, None
    if args.tokenizer_from:
        vocab_size, eot_id = train_tokenizer(args.tokenizer_from, args.vocab, out_dir)
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 256,
            "clean_up_tokenization_spaces": False,
            "eos_token": EOT,
            "bos_token": EOT,
        }
        write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config)
        generation = {"_from_model_config": True, "eos_token_id": eot_id, "bos_token_id": eot_id}
        write_json(os.path.join(out_dir, "generation_config.json"), generation)
    raw = config_json(args, vocab_size, eot_id)
    rng = np.random.default_rng(args.seed)
    shapes = expected_tensors(ModelConfig(raw))
    tensors = {name: random_tensor(name, shape, rng, args) for name, shape in shapes.items()}
    write_json(os.path.join(out_dir, "config.json"), raw)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, args.dtype)
    for name in CODE_FILES:
        shutil.copyfile(os.path.join(HF_CODE_DIR, name), os.path.join(out_dir, name))


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--pattern", default="LLLF", help="mixer letters F/L/A, repeated over layers")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32, help="model width d")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=48, help="SwiGLU hidden width")
    p.add_argument("--vocab", type=int, default=97)
    p.add_argument("--gate-rank", type=int, default=0, help="0: the head dimension")
    p.add_argument("--tau", type=float, default=2.0)
    p.add_argument("--lambda-init", type=float, default=0.5)
    p.add_argument("--rope-theta", type=float, default=1e4)
    p.add_argument("--no-givens", action="store_true")
    p.add_argument("--info-from-input", action="store_true", help="the I = X ablation (F layers)")
    p.add_argument("--exchange-only", action="store_true", help="the Exchange-only ablation (F layers)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--scale", type=float, default=1.0, help="gain of the random linear weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-from", metavar="TEXT", help="train a tokenizer on this text file")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    make_folder(args.out_dir, args)
    print(f"wrote {args.out_dir} ({args.pattern}, {args.layers} layers, d {args.hidden})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
