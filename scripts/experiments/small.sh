#!/usr/bin/env bash
# The small-budget comparison: Relation (F) vs MHA (A) vs Hybrid (LLLF) and the
# paper's ablations (lambda = 0 frozen, single head, no Givens, raw input as information I = X,
# Exchange-only transport), three seeds each, on the State of
# the Union corpus (data/sotu.txt, contiguous split: first 90 % train, next 5 % validation, last
# 5 % unread), all with the same trainer, tokenizer, data order and validation tokens.
#
#   scripts/experiments/small.sh                # every variant, seeds 0 1 2
#   VARIANTS="F A" SEEDS=0 scripts/experiments/small.sh
#   STOP_AT=250 scripts/experiments/small.sh    # stop each run at step 250; rerun to continue
#   COMMIT_EACH=1 scripts/experiments/small.sh  # commit each run's raw metrics as it finishes
#
# Runs live in runs/small/<variant>-s<seed>/ (metrics.csv, config, checkpoints). A finished run is
# skipped, an unfinished one resumed bit-exactly, so the script can be stopped and rerun at will.
# `relation report runs/small --out docs/results` turns the runs into the table and plots.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=scripts/experiments/lib.sh
. scripts/experiments/lib.sh
# BIN=path/to/relation pins a prebuilt binary; otherwise it is built here.
ensure_bin

VARIANTS="${VARIANTS:-F A LLLF F-lambda0 F-1head F-nogivens F-rawx F-exonly}"
SEEDS="${SEEDS:-0 1 2}"
STEPS=500
OUT="${OUT:-runs/small}"
mkdir -p "$OUT"

# L 4, d 256, H 8 (1 for the single-head variant), d_ff 512, T 256, batch 16 (4,096 tokens per step), 500 steps, lr 1e-3 with 40
# warmup steps and a linear decay over the last 20 %, weight decay 0.1, clip 1.0, BPE 4096 trained
# on the training part. Validation: the same first 65,536 validation tokens for every run.
COMMON=(--data data/sotu.txt --split contiguous --val-fraction 0.05 --vocab-size 4096
  --n-layers 4 --d-model 256 --d-ff 512 --seq-len 256 --batch-size 16
  --tokens-per-step 4096 --steps "$STEPS" --lr 1e-3 --warmup-steps 40 --decay-fraction 0.2
  --min-lr-ratio 0 --weight-decay 0.1 --grad-clip 1.0 --eval-every 50 --eval-tokens 65536
  --checkpoint-every 50 --keep-checkpoints 1 --log-every 25 --sample-tokens 0 --no-progress)

variant_flags() {
  case "$1" in
    F) echo "--preset cpu --pattern F --n-heads 8" ;;
    A) echo "--preset cpu-mha --n-heads 8" ;;
    LLLF) echo "--preset cpu --pattern LLLF --n-heads 8" ;;
    F-lambda0) echo "--preset cpu --pattern F --n-heads 8 --lambda-init 0 --freeze-lambda" ;;
    F-1head) echo "--preset cpu --pattern F --n-heads 1 --no-givens" ;;
    F-nogivens) echo "--preset cpu --pattern F --n-heads 8 --no-givens" ;;
    F-rawx) echo "--preset cpu --pattern F --n-heads 8 --info-from-input" ;;
    F-exonly) echo "--preset cpu --pattern F --n-heads 8 --exchange-only" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

# The raw metrics of every run (what the report reads) go into the repository (with
# COMMIT_EACH=1, committed as each run finishes), then the report.
RAW="${RAW:-docs/results/small/runs}"
LABEL="small"
ON_FINISH=commit_finished_run
run_grid
collect_raw "$RAW"
"$BIN" report "$RAW" --out docs/results/small
