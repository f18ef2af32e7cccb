#!/usr/bin/env bash
# The Flex kernels' vector instruction set: the trainer's tokens/s and model GFLOP/s with
# RELATION_SIMD=avx2 and RELATION_SIMD=avx512, interleaved in rounds so the machine's drift hits
# both alike (the 3.7M Relation model of the results page, T 256, 12 steps, medians of steps
# 4..12). On a CPU without AVX-512 only the AVX2 rows run.
#
#   scripts/bench/simd.sh             # 3 rounds
#   ROUNDS=5 PATTERN=LLLF scripts/bench/simd.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
PATTERN=${PATTERN:-F}
cargo build --release -q -p relation-train
BIN=${CARGO_TARGET_DIR:-target}/release/relation
levels="avx2"
grep -qw avx512f /proc/cpuinfo && levels="avx2 avx512"
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; pattern $PATTERN; commit $(git rev-parse --short HEAD)"
echo "| round | RELATION_SIMD | tokens/s | model GFLOP/s |"
echo "|---|---|---|---|"
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for round in $(seq "$ROUNDS"); do
  for simd in $levels; do
    rm -rf "$run/r"
    RELATION_SIMD=$simd "$BIN" train --preset cpu --pattern "$PATTERN" --n-layers 4 --d-model 256 \
      --n-heads 8 --d-ff 512 --seq-len 256 --batch-size 16 --tokens-per-step 4096 \
      --data data/sotu.txt --steps 12 --log-every 1 --eval-every 1000 --eval-tokens 4096 \
      --sample-tokens 0 --checkpoint-every 1000 --no-progress --run-dir "$run/r" > "$run/log" 2>&1
    tps=$(awk -F, 'NR > 4 {print $6}' "$run/r/metrics.csv" | median)
    gflops=$(awk -F, 'NR > 4 {print $12}' "$run/r/metrics.csv" | median)
    echo "| $round | $simd | $tps | $gflops |"
  done
done
