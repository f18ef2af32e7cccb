#!/usr/bin/env bash
# The two CPU paths side by side, same machine, same run: the Flex kernels (`--device flex`, the
# default backend) against the CubeCL kernels JIT-compiled by CubeCL's CPU runtime
# (`--device cpu`, `--features cpu`, LLVM from scripts/llvm-sdk.sh): FlashRelation and chunked
# Linear Relation, forward and forward + backward, with the materialized reference and Burn's
# attention; then the trainer's tokens/s (and how far the trainer gets on the CubeCL runtime).
#
#   scripts/bench/cube-cpu.sh             # tables into docs/bench/cube-cpu.md
#   QUICK=1 scripts/bench/cube-cpu.sh     # T 256 only, fewer steps
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-docs/bench}
mkdir -p "$OUT"
SEQS=${SEQS:-256,1024,4096}
CUBE_SEQS=${CUBE_SEQS:-256,1024}
STEPS=${STEPS:-8}
CUBE_TRAIN_TIMEOUT=${CUBE_TRAIN_TIMEOUT:-300}
if [[ -n "${QUICK:-}" ]]; then SEQS=256; CUBE_SEQS=256; STEPS=4; CUBE_TRAIN_TIMEOUT=60; fi
THREADS=${RAYON_NUM_THREADS:-$(nproc)}
export RAYON_NUM_THREADS=$THREADS

scripts/llvm-sdk.sh >/dev/null
# One invocation, so Burn is built once with one feature set (Flex is a default feature).
cargo build --release -q -p relation-examples -p relation-train --features cpu --examples --bins
BIN=${CARGO_TARGET_DIR:-target}/release

# shellcheck source=lib.sh
source scripts/bench/lib.sh   # train_rate (the cwd is the repository root)

CFG37="--n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 --seq-len 256 --batch-size 16 --tokens-per-step 4096"
{
  echo "# Flex kernels vs CubeCL's CPU runtime ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD))"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), ${THREADS} threads."
  echo "Same binary, same run: \`--device flex\` (Flex, the default backend, its own fused kernels) and"
  echo "\`--device cpu\` (CubeCL's LLVM-JIT CPU runtime running the CubeCL kernels; one unit per core)."
  echo
  echo "## FlashRelation op, --device flex (B 4, H 8, D 48)"
  echo
  "$BIN/examples/flash_relation_bench" --device flex --seqs "$SEQS" --batch 4 --heads 8 \
    --head-dim 48 --iters 2 --max-materialized 1024 --max-attention 4096
  # On CubeCL's CPU runtime Burn's own tensor ops (the reference's matmuls, Burn's attention)
  # are two to three orders of magnitude slower than the fused kernel, so they get a table of
  # their own at one small shape, and the fused kernel stops at T 1024 (4096: minutes per call).
  echo
  echo "## FlashRelation op, --device cpu (B 4, H 8, D 48), fused kernel only"
  echo
  "$BIN/examples/flash_relation_bench" --device cpu --seqs "$CUBE_SEQS" --batch 4 --heads 8 \
    --head-dim 48 --iters 1 --max-materialized 0 --max-attention 0
  echo
  echo "## FlashRelation op, --device cpu vs flex at (B 1, H 1, T 256, D 48): fused, reference, Burn attention"
  for dev in flex cpu; do
    echo
    "$BIN/examples/flash_relation_bench" --device $dev --seqs 256 --batch 1 --heads 1 \
      --head-dim 48 --iters 1
  done
  for dev in flex cpu; do
    echo
    echo "## Linear Relation op, --device $dev (B 1, H 8, D 64)"
    echo
    "$BIN/examples/linear_relation_bench" --device $dev --seqs "$SEQS" --chunk 64 --max-flash 1024 --iters 1
  done
  echo
  echo "## Trainer tokens/s on Flex (${THREADS} threads, ${STEPS} steps, steps 3..${STEPS})"
  echo
  echo "| model | flags | tokens/s |"
  echo "|---|---|---|"
  train_rate "cpu (Relation, 1.4M)" --preset cpu --device flex
  train_rate "3.7M Relation" --preset cpu $CFG37 --device flex
  echo
  echo "On \`--device cpu\` the trainer's first step (preset \`cpu\`, 2,048 tokens) does not finish"
  echo "within ${CUBE_TRAIN_TIMEOUT} s:"
  d=$(mktemp -d)
  if timeout "$CUBE_TRAIN_TIMEOUT" "$BIN/relation" train --device cpu --run-dir "$d/run" --steps 3 \
      --eval-every 100000 --checkpoint-every 100000 --sample-tokens 0 --log-every 1 --no-progress \
      > "$d/log" 2>&1; then
    echo "(it did, this time:)"; echo '```'; tail -3 "$d/log"; echo '```'
  else
    echo "stopped after ${CUBE_TRAIN_TIMEOUT} s with $(($(wc -l < "$d/run/metrics.csv") - 1)) steps logged."
  fi
  rm -rf "$d"
} | tee "$OUT/cube-cpu.md"
