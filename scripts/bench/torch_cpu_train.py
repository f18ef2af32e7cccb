"""PyTorch CPU peer for the trainer benchmark: the same language model as `relation train`
(token embedding tied to the LM head, pre-norm blocks of RMSNorm -> mixer -> RMSNorm -> SwiGLU,
final RMSNorm, AdamW, cross-entropy), trained on random tokens, eager mode, reporting tokens/s
between the end of step 2 and the last step -- the same window `scripts/bench/lib.sh` uses.

Mixers: `relation` (Self-Exchange Relation materialized as a T x T matrix per head, with RoPE on
P1/P2 and a Givens rotation between head pairs on the information, written from the spec's
formulas) and `sdpa` (multi-head attention with RoPE through scaled_dot_product_attention).

PyTorch is never a project dependency: run this from a throw-away virtualenv.

    python scripts/bench/torch_cpu_train.py relation --layers 4 --d-model 256 --heads 8 \
        --d-ff 512 --seq-len 256 --batch 16 --steps 12
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

TAU, LAMBDA, ROPE_BASE = 2.0, 0.5, 10000.0


def rope(x, base=ROPE_BASE):
    # x: [B, H, T, D]; rotate channel pairs (2i, 2i+1) by t * base^(-2i/D).
    _, _, t, d = x.shape
    inv = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)  # [D/2]
    ang = torch.arange(t, dtype=x.dtype)[:, None] * inv[None, :]  # [T, D/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class Relation(nn.Module):
    """Multi-head Self-Exchange Relation, materialized (spec: Self on the diagonal as
    sigmoid(U_tt / tau), Exchange off it as SiLU(U_ts) - lambda * ln(t), causal softmax)."""

    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.w1, self.w2, self.wi, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.angles = nn.Parameter(torch.zeros(h // 2))
        self.lam = nn.Parameter(torch.tensor(LAMBDA))

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.h, d // self.h).transpose(1, 2)  # [B, H, T, D]
        p1, p2, info = rope(split(self.w1(x))), rope(split(self.w2(x))), split(self.wi(x))
        # Givens rotation between heads 2j and 2j+1 of the information.
        c, s = self.angles.cos()[None, :, None, None], self.angles.sin()[None, :, None, None]
        a, bb = info[:, 0::2], info[:, 1::2]
        info = torch.stack((c * a - s * bb, s * a + c * bb), 2).flatten(1, 2)
        u = p1 @ p2.transpose(-1, -2) / math.sqrt(p1.shape[-1])  # [B, H, T, T]
        pos = torch.arange(1, t + 1, dtype=u.dtype)
        self_score = torch.sigmoid(torch.diagonal(u, dim1=-2, dim2=-1) / TAU)
        exchange = F.silu(u) - self.lam * torch.log(pos)[:, None]
        eye = torch.eye(t, dtype=torch.bool)
        r = torch.where(eye, torch.diag_embed(self_score), exchange)
        r = r.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        y = torch.softmax(r, -1) @ info
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.h, d // self.h).transpose(1, 2)
        q, k, v = rope(split(self.wq(x))), rope(split(self.wk(x))), split(self.wv(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class SwiGlu(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.gate, self.up = nn.Linear(d, ff, bias=False), nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, mixer, d, h, ff):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.mixer = (Relation if mixer == "relation" else Attention)(d, h)
        self.ffn = SwiGlu(d, ff)

    def forward(self, x):
        x = x + self.mixer(self.n1(x))
        return x + self.ffn(self.n2(x))


class Lm(nn.Module):
    def __init__(self, mixer, vocab, d, layers, h, ff):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(mixer, d, h, ff) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-6)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.emb.weight.t()  # tied LM head


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mixer", choices=["relation", "sdpa"])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (compiled on the first step, which is not timed)")
    a = p.parse_args()
    torch.manual_seed(0)
    model = Lm(a.mixer, a.vocab, a.d_model, a.layers, a.heads, a.d_ff)
    step_model = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    params = sum(p.numel() for p in model.parameters())
    tokens = a.batch * a.seq_len
    marks = []
    for _ in range(a.steps):
        batch = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1))
        logits = step_model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        marks.append(time.perf_counter())
    rate = tokens * (len(marks) - 2) / (marks[-1] - marks[1])
    print(f"torch {torch.__version__} {a.mixer}{' compiled' if a.compile else ''} params={params / 1e6:.2f}M "
          f"threads={torch.get_num_threads()} tokens/s={rate:.0f}")


if __name__ == "__main__":
    main()
