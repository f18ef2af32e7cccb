"""PyTorch implementation of the Relation language model for Hugging Face transformers.

`relation export --format hf` writes this file next to `config.json` and `model.safetensors`;
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` loads it. It computes
the same function as the Rust model (`relation-model/src/model.rs`), whose maths is
`docs/maths.md`:

```text
h   = Embed(tokens)                                   [B, T, d]
h   = h + Mixer_l(RMSNorm(h))                         mixer of layer l from `mixer_pattern`
h   = h + W_down (SiLU(W_gate n) * W_up n),  n = RMSNorm(h)
out = RMSNorm(h) Embed^T                              tied output head -> logits [B, T, V]
```

with three mixers:

- `F`, Full (Self-Exchange) Relation (maths sections 1, 2, 5), computed in the factorized
  form `Y_i = I~_i + g_i (Ibar_i - I~_i)` that the fused kernels use;
- `L`, Linear Relation (sections 6, 7), computed chunkwise (the same function as the token
  recurrence) with KDA's log-decay gate;
- `A`, causal softmax attention with RoPE on queries and keys (the baseline).

Only the projections run in the parameters' dtype; RoPE, Givens mixing, the relations,
softmaxes, logs and recurrences run in float32 (float64 for a float64 model), and their outputs
return to the parameters' dtype before the output projection. The model keeps no cache:
`generate` recomputes the whole prefix at every step. The file is self-contained (besides torch
and transformers it imports only its configuration) because the exporter embeds it.
"""

import math

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

try:
    from transformers import GenerationMixin
except ImportError:  # older releases export it only from the generation package
    from transformers.generation import GenerationMixin

try:
    # transformers >= 5: init functions that leave already loaded tensors alone.
    from transformers import initialization as _init
except ImportError:
    _init = nn.init

from .configuration_relation import RelationConfig

_TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

#: Tokens per chunk of the chunkwise Linear Relation. Any size gives the same function; the
#: pairwise decays cost `T * chunk * D` per head, so small chunks are cheaper on the CPU.
LINEAR_CHUNK = 16

#: `eps` of the L2 normalisation `p / sqrt(||p||^2 + eps)` of Linear Relation.
L2_NORM_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Position and head mixing
# ---------------------------------------------------------------------------------------------


def compute_dtype(dtype):
    """The dtype the precision-sensitive parts run in: float32, or float64 for a float64
    model (half-precision parameters are promoted, wider ones kept)."""
    return torch.promote_types(dtype, torch.float32)


def rope_tables(seq_len, head_dim, base, device, dtype):
    """`(cos, sin)` of RoPE for positions `0 .. seq_len`, each `[T, D/2]` in `dtype`.

    The angles `phi = t * base^(-2k / D)` and their cosines and sines are computed in float64
    on the CPU (as the Rust reference does on the host) and only then rounded to `dtype`.
    """
    k = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = torch.tensor(float(base), dtype=torch.float64) ** (-2.0 * k / head_dim)  # [D/2]
    positions = torch.arange(seq_len, dtype=torch.float64)  # [T]
    phase = positions[:, None] * inv_freq[None, :]  # [T, D/2]
    return phase.cos().to(device=device, dtype=dtype), phase.sin().to(device=device, dtype=dtype)


def apply_rope(x, cos, sin):
    """Rotates channel `k` with channel `k + D/2` by the angle of each position (half-split
    RoPE over the whole head dimension).

    Shapes: `x` `[B, T, H, D]`, `cos`/`sin` `[T, D/2]`; output `[B, T, H, D]`.
    """
    half = x.shape[-1] // 2
    cos = cos[None, :, None, :]  # [1, T, 1, D/2]
    sin = sin[None, :, None, :]
    low, high = x[..., :half], x[..., half:]  # [B, T, H, D/2] each
    return torch.cat([low * cos - high * sin, high * cos + low * sin], dim=-1)


def givens_mix(info, angles, layer_idx):
    """Rotates pairs of information heads by one learned angle per pair.

    Even layers pair heads `(0,1) (2,3) ...`, odd layers `(1,2) (3,4) ... (H-1,0)`; angle `m`
    turns pair `m`: `I~_a = cos I_a - sin I_b`, `I~_b = sin I_a + cos I_b`. An odd layer is the
    even pairing applied to the heads rolled by one, then rolled back.

    Shapes: `info` `[B, T, H, D]`, `angles` `[H/2]`; output `[B, T, H, D]`.
    """
    b, t, h, d = info.shape
    shift = layer_idx % 2
    rolled = torch.roll(info, shifts=-shift, dims=2)  # rolled head r = head (r + shift) mod H
    pairs = rolled.reshape(b, t, h // 2, 2, d)  # [B, T, H/2, (a, b), D]
    first, second = pairs[..., 0, :], pairs[..., 1, :]  # [B, T, H/2, D] each
    cos = angles.to(info.dtype).cos()[:, None]  # [H/2, 1]
    sin = angles.to(info.dtype).sin()[:, None]
    mixed = torch.stack([first * cos - second * sin, first * sin + second * cos], dim=3)
    return torch.roll(mixed.reshape(b, t, h, d), shifts=shift, dims=2)


# ---------------------------------------------------------------------------------------------
# The relations (float32, or float64 for a float64 model)
# ---------------------------------------------------------------------------------------------


def full_relation(p1, p2, info, lam, tau, exchange_only):
    """Multi-head Self-Exchange Relation, factorized form (`docs/maths.md` section 2).

    Per head, rows `i = 1..T`: evidence `U_ij = p1_i . p2_j / sqrt(D)`, Exchange
    `E_ij = SiLU(U_ij)` over the history `j < i`, its log-mass `L_i` and allocation
    `pi_ij = softmax_{j<i} E_ij`, Self `S_i = sigmoid(U_ii / tau)`, share
    `g_i = sigmoid(L_i - lam log i - S_i)` and `Y_i = I~_i + g_i (sum_j pi_ij I~_j - I~_i)`.
    The first row has no history: `g_1 = 0`, `Y_1 = I~_1`. Exchange-only transport has
    `g_i = 1` for `i > 1` (no Self term, no `lam`, no `tau`).

    Shapes: `p1`, `p2` (after RoPE), `info` (after Givens): `[B, T, H, D]`; `lam` `[1]`.
    Output `[B, T, H, D]`, in the inputs' dtype.
    """
    t, d = p1.shape[1], p1.shape[-1]
    q = p1.transpose(1, 2)  # [B, H, T, D]
    k = p2.transpose(1, 2)  # [B, H, T, D]
    v = info.transpose(1, 2)  # [B, H, T, D]
    device = q.device

    u = q @ k.transpose(-1, -2) / math.sqrt(d)  # [B, H, T, T]
    history = torch.ones(t, t, dtype=torch.bool, device=device).tril(-1)  # j < i
    first_row = torch.zeros(t, 1, dtype=torch.bool, device=device)
    first_row[0] = True  # [T, 1]

    exchange = F.silu(u).masked_fill(~history, float("-inf"))  # [B, H, T, T]
    row_max = exchange.amax(dim=-1, keepdim=True)  # [B, H, T, 1], -inf on row 1
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(exchange - row_max)  # [B, H, T, T], 0 off the history
    mass = weights.sum(dim=-1, keepdim=True)  # [B, H, T, 1], 0 on row 1
    mass = torch.where(first_row, torch.ones_like(mass), mass)
    history_mean = (weights / mass) @ v  # Ibar, [B, H, T, D] (0 on row 1)

    if exchange_only:
        share = (~first_row).to(v.dtype)  # [T, 1]: 0 on row 1, 1 elsewhere
    else:
        self_score = torch.sigmoid((q * k).sum(dim=-1, keepdim=True) / (math.sqrt(d) * tau))
        log_i = torch.log(torch.arange(1, t + 1, dtype=q.dtype, device=device))[:, None]
        log_mass = row_max + torch.log(mass) - lam.to(q.dtype) * log_i  # A_i, [B, H, T, 1]
        share = torch.sigmoid(log_mass - self_score).masked_fill(first_row, 0.0)  # g
    y = v + share * (history_mean - v)  # [B, H, T, D]
    return y.transpose(1, 2)


def l2_normalize(x):
    """`x / sqrt(||x||^2 + eps)` over the head dimension. Shapes: `[B, T, H, D]` -> same."""
    return x / torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def linear_relation(p1, p2, info, log_alpha, tau, chunk=LINEAR_CHUNK):
    """Linear Relation from a zero state, chunkwise (`docs/maths.md` sections 6 and 7).

    The recurrence it computes, per head, with state `C` (`D x D`, rows key channels):

    ```text
    S_t = sigmoid(p1_t . p2_t / (tau sqrt(D))),  q_t = S_t p1^_t,  k_t = S_t p2^_t
    (p^ = p / sqrt(|p|^2 + eps), the L2 normalisation)
    C_t^- = Diag(alpha_t) C_{t-1};  Y_t = I~_t + (C_t^-)^T q_t;  C_t = C_t^- + k_t I~_t^T
    ```

    Within a chunk with carried state `C0` and inclusive cumulative log gates `b_t`, the read
    splits into `(q_t * e^{b_t})^T C0` and `sum_{j<t} [q_t . (e^{b_t - b_j} * k_j)] I~_j`; every
    exponent is a difference `<= 0`, so nothing overflows whatever the gates.

    Shapes: `p1`, `p2` (after RoPE), `info`, `log_alpha` (`<= 0`): `[B, T, H, D]`, one dtype.
    Output `[B, T, H, D]`, in that dtype.
    """
    b, t, h, d = p1.shape
    self_score = torch.sigmoid((p1 * p2).sum(dim=-1, keepdim=True) / (math.sqrt(d) * tau))
    q = (l2_normalize(p1) * self_score).transpose(1, 2)  # S_t p1^_t, [B, H, T, D]
    k = (l2_normalize(p2) * self_score).transpose(1, 2)  # S_t p2^_t, [B, H, T, D]
    v = info.transpose(1, 2)  # [B, H, T, D]
    g = log_alpha.transpose(1, 2)  # [B, H, T, D]

    state = torch.zeros(b, h, d, d, dtype=q.dtype, device=q.device)  # [B, H, D, D]
    strictly_lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    outputs = []
    for start in range(0, t, chunk):
        span = slice(start, start + chunk)
        qc, kc, vc = q[:, :, span], k[:, :, span], v[:, :, span]  # [B, H, n, D] each
        n = qc.shape[2]
        cum = g[:, :, start : start + n].cumsum(dim=2)  # b_t, [B, H, n, D]
        inter = (qc * cum.exp()) @ state  # [B, H, n, D]
        diff = cum[:, :, :, None, :] - cum[:, :, None, :, :]  # b_t - b_j, [B, H, n, n, D]
        mask = strictly_lower[:n, :n, None]  # [n, n, 1]
        decay = diff.masked_fill(~mask, float("-inf")).exp()  # 0 where j >= t
        scores = (qc[:, :, :, None, :] * decay * kc[:, :, None, :, :]).sum(dim=-1)  # [B, H, n, n]
        outputs.append(vc + inter + scores @ vc)
        last = cum[:, :, -1:, :]  # b at the chunk's end, [B, H, 1, D]
        carried = (kc * (last - cum).exp()).transpose(-1, -2) @ vc  # [B, H, D, D]
        state = state * last.exp().transpose(-1, -2) + carried
    return torch.cat(outputs, dim=2).transpose(1, 2)  # [B, T, H, D]


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------


def _linear(d_in, d_out):
    """A bias-free linear layer (weight `[d_out, d_in]`, `y = x W^T`)."""
    return nn.Linear(d_in, d_out, bias=False)


class RelationRMSNorm(nn.Module):
    """Weight-only RMSNorm, `x / sqrt(mean(x^2) + eps) * weight`, the mean of squares and the
    division in float32 at least (as the Rust model computes it). Shapes: `[.., d]` -> same."""

    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        wide = x.to(compute_dtype(x.dtype))
        rms = torch.sqrt(wide.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return ((wide / rms) * self.weight.to(wide.dtype)).to(x.dtype)


class RelationMLP(nn.Module):
    """SwiGLU feed-forward `down(SiLU(gate x) * up x)`. Shapes: `[B, T, d]` -> same."""

    def __init__(self, config):
        super().__init__()
        d, d_ff = config.hidden_size, config.intermediate_size
        self.gate_proj = _linear(d, d_ff)
        self.up_proj = _linear(d, d_ff)
        self.down_proj = _linear(d_ff, d)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RelationLogDecayGate(nn.Module):
    """KDA's per-channel log retention of Linear Relation:
    `log alpha = -exp(A_log_h) softplus(W_up W_down x + dt_bias)` (`<= 0`), from the layer's
    normed input. Shapes: `x` `[B, T, d]` -> `[B, T, H, D]` in the compute dtype."""

    def __init__(self, config):
        super().__init__()
        d, h, r = config.hidden_size, config.num_attention_heads, config.gate_rank
        self.heads = h
        self.down_proj = _linear(d, r)
        self.up_proj = _linear(r, d)
        self.A_log = nn.Parameter(torch.zeros(h))
        self.dt_bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        b, t, d = x.shape
        wide = compute_dtype(x.dtype)
        pre = self.up_proj(self.down_proj(x)).to(wide) + self.dt_bias.to(wide)  # [B, T, d]
        pre = pre.reshape(b, t, self.heads, d // self.heads)  # [B, T, H, D]
        rate = self.A_log.to(wide).exp()[:, None]  # [H, 1]
        return -(rate * F.softplus(pre))


class _RelationProjections(nn.Module):
    """The projections shared by the `F` and `L` mixers: `P1 = rope(x W1)`, `P2 = rope(x W2)`
    and the information `I~ = Givens_l(x W_I)` (or `Givens_l(x)` without `W_I`), never
    rotated by RoPE; plus the output projection `W_O`."""

    def __init__(self, config, layer_idx, info_projection):
        super().__init__()
        d = config.hidden_size
        self.layer_idx = layer_idx
        self.heads = config.num_attention_heads
        self.p1_proj = _linear(d, d)
        self.p2_proj = _linear(d, d)
        self.info_proj = _linear(d, d) if info_projection else None
        self.givens_angles = nn.Parameter(torch.zeros(self.heads // 2)) if config.givens else None
        self.o_proj = _linear(d, d)

    def _split(self, x):
        """`[B, T, H*D]` -> `[B, T, H, D]`, in the compute dtype."""
        b, t, d = x.shape
        return x.to(compute_dtype(x.dtype)).reshape(b, t, self.heads, d // self.heads)

    def project(self, x, rope):
        """`(P1, P2, I~)` of the normed input `x` `[B, T, d]`, each `[B, T, H, D]` in the
        compute dtype."""
        cos, sin = rope
        p1 = apply_rope(self._split(self.p1_proj(x)), cos, sin)
        p2 = apply_rope(self._split(self.p2_proj(x)), cos, sin)
        info = self._split(self.info_proj(x) if self.info_proj is not None else x)
        if self.givens_angles is not None:
            info = givens_mix(info, self.givens_angles, self.layer_idx)
        return p1, p2, info

    def output(self, y, like):
        """`W_O` of the heads `y` `[B, T, H, D]`, back in `like`'s dtype: `[B, T, d]`."""
        b, t = y.shape[:2]
        return self.o_proj(y.reshape(b, t, -1).to(like.dtype))


class RelationFullMixer(_RelationProjections):
    """`F`: multi-head Full (Self-Exchange) Relation with a learned count calibration
    `count_lambda` (`[1]`) and, in the Exchange-only ablation, no Self term."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx, info_projection=config.info_projection)
        self.count_lambda = nn.Parameter(
            torch.full((1,), float(config.lambda_init)), requires_grad=bool(config.lambda_trainable)
        )
        self.tau = float(config.tau)
        self.exchange_only = bool(config.exchange_only)

    def forward(self, x, rope):
        p1, p2, info = self.project(x, rope)
        y = full_relation(p1, p2, info, self.count_lambda, self.tau, self.exchange_only)
        return self.output(y, x)


class RelationLinearMixer(_RelationProjections):
    """`L`: Linear Relation with KDA's log-decay gate. As in the Rust model, `L` layers always
    have their information projection (`info_projection` switches only `F` layers)."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx, info_projection=True)
        self.gate = RelationLogDecayGate(config)
        self.tau = float(config.tau)

    def forward(self, x, rope):
        p1, p2, info = self.project(x, rope)
        y = linear_relation(p1, p2, info, self.gate(x), self.tau)
        return self.output(y, x)


class RelationAttentionMixer(nn.Module):
    """`A`: causal multi-head softmax attention, RoPE on queries and keys, scale
    `1 / sqrt(D)`, bias-free. Shapes: `[B, T, d]` -> same."""

    def __init__(self, config, layer_idx):
        super().__init__()
        d = config.hidden_size
        self.heads = config.num_attention_heads
        self.q_proj = _linear(d, d)
        self.k_proj = _linear(d, d)
        self.v_proj = _linear(d, d)
        self.o_proj = _linear(d, d)

    def forward(self, x, rope):
        b, t, d = x.shape
        cos, sin = rope

        def heads(y):  # [B, T, d] -> [B, T, H, D] in the compute dtype
            return y.to(compute_dtype(y.dtype)).reshape(b, t, self.heads, d // self.heads)

        q = apply_rope(heads(self.q_proj(x)), cos, sin).transpose(1, 2)  # [B, H, T, D]
        k = apply_rope(heads(self.k_proj(x)), cos, sin).transpose(1, 2)
        v = heads(self.v_proj(x)).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d).to(x.dtype))


_MIXERS = {"F": RelationFullMixer, "L": RelationLinearMixer, "A": RelationAttentionMixer}


class RelationDecoderLayer(nn.Module):
    """One pre-norm block: `h + mixer(norm(h))`, then `h + mlp(norm(h))`."""

    def __init__(self, config, layer_idx, kind):
        super().__init__()
        self.input_layernorm = RelationRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mixer = _MIXERS[kind](config, layer_idx)
        self.post_attention_layernorm = RelationRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = RelationMLP(config)

    def forward(self, h, rope):
        h = h + self.mixer(self.input_layernorm(h), rope)
        return h + self.mlp(self.post_attention_layernorm(h))


def _check_config(config):
    """Refuses a configuration this implementation cannot run, naming the field."""
    d, h = config.hidden_size, config.num_attention_heads
    if h <= 0 or d % h != 0:
        raise ValueError(f"hidden_size {d} does not split into {h} heads")
    if (d // h) % 2 == 1:
        raise ValueError(f"head dimension {d // h} is odd (RoPE rotates channel pairs)")
    if config.givens and h % 2 == 1:
        raise ValueError(f"Givens mixing pairs heads: num_attention_heads {h} must be even")
    return config.mixer_kinds()


def _refuse_left_padding(attention_mask):
    """Raises `ValueError` when a row of `attention_mask` has a padded position before a real
    token. Positions count from each sequence's first token, which left padding would shift;
    right padding is harmless (causal: no real token reads a later one)."""
    if attention_mask is None:
        return
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [batch, seq_len], got {list(attention_mask.shape)}")
    keep = attention_mask.to(torch.bool)
    if bool((keep[:, 1:] & ~keep[:, :-1]).any()):
        raise ValueError(
            "Relation models do not support left padding (a masked position before a real "
            "token): run sequences of different lengths separately, or pad on the right."
        )


# ---------------------------------------------------------------------------------------------
# Pretrained models
# ---------------------------------------------------------------------------------------------


class RelationPreTrainedModel(PreTrainedModel):
    """Ties the Relation modules to transformers' loading, saving and initialisation."""

    config_class = RelationConfig
    base_model_prefix = "model"
    _no_split_modules = ["RelationDecoderLayer"]
    supports_gradient_checkpointing = False
    _supports_cache_class = False
    _supports_static_cache = False

    @classmethod
    def _supports_default_dynamic_cache(cls):
        """No KV cache: generation recomputes the whole prefix at every step."""
        return False

    def _init_weights(self, module):
        """Initialises a module as the Rust model does for a fresh model (loaded weights then
        replace everything; this matters only for tensors missing from a checkpoint)."""
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            _init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Embedding):
            _init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RelationRMSNorm):
            _init.ones_(module.weight)
        elif isinstance(module, RelationLogDecayGate):
            # KDA's retention: rate exp(A_log) ~ U(1, 16) per head, dt log-uniform in
            # [1e-3, 1e-1] per channel, dt_bias = softplus^{-1}(dt).
            with torch.no_grad():
                rate = torch.empty_like(module.A_log, device="cpu").uniform_(1.0, 16.0)
                low, high = math.log(1e-3), math.log(1e-1)
                dt = torch.exp(torch.empty_like(module.dt_bias, device="cpu").uniform_(low, high))
                self._copy_init(module.A_log, rate.log())
                self._copy_init(module.dt_bias, torch.log(torch.expm1(dt)))
        if isinstance(module, _RelationProjections) and module.givens_angles is not None:
            _init.zeros_(module.givens_angles)
        if isinstance(module, RelationFullMixer):
            _init.constant_(module.count_lambda, float(self.config.lambda_init))

    @staticmethod
    def _copy_init(param, value):
        """Copies `value` into `param` unless transformers marks it as already loaded."""
        if getattr(param, "_is_hf_initialized", False) or param.device.type == "meta":
            return
        with torch.no_grad():
            param.copy_(value.to(param.dtype))


class RelationModel(RelationPreTrainedModel):
    """The stack without its head: `embed_tokens`, `layers`, final `norm`.

    `forward(input_ids)` returns `last_hidden_state` `[B, T, d]` after the final norm.
    """

    def __init__(self, config):
        super().__init__(config)
        kinds = _check_config(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            RelationDecoderLayer(config, i, kind) for i, kind in enumerate(kinds)
        )
        self.norm = RelationRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        if input_ids is None:
            raise ValueError("RelationModel needs input_ids (inputs_embeds are not supported)")
        _refuse_left_padding(attention_mask)
        h = self.embed_tokens(input_ids)  # [B, T, d]
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        rope = rope_tables(
            input_ids.shape[1], head_dim, self.config.rope_theta, h.device, compute_dtype(h.dtype)
        )
        for layer in self.layers:
            h = layer(h, rope)
        return BaseModelOutput(last_hidden_state=self.norm(h))


class RelationForCausalLM(RelationPreTrainedModel, GenerationMixin):
    """Relation language model with the tied output head `logits = norm(h) Embed^T`.

    `forward(input_ids, attention_mask=None, labels=None)` returns `CausalLMOutput(loss,
    logits)`: `logits` `[B, T, V]`, and with `labels` (`[B, T]`, shifted inside, `-100`
    ignored) the mean next-token cross entropy in nats.
    """

    if _TRANSFORMERS_MAJOR >= 5:
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    else:
        _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = RelationModel(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.lm_head(hidden)  # [B, T, V]
        loss = None
        if labels is not None:
            # Position k predicts token k + 1, as in Llama.
            shift_logits = logits[:, :-1, :].to(compute_dtype(logits.dtype))
            shift_logits = shift_logits.reshape(-1, logits.shape[-1])
            shift_labels = labels[:, 1:].reshape(-1).to(shift_logits.device)
            loss = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
        if kwargs.get("return_dict") is False:
            return (loss, logits) if loss is not None else (logits,)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """The whole sequence so far at every step: the model keeps no cache."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}


__all__ = ["RelationPreTrainedModel", "RelationModel", "RelationForCausalLM"]
