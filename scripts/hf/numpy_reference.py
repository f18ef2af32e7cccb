"""An independent NumPy reference of a Relation model folder (`relation export --format hf`).

It reads `config.json` and `model.safetensors` and computes the model's next-token
log-probabilities in float64, written straight from the Rust references (`relation-core`) and
the model's wiring (`relation-model`), without torch and without sharing code with the
PyTorch implementation the folder carries (`modeling_relation.py`). Where that implementation
takes a fast route (the factorized Full Relation, the chunkwise Linear Relation), this one
takes the defining one:

- `F`: the materialized relation matrix `R` and its row softmax (`naive_parallel_relation`,
  `naive_exchange_only_relation`);
- `L`: the token-by-token recurrence (`naive_recurrent_linear_relation`) with the log-decay
  gate of `kda_log_gates`;
- `A`: causal softmax attention with RoPE on queries and keys.

Use: `model = load_folder(path)`, then `model.token_logprobs(tokens)` for `[B, T]` token ids.
Errors in the folder (another `model_type`, a missing or misshapen tensor, an unsupported
mixer) raise `FolderError`.
"""

import json
import math
import os
import struct

import numpy as np
from safetensors.numpy import load_file

#: The mixers a folder may use: Full Relation, Linear Relation, attention.
MIXERS = "FLA"

#: `eps` of the L2 normalisation in Linear Relation.
L2_NORM_EPS = 1e-6


class FolderError(ValueError):
    """A model folder this reference cannot read: the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------
# Reading the folder
# ---------------------------------------------------------------------------------------------


class ModelConfig:
    """The fields of `config.json` the forward pass needs, checked."""

    def __init__(self, raw, path="config.json"):
        def field(name, kind, default=None):
            value = raw.get(name, default)
            if value is None:
                raise FolderError(f"{path}: missing key {name!r}")
            try:
                return kind(value)
            except (TypeError, ValueError) as err:
                raise FolderError(f"{path}: bad {name!r} = {value!r}: {err}") from None

        if raw.get("model_type") != "relation":
            raise FolderError(
                f"{path}: model_type is {raw.get('model_type')!r}, expected 'relation'"
            )
        self.vocab_size = field("vocab_size", int)
        self.hidden_size = field("hidden_size", int)
        self.num_layers = field("num_hidden_layers", int)
        self.heads = field("num_attention_heads", int)
        self.d_ff = field("intermediate_size", int)
        self.pattern = "".join(c for c in field("mixer_pattern", str) if not c.isspace())
        self.tau = field("tau", float)
        self.rope_theta = field("rope_theta", float)
        self.eps = field("rms_norm_eps", float)
        self.givens = field("givens", bool, True)
        self.info_projection = field("info_projection", bool, True)
        self.exchange_only = field("exchange_only", bool, False)
        if not raw.get("tie_word_embeddings", True):
            raise FolderError(f"{path}: tie_word_embeddings is false; Relation models tie them")

        for name in ("vocab_size", "hidden_size", "num_layers", "heads", "d_ff"):
            if getattr(self, name) <= 0:
                raise FolderError(f"{path}: {name} must be positive")
        if self.hidden_size % self.heads:
            raise FolderError(
                f"{path}: hidden_size {self.hidden_size} does not split into {self.heads} heads"
            )
        self.head_dim = self.hidden_size // self.heads
        if self.head_dim % 2:
            raise FolderError(f"{path}: head dimension {self.head_dim} is odd (RoPE pairs channels)")
        if self.givens and self.heads % 2:
            raise FolderError(f"{path}: Givens mixing needs an even head count, got {self.heads}")
        if not self.pattern or any(c not in MIXERS for c in self.pattern):
            raise FolderError(f"{path}: mixer_pattern {self.pattern!r} must be letters of {MIXERS!r}")
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise FolderError(f"{path}: tau must be finite and positive, got {self.tau}")
        if not (self.rope_theta > 1 and math.isfinite(self.rope_theta)):
            raise FolderError(f"{path}: rope_theta must be finite and > 1, got {self.rope_theta}")
        gate_rank = raw.get("gate_rank") or self.head_dim  # 0 / absent: the head dimension
        self.gate_rank = int(gate_rank)
        self.mixers = [self.pattern[i % len(self.pattern)] for i in range(self.num_layers)]


def expected_tensors(config):
    """Every tensor of the folder with its shape, `{name: shape}`, in the folder's layout.

    `info_projection` and `exchange_only` switch only the `F` layers (`L` layers always have
    `info_proj`); the output head is tied to the embedding and not stored.
    """
    d, h, d_ff, r = config.hidden_size, config.heads, config.d_ff, config.gate_rank
    shapes = {"model.embed_tokens.weight": (config.vocab_size, d), "model.norm.weight": (d,)}
    for i, kind in enumerate(config.mixers):
        at = f"model.layers.{i}."
        shapes[at + "input_layernorm.weight"] = (d,)
        shapes[at + "post_attention_layernorm.weight"] = (d,)
        shapes[at + "mlp.gate_proj.weight"] = (d_ff, d)
        shapes[at + "mlp.up_proj.weight"] = (d_ff, d)
        shapes[at + "mlp.down_proj.weight"] = (d, d_ff)
        mixer = at + "mixer."
        if kind == "A":
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                shapes[mixer + name + ".weight"] = (d, d)
            continue
        for name in ("p1_proj", "p2_proj", "o_proj"):
            shapes[mixer + name + ".weight"] = (d, d)
        if kind == "L" or config.info_projection:
            shapes[mixer + "info_proj.weight"] = (d, d)
        if config.givens:
            shapes[mixer + "givens_angles"] = (h // 2,)
        if kind == "F":
            shapes[mixer + "count_lambda"] = (1,)
        else:
            shapes[mixer + "gate.down_proj.weight"] = (r, d)
            shapes[mixer + "gate.up_proj.weight"] = (d, r)
            shapes[mixer + "gate.A_log"] = (h,)
            shapes[mixer + "gate.dt_bias"] = (d,)
    return shapes


def _read_safetensors_raw(path):
    """Reads a safetensors file by hand: for element types NumPy lacks (bfloat16), which
    `safetensors.numpy` refuses. Returns `{name: float32 array}`."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    kinds = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in kinds:
            raise FolderError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        start, end = meta["data_offsets"]
        raw = np.frombuffer(data[start:end], dtype=kinds[meta["dtype"]])
        if meta["dtype"] == "BF16":  # the high half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.reshape(meta["shape"]).astype(np.float32)
    return out


def load_tensors(path):
    """`{name: array}` of a safetensors file (any float type, bfloat16 included)."""
    if not os.path.isfile(path):
        raise FolderError(f"{path}: no such file")
    try:
        return load_file(path)
    except Exception:  # bfloat16 (no NumPy dtype) or a damaged file
        try:
            return _read_safetensors_raw(path)
        except FolderError:
            raise
        except Exception as err:
            raise FolderError(f"{path}: unreadable safetensors file: {err}") from None


def load_folder(folder):
    """The model of a folder: reads and checks `config.json` and `model.safetensors`."""
    config_path = os.path.join(folder, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError) as err:
        raise FolderError(f"{config_path}: {err}") from None
    if not isinstance(raw, dict):
        raise FolderError(f"{config_path}: not a JSON object")
    config = ModelConfig(raw, config_path)
    weights_path = os.path.join(folder, "model.safetensors")
    return RelationNumpy(config, load_tensors(weights_path), weights_path)


# ---------------------------------------------------------------------------------------------
# Operations (float64)
# ---------------------------------------------------------------------------------------------


def sigmoid(x):
    """`1 / (1 + e^-x)` without overflow."""
    return np.exp(-np.logaddexp(0.0, -x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    """`log(1 + e^x)` without overflow."""
    return np.logaddexp(0.0, x)


def softmax(x, axis=-1):
    """Softmax along `axis`; every row must hold a finite entry."""
    z = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return z / np.sum(z, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def rms_norm(x, gamma, eps):
    """`x / sqrt(mean(x^2) + eps) * gamma` over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def dense(x, weight):
    """`x W^T` for a weight stored `[out, in]`. Shapes: `[.., in]` -> `[.., out]`."""
    return x @ weight.T


def split_heads(x, heads):
    """`[B, T, H*D]` -> `[B, T, H, D]`."""
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads)


def rope(x, base):
    """Half-split RoPE at positions `0..T`: channel `k` turns with channel `k + D/2` by
    `t * base^(-2k/D)`. Shapes: `[B, T, H, D]` -> same."""
    _, t, _, d = x.shape
    half = d // 2
    k = np.arange(half, dtype=np.float64)
    phase = np.arange(t, dtype=np.float64)[:, None] * base ** (-2.0 * k / d)  # [T, D/2]
    cos, sin = np.cos(phase)[None, :, None, :], np.sin(phase)[None, :, None, :]
    low, high = x[..., :half], x[..., half:]
    return np.concatenate([low * cos - high * sin, high * cos + low * sin], axis=-1)


def givens_pairs(heads, layer):
    """The `(a, b)` head pairs of layer `layer`, in angle order: `(0,1) (2,3) ...` on even
    layers, `(1,2) (3,4) ... (H-1,0)` on odd ones."""
    shift = layer % 2
    return [((2 * m + shift) % heads, (2 * m + 1 + shift) % heads) for m in range(heads // 2)]


def givens_mix(info, angles, layer):
    """`I~_a = cos I_a - sin I_b`, `I~_b = sin I_a + cos I_b` for every pair of the layer,
    one angle per pair. Shapes: `info` `[B, T, H, D]`, `angles` `[H/2]`; output as `info`."""
    out = np.array(info, copy=True)
    for (a, b), theta in zip(givens_pairs(info.shape[2], layer), angles):
        c, s = math.cos(theta), math.sin(theta)
        out[:, :, a] = c * info[:, :, a] - s * info[:, :, b]
        out[:, :, b] = s * info[:, :, a] + c * info[:, :, b]
    return out


def full_relation(p1, p2, info, lam, tau, exchange_only):
    """The materialized Self-Exchange Relation of every head.

    `R_ii = sigmoid(U_ii / tau)`, `R_ij = SiLU(U_ij) - lam log i` for `j < i`, `-inf` above;
    `Y_i = softmax(R_i) I~`. Exchange-only: no Self term, `R_ii = -inf` but `R_11 = 0`.

    Shapes: `p1`, `p2`, `info`: `[B, T, H, D]`; output `[B, T, H, D]`.
    """
    _, t, _, d = p1.shape
    u = np.einsum("bihd,bjhd->bhij", p1, p2) / math.sqrt(d)  # [B, H, T, T]
    rows, cols = np.arange(t)[:, None], np.arange(t)[None, :]
    history = cols < rows  # [T, T], j < i
    if exchange_only:
        r = np.where(history, silu(u), -np.inf)
        r[:, :, 0, 0] = 0.0  # the first row keeps its own information
    else:
        log_i = np.log(np.arange(1, t + 1, dtype=np.float64))[:, None]  # [T, 1], one-based i
        r = np.where(history, silu(u) - lam * log_i, -np.inf)
        self_score = sigmoid(np.einsum("bihd,bihd->bhi", p1, p2) / (math.sqrt(d) * tau))
        diag = np.arange(t)
        r[:, :, diag, diag] = self_score
    weights = softmax(r, axis=-1)  # [B, H, T, T]
    return np.einsum("bhij,bjhd->bihd", weights, info)


def log_decay_gates(x, down, up, a_log, dt_bias, heads):
    """`log alpha = -exp(A_log_h) softplus(W_up W_down x + dt_bias)`, all `<= 0`.
    Shapes: `x` `[B, T, d]` -> `[B, T, H, D]`."""
    pre = split_heads(dense(dense(x, down), up) + dt_bias, heads)  # [B, T, H, D]
    return -np.exp(a_log)[None, None, :, None] * softplus(pre)


def linear_relation(p1, p2, info, log_alpha, tau):
    """Linear Relation token by token from a zero state.

    `S_t = sigmoid(p1_t . p2_t / (tau sqrt(D)))`, `p^ = p / sqrt(|p|^2 + eps)`;
    `C^- = Diag(alpha_t) C`, `Y_t = I~_t + S_t (C^-)^T p1^_t` (read before write),
    `C = C^- + S_t p2^_t I~_t^T`.

    Shapes: all `[B, T, H, D]`; state `[B, H, D, D]` (key channel, value channel).
    """
    b, t, h, d = p1.shape
    s = sigmoid(np.sum(p1 * p2, axis=-1) / (math.sqrt(d) * tau))  # [B, T, H]
    q = p1 / np.sqrt(np.sum(p1 * p1, axis=-1, keepdims=True) + L2_NORM_EPS)
    k = p2 / np.sqrt(np.sum(p2 * p2, axis=-1, keepdims=True) + L2_NORM_EPS)
    state = np.zeros((b, h, d, d))
    y = np.empty_like(info)
    for i in range(t):
        state = state * np.exp(log_alpha[:, i])[..., None]  # rows scaled per key channel
        read = s[:, i, :, None] * np.einsum("bhk,bhkv->bhv", q[:, i], state)  # [B, H, D]
        y[:, i] = info[:, i] + read
        state = state + s[:, i, :, None, None] * k[:, i, :, :, None] * info[:, i, :, None, :]
    return y


def causal_attention(q, k, v):
    """Softmax attention with scale `1 / sqrt(D)`, row `i` over keys `j <= i`.
    Shapes: `[B, T, H, D]` each; output `[B, T, H, D]`."""
    t, d = q.shape[1], q.shape[-1]
    scores = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d)  # [B, H, T, T]
    future = np.arange(t)[None, :] > np.arange(t)[:, None]
    weights = softmax(np.where(future, -np.inf, scores), axis=-1)
    return np.einsum("bhij,bjhd->bihd", weights, v)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class RelationNumpy:
    """The model of a folder in float64. Construct with `load_folder`."""

    def __init__(self, config, tensors, source="model.safetensors"):
        self.config = config
        expected = expected_tensors(config)
        missing = [name for name in expected if name not in tensors]
        if missing:
            raise FolderError(
                f"{source} lacks {len(missing)} tensor(s), e.g. {missing[:3]}"
            )
        unexpected = sorted(set(tensors) - set(expected))
        if unexpected:
            raise FolderError(
                f"{source} has {len(unexpected)} tensor(s) this config does not use, "
                f"e.g. {unexpected[:3]}"
            )
        self.w = {}
        for name, shape in expected.items():
            value = np.asarray(tensors[name])
            if tuple(value.shape) != shape:
                raise FolderError(
                    f"{source}: {name} has shape {list(value.shape)}, expected {list(shape)}"
                )
            value = value.astype(np.float64)
            if not np.all(np.isfinite(value)):
                raise FolderError(f"{source}: {name} holds non-finite values")
            self.w[name] = value

    def _mixer(self, i, kind, x):
        """Mixer of layer `i` on its normed input `x` `[B, T, d]` -> `[B, T, d]`."""
        c, w = self.config, self.w
        at = f"model.layers.{i}.mixer."
        if kind == "A":
            q = rope(split_heads(dense(x, w[at + "q_proj.weight"]), c.heads), c.rope_theta)
            k = rope(split_heads(dense(x, w[at + "k_proj.weight"]), c.heads), c.rope_theta)
            v = split_heads(dense(x, w[at + "v_proj.weight"]), c.heads)
            y = causal_attention(q, k, v)
        else:
            p1 = rope(split_heads(dense(x, w[at + "p1_proj.weight"]), c.heads), c.rope_theta)
            p2 = rope(split_heads(dense(x, w[at + "p2_proj.weight"]), c.heads), c.rope_theta)
            info = x if at + "info_proj.weight" not in w else dense(x, w[at + "info_proj.weight"])
            info = split_heads(info, c.heads)
            if c.givens:
                info = givens_mix(info, w[at + "givens_angles"], i)
            if kind == "F":
                lam = float(w[at + "count_lambda"][0])
                y = full_relation(p1, p2, info, lam, c.tau, c.exchange_only)
            else:
                log_alpha = log_decay_gates(
                    x,
                    w[at + "gate.down_proj.weight"],
                    w[at + "gate.up_proj.weight"],
                    w[at + "gate.A_log"],
                    w[at + "gate.dt_bias"],
                    c.heads,
                )
                y = linear_relation(p1, p2, info, log_alpha, c.tau)
        b, t = x.shape[:2]
        return dense(y.reshape(b, t, -1), w[at + "o_proj.weight"])

    def logits(self, tokens):
        """Next-token logits. Shapes: `tokens` `[B, T]` ints -> `[B, T, V]` float64."""
        c, w = self.config, self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be [B, T] with T > 0, got shape {list(tokens.shape)}")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size}), got {tokens.min()}..{tokens.max()}")
        h = w["model.embed_tokens.weight"][tokens]  # [B, T, d]
        for i, kind in enumerate(c.mixers):
            at = f"model.layers.{i}."
            h = h + self._mixer(i, kind, rms_norm(h, w[at + "input_layernorm.weight"], c.eps))
            n = rms_norm(h, w[at + "post_attention_layernorm.weight"], c.eps)
            gate = silu(dense(n, w[at + "mlp.gate_proj.weight"]))
            h = h + dense(gate * dense(n, w[at + "mlp.up_proj.weight"]), w[at + "mlp.down_proj.weight"])
        h = rms_norm(h, w["model.norm.weight"], c.eps)
        return h @ w["model.embed_tokens.weight"].T

    def token_logprobs(self, tokens):
        """`out[b, k] = log p(tokens[b, k+1] | tokens[b, :k+1])` in nats.
        Shapes: `tokens` `[B, T]` -> `[B, T-1]` float64."""
        tokens = np.asarray(tokens, dtype=np.int64)
        logp = log_softmax(self.logits(tokens), axis=-1)  # [B, T, V]
        nxt = tokens[:, 1:]
        return np.take_along_axis(logp[:, :-1], nxt[..., None], axis=-1)[..., 0]

    def greedy(self, prompt, new_tokens):
        """Greedy continuation of one prompt (a list of ids), recomputing the whole prefix at
        each step. Returns the new ids."""
        ids = list(prompt)
        for _ in range(new_tokens):
            ids.append(int(np.argmax(self.logits(np.array([ids]))[0, -1])))
        return ids[len(prompt):]
