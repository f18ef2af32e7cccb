#!/usr/bin/env bash
# CPU benchmarks on Flex, side by side with PyTorch CPU in the same run (same machine, same
# minute): the FlashRelation op (fused Flex kernel vs the materialized reference vs Burn's
# attention), Linear Relation, and the trainer's tokens/s for Relation and attention models.
#
#   scripts/bench/cpu.sh                   # tables into docs/bench/cpu-*.md
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
  echo "## FlashRelation op on Flex"
  echo
  "$BIN/examples/flash_relation_bench" --device flex --seqs "$SEQS" --batch 4 --heads 8 \
    --head-dim 48 --iters 2 --max-materialized 1024 --max-attention 2048
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
} | tee "$OUT/cpu-train.md"
