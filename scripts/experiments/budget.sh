#!/usr/bin/env bash
# Beyond the toy budget: attention (A), Relation (F), the Hybrid (LLLF) and pure Linear Relation
# (L) at the 3.7M configuration of small.sh, on all four shipped English corpora together, at 2M
# and 8M tokens (500 and 2,000 steps of 4,096 tokens, same optimiser and WSD schedule: 40 warm-up
# steps, linear decay to 0 over the last 20 %).
#
#   scripts/experiments/budget.sh                 # the 2M grid, then the 8M grid
#   BUDGETS=8m VARIANTS="A F" SEEDS=2 scripts/experiments/budget.sh
#   STOP_AT=1000 scripts/experiments/budget.sh    # stop each run at step 1000; rerun to continue
#   COMMIT_EACH=1 scripts/experiments/budget.sh   # commit each run's raw metrics as it finishes
#
# Corpus: data/austen.txt, relation-train/data/moby_dick.txt, data/shakespeare.txt and
# data/sotu.txt (21 MB). Fewer than 64 files, so the trainer cuts them into paragraph groups of up
# to 4 KB and sends 1 % of the groups (by a hash of their text) to validation: one fixed
# validation set, drawn from all four texts, evaluated whole by every run. BPE 4,096 trained on
# the training part. Every run of this grid uses the same data layout (`--packing windows`: the
# token stream cut into T-token windows, as every earlier result on the results page).
#
# Runs live in runs/budget/<2m|8m>/<variant>-s<seed>/; finished ones are skipped, unfinished ones
# resumed bit-exactly. The raw metrics go to docs/results/budget/<2m|8m>/runs/, and
# `relation report` makes each budget's table and plots from them.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=scripts/experiments/lib.sh
. scripts/experiments/lib.sh
ensure_bin

BUDGETS="${BUDGETS:-2m 8m}"
USER_SEEDS="${SEEDS:-}"
USER_VARIANTS="${VARIANTS:-}"
CORPUS=(--data data/austen.txt --data relation-train/data/moby_dick.txt
  --data data/shakespeare.txt --data data/sotu.txt --split hash --val-fraction 0.01
  --eval-tokens 0 --vocab-size 4096)

variant_flags() {
  case "$1" in
    A) echo "--preset cpu-mha --n-heads 8" ;;
    F) echo "--preset cpu --pattern F --n-heads 8" ;;
    LLLF) echo "--preset cpu --pattern LLLF --n-heads 8" ;;
    L) echo "--preset cpu --pattern L --n-heads 8" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

ON_FINISH=commit_finished_run

for BUDGET in $BUDGETS; do
  case "$BUDGET" in
    2m) STEPS=500; EVAL=50; DEFAULT_SEEDS="0 1" ;;
    8m) STEPS=2000; EVAL=100; DEFAULT_SEEDS="0 1 2" ;;
    *) echo "unknown budget $BUDGET (2m or 8m)" >&2; exit 2 ;;
  esac
  OUT="runs/budget/$BUDGET"
  RAW="docs/results/budget/$BUDGET/runs"
  LABEL="$BUDGET"
  COMMON=("${CORPUS[@]}" --n-layers 4 --d-model 256 --d-ff 512 --seq-len 256 --batch-size 16
    --tokens-per-step 4096 --steps "$STEPS" --lr 1e-3 --warmup-steps 40 --decay-fraction 0.2
    --min-lr-ratio 0 --weight-decay 0.1 --grad-clip 1.0 --eval-every "$EVAL"
    --checkpoint-every 50 --keep-checkpoints 1 --log-every 25 --sample-tokens 0 --no-progress)
  for seed in ${USER_SEEDS:-$DEFAULT_SEEDS}; do
    # Seed 2 runs only A and F; VARIANTS given by the caller wins.
    variants="$USER_VARIANTS"
    if [ -z "$variants" ]; then
      if [ "$seed" = 2 ]; then variants="A F"; else variants="A F LLLF L"; fi
    fi
    SEEDS="$seed" VARIANTS="$variants" run_grid
  done
  collect_raw "$RAW"
  [ -d "$RAW" ] && "$BIN" report "$RAW" --out "docs/results/budget/$BUDGET"
done

# Every variant's paired difference to A against the budget (budget.md, budget.png), once both
# budgets have finished runs.
if [ -d docs/results/budget/2m/runs ] && [ -d docs/results/budget/8m/runs ]; then
  "$BIN" report --budget 2m=docs/results/budget/2m/runs --budget 8m=docs/results/budget/8m/runs \
    --out docs/results/budget
fi
