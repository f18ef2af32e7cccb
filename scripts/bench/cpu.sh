#!/usr/bin/env bash
# CPU benchmarks on Flex, side by side with PyTorch CPU in the same run (same machine, same
# minute): the FlashRelation op (fused Flex kernel vs the materialized reference vs Burn's
# attention), Linear Relation, and the trainer's tokens/s for Relation and attention models.
#
#   scripts/bench/cpu.sh                   # tables into docs/bench/cpu-ops.md and cpu-trainer.md
#   TORCH_PYTHON=/path/to/venv/bin/python scripts/bench/cpu.sh   # + the PyTorch peer
#   QUICK=1 scripts/bench/cpu.sh           # fewer sequence lengths and steps
#
# PyTorch is never a project dependency: point TORCH_PYTHON at a throw-away virtualenv with
# `torch` installed to get the peer's numbers; without it those rows are skipped and said so.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-docs/bench}
mkdir -p "$OUT"
SEQS=${SEQS:-256,512,1024,2048,4096}
STEPS=${STEPS:-12}
if [[ -n "${QUICK:-}" ]]; then SEQS=256,512; STEPS=6; fi
THREADS=${RAYON_NUM_THREADS:-$(nproc)}
export RAYON_NUM_THREADS=$THREADS

# One invocation for both, so Burn is built once with one feature set.
cargo build --release -q --workspace --examples --bins
BIN=${CARGO_TARGET_DIR:-target}/release

{
  echo "# CPU benchmarks ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD))"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), ${THREADS} threads."
  echo
  echo "## PyTorch CPU peer, (B 4, T 512, H 8, D 48)"
  echo
  if [[ -n "${TORCH_PYTHON:-}" ]]; then
    echo '```'
    "$TORCH_PYTHON" ../shared/bench/torch_cpu_relation.py 4 512 8 48 2>/dev/null
    echo '```'
  else
    echo "(skipped: set TORCH_PYTHON to a python with torch)"
  fi
  echo
  echo "## Matmul on Flex (the GEMM every projection and the LM head go through)"
  echo
  "$BIN/examples/matmul_bench" --device flex
  if [[ -n "${TORCH_PYTHON:-}" ]]; then
    echo
    echo '```'
    "$TORCH_PYTHON" - <<'PY'
import time, torch
n, d = 4096, 256
for what, m, k, c, t in [("square 1024", 1024, 1024, 1024, 0), ("x @ W (d -> d)", n, d, d, 0),
                         ("x @ W (d -> 2 d)", n, d, 2 * d, 0), ("x^T @ g (weight grad)", d, n, 2 * d, 1),
                         ("x @ E^T (LM head)", n, d, 4096, 0), ("g^T @ x (head grad)", 4096, n, d, 1)]:
    a = torch.randn(k, m).t() if t else torch.randn(m, k)
    b = torch.randn(k, c)
    a @ b
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    dt = (time.perf_counter() - t0) / 10
    print(f"torch {what}: {dt * 1e3:.2f} ms, {2 * m * k * c / dt / 1e9:.1f} GFLOP/s")
PY
    echo '```'
  fi
  echo
  echo "## FlashRelation op on Flex"
  echo
  "$BIN/examples/flash_relation_bench" --device flex --seqs "$SEQS" --batch 4 --heads 8 \
    --head-dim 48 --iters 2 --max-materialized 1024 --max-attention 2048
  echo
  echo "At the 3.7M model's shape, (B 16, T 256, H 8, D 32):"
  echo
  "$BIN/examples/flash_relation_bench" --device flex --seqs 256 --batch 16 --heads 8 \
    --head-dim 32 --iters 5 --max-materialized 256 --max-attention 256
  if [[ -n "${TORCH_PYTHON:-}" ]]; then
    echo '```'
    "$TORCH_PYTHON" ../shared/bench/torch_cpu_relation.py 16 256 8 32 2>/dev/null
    echo '```'
  fi
  echo
  echo "## Linear Relation op on Flex"
  echo
  "$BIN/examples/linear_relation_bench" --device flex --seqs "$SEQS" --chunk 64 --max-flash 4096
} | tee "$OUT/cpu-ops.md"

# shellcheck source=lib.sh
source scripts/bench/lib.sh   # train_rate (the cwd is the repository root)

CFG37="--n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 --seq-len 256 --batch-size 16 --tokens-per-step 4096"
{
  echo "## Trainer tokens/s on Flex (${THREADS} threads, ${STEPS} steps, steps 3..${STEPS})"
  echo
  echo "| model | flags | tokens/s |"
  echo "|---|---|---|"
  train_rate "cpu (Relation, 1.4M)" --preset cpu
  train_rate "cpu-mha (attention, 1.4M)" --preset cpu-mha
  train_rate "3.7M Relation" --preset cpu $CFG37
  train_rate "3.7M MHA" --preset cpu-mha $CFG37
  train_rate "3.7M Hybrid LLLF" --preset cpu --pattern LLLF $CFG37
  echo
  echo "Longer contexts, same 4096 tokens per step (batch 4096 / T), Relation vs MHA:"
  echo
  echo "| model | flags | tokens/s |"
  echo "|---|---|---|"
  for T in 512 1024 2048; do
    W="--n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 --seq-len $T --batch-size $((4096 / T)) --tokens-per-step 4096"
    train_rate "3.7M Relation, T $T" --preset cpu $W
    train_rate "3.7M MHA, T $T" --preset cpu-mha $W
  done
  echo
  if [[ -n "${TORCH_PYTHON:-}" ]]; then
    echo "PyTorch CPU peer, same model and step (eager, random tokens, steps 3..${STEPS}):"
    echo
    echo '```'
    for mixer in sdpa relation; do
      "$TORCH_PYTHON" scripts/bench/torch_cpu_train.py "$mixer" --steps "$STEPS"
    done
    echo '```'
  else
    echo "(PyTorch peer skipped: set TORCH_PYTHON to a python with torch)"
  fi
} | tee "$OUT/cpu-trainer.md"
