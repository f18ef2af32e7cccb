#!/usr/bin/env bash
# Beyond the toy budget: attention (A), Relation (F), the Hybrid (LLLF) and pure Linear Relation
# (L) at the 3.7M configuration of small.sh, on all four shipped English corpora together, at 2M,
# 8M and 32M tokens (500, 2,000 and 8,000 steps of 4,096 tokens, same optimiser and WSD schedule:
# 40 warm-up steps, linear decay to 0 over the last 20 %); and the paper's 10M shape (`--preset
# 10m`: L 6, d 384, H 8, d_ff 768, T 1024, batch 4) at 8M tokens (budget `10m-8m`).
#
#   scripts/experiments/budget.sh                 # the 2M grid, then the 8M grid
#   BUDGETS=32m scripts/experiments/budget.sh     # A, F and LLLF, seeds 0 and 1
#   BUDGETS=10m-8m scripts/experiments/budget.sh  # the 10M shape: A and F, seed 0
#   BUDGETS=8m VARIANTS="A F" SEEDS=2 scripts/experiments/budget.sh
#   STOP_AT=1000 scripts/experiments/budget.sh    # stop each run at step 1000; rerun to continue
#   COMMIT_EACH=1 scripts/experiments/budget.sh   # commit each run's raw metrics as it finishes
#   RUNS=/var/tmp/relation-runs scripts/experiments/budget.sh   # run folders outside the clone
#
# Corpus: data/austen.txt, relation-train/data/moby_dick.txt, data/shakespeare.txt and
# data/sotu.txt (21 MB). Fewer than 64 files, so the trainer cuts them into paragraph groups of up
# to 4 KB and sends 1 % of the groups (by a hash of their text) to validation: one fixed
# validation set, drawn from all four texts, evaluated whole by every run. BPE 4,096 trained on
# the training part. Every run of this grid uses the same data layout (`--packing windows`: the
# token stream cut into T-token windows, as every earlier result on the results page).
#
# Runs live in $RUNS/budget/<budget>/<variant>-s<seed>/ (RUNS defaults to runs/ in the clone; a
# folder outside it lets a fresh clone on the same machine resume them); finished ones are
# skipped, unfinished ones resumed bit-exactly by the binary that started them (ensure_bin keeps a
# copy beside the runs). The raw metrics go to docs/results/budget/<budget>/runs/, and `relation
# report` makes each budget's table and plots from them.
#
# Sharing the machine with a run: on Linux with autogroups (the default), `nice` only ranks
# processes of one session, so a build started from the shell that started the runs outranks a
# runner under `nice -n 19`. Run other work beside it as `chrt -i 0 COMMAND` (SCHED_IDLE: only
# the cycles the run leaves), or start the runner at nice 0 from its own session.
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
    A) echo "--preset $PRESET-mha --n-heads 8" ;;
    F) echo "--preset $PRESET --pattern F --n-heads 8" ;;
    LLLF) echo "--preset $PRESET --pattern LLLF --n-heads 8" ;;
    L) echo "--preset $PRESET --pattern L --n-heads 8" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

ON_FINISH=commit_finished_run

for BUDGET in $BUDGETS; do
  # The 3.7M backbone unless the budget names another shape.
  PRESET=cpu
  CURVE=() # seeds.md's curve columns: every evaluation unless the budget names some
  SHAPE=(--n-layers 4 --d-model 256 --d-ff 512 --seq-len 256 --batch-size 16)
  case "$BUDGET" in
    2m) STEPS=500; EVAL=50; DEFAULT_SEEDS="0 1" ;;
    8m) STEPS=2000; EVAL=100; DEFAULT_SEEDS="0 1 2" ;;
    32m)
      STEPS=8000; EVAL=400; DEFAULT_SEEDS="0 1"
      CURVE=(--curve-steps 400,800,1200,2000,2800,4000,4800,5600,6400,6800,7200,7600,8000)
      ;;
    10m-8m)
      STEPS=2000; EVAL=100; DEFAULT_SEEDS="0"; PRESET=10m
      SHAPE=(--n-layers 6 --d-model 384 --d-ff 768 --seq-len 1024 --batch-size 4)
      ;;
    *) echo "unknown budget $BUDGET (2m, 8m, 32m or 10m-8m)" >&2; exit 2 ;;
  esac
  OUT="${RUNS:-runs}/budget/$BUDGET"
  RAW="docs/results/budget/$BUDGET/runs"
  LABEL="$BUDGET"
  COMMON=("${CORPUS[@]}" "${SHAPE[@]}"
    --tokens-per-step 4096 --steps "$STEPS" --lr 1e-3 --warmup-steps 40 --decay-fraction 0.2
    --min-lr-ratio 0 --weight-decay 0.1 --grad-clip 1.0 --eval-every "$EVAL"
    --checkpoint-every 50 --keep-checkpoints 1 --log-every 25 --sample-tokens 0 --no-progress)
  for seed in ${USER_SEEDS:-$DEFAULT_SEEDS}; do
    # Seed 2 runs only A and F, and so does the 10M shape; at 32M, L is left out (it tracks LLLF
    # at 2M and 8M). VARIANTS given by the caller wins.
    variants="$USER_VARIANTS"
    if [ -z "$variants" ]; then
      case "$BUDGET/$seed" in
        */2 | 10m-8m/*) variants="A F" ;;
        32m/*) variants="A F LLLF" ;;
        *) variants="A F LLLF L" ;;
      esac
    fi
    SEEDS="$seed" VARIANTS="$variants" run_grid
  done
  collect_raw "$RAW"
  [ -d "$RAW" ] && "$BIN" report "$RAW" --out "docs/results/budget/$BUDGET" "${CURVE[@]}"
done

# Every variant's paired difference to A against the budget (budget.md, budget.png), over the
# 3.7M budgets that have finished runs.
args=()
for b in 2m 8m 32m; do
  [ -d "docs/results/budget/$b/runs" ] && args+=(--budget "$b=docs/results/budget/$b/runs")
done
if [ "${#args[@]}" -ge 2 ]; then
  "$BIN" report "${args[@]}" --out docs/results/budget
fi
