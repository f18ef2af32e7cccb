#!/usr/bin/env bash
# The 3.7M model's training speed on packed documents against windows, interleaved: ROUNDS rounds
# of (Relation, Linear Relation, MHA) x (--packing documents, --packing windows) at T = 256 (batch 16) and
# T = 1024 (batch 4), 4,096 tokens per step, on the paragraphs of Austen and Moby Dick as
# documents (~90 tokens each); then each one's median. Both layouts train on the same tokens, so
# tokens/s is useful tokens/s for both.
#
#   scripts/bench/packed-model.sh        # table on stdout
#
# Needs the release `relation` binary (`cargo build --release -p relation-train`).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-10}
BIN=${CARGO_TARGET_DIR:-target}/release
# shellcheck source=lib.sh
source scripts/bench/lib.sh # train_rate
DOCS=${DOCS:-runs/packing/paragraphs.jsonl}
[ -s "$DOCS" ] || { mkdir -p "$(dirname "$DOCS")"; scripts/paragraphs.sh "$DOCS" data/austen.txt relation-train/data/moby_dick.txt; }
DATA="--data $DOCS --split hash --val-fraction 0.02 --vocab-size 4096"
MODEL="--n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 --tokens-per-step 4096"
rate_of() { grep -oE '[0-9,]+ \|$' | tr -dc '0-9'; }
declare -A all
keys=()
for _ in $(seq "$ROUNDS"); do
  for shape in "256 16" "1024 4"; do
    set -- $shape
    for variant in "F:--preset cpu --pattern F" "L:--preset cpu --pattern L" "A:--preset cpu-mha"; do
      for packing in documents windows; do
        key="T $1 | ${variant%%:*} | $packing"
        [ -n "${all[$key]+x}" ] || keys+=("$key")
        # shellcheck disable=SC2086 # flag lists are words
        all[$key]+="$(train_rate x ${variant#*:} $DATA $MODEL --seq-len "$1" --batch-size "$2" --packing "$packing" | rate_of) "
      done
    done
  done
done
echo "| T | model | rows | tokens/s per round | median | vs windows |"
echo "|---|---|---|---|---|---|"
for key in "${keys[@]}"; do
  base="${key% | *} | windows"
  python3 - "$key" "${all[$key]}" "${all[$base]}" <<'PY'
import statistics, sys
v = [int(x) for x in sys.argv[2].split()]
w = [int(x) for x in sys.argv[3].split()]
m = statistics.median(v)
print(f"| {sys.argv[1]} | {', '.join(f'{x:,}' for x in v)} | {m:,.0f} | {m / statistics.median(w):.2f}x |")
PY
done
