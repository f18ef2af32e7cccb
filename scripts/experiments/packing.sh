#!/usr/bin/env bash
# Packed documents against windows: the 3.7M configuration of small.sh (L 4, d 256, H 8, d_ff
# 512, T 256, 4,096 tokens per step, 500 steps = 2M tokens, lr 1e-3, WSD80) on a corpus of many
# short documents — every paragraph of data/austen.txt and relation-train/data/moby_dick.txt as
# its own document (12,855 of them, ~390 bytes on average) — trained with `--packing documents`
# and with `--packing windows`, Relation (F) and attention (A), one seed.
#
#   scripts/experiments/packing.sh                # all four runs, then the evaluation table
#   STOP_AT=200 scripts/experiments/packing.sh    # stop each run at step 200; rerun to continue
#   COMMIT_EACH=1 scripts/experiments/packing.sh  # commit each run's raw metrics as it finishes
#
# Both layouts see the same tokens in the same order (the same windows of the same stream); they
# differ only in whether a row's documents see each other. Every final model is then scored on
# the same validation documents (2 % of them, by a hash of their text, all of them) in both
# layouts: documents (each document alone: what a model of independent documents should be
# judged by) and windows (with the preceding documents as context).
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=scripts/experiments/lib.sh
. scripts/experiments/lib.sh
ensure_bin

OUT="${OUT:-runs/packing}"
RAW="${RAW:-docs/results/packing/runs}"
LABEL="packing"
STEPS=500
SEEDS="${SEEDS:-0}"
VARIANTS="${VARIANTS:-F-documents F-windows A-documents A-windows}"
mkdir -p "$OUT"

# One JSON Lines record per paragraph (blank-line separated), JSON-escaped by awk.
DOCS="$OUT/paragraphs.jsonl"
if [ ! -s "$DOCS" ]; then
  for f in data/austen.txt relation-train/data/moby_dick.txt; do
    awk 'BEGIN { RS = "" } {
      gsub(/\r/, ""); gsub(/[\001-\010\013\014\016-\037]/, "")
      gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\n/, "\\n")
      printf "{\"text\": \"%s\"}\n", $0
    }' "$f"
  done > "$DOCS.tmp"
  mv "$DOCS.tmp" "$DOCS"
fi

COMMON=(--data "$DOCS" --split hash --val-fraction 0.02 --eval-tokens 0 --vocab-size 4096
  --n-layers 4 --d-model 256 --d-ff 512 --seq-len 256 --batch-size 16
  --tokens-per-step 4096 --steps "$STEPS" --lr 1e-3 --warmup-steps 40 --decay-fraction 0.2
  --min-lr-ratio 0 --weight-decay 0.1 --grad-clip 1.0 --eval-every 50
  --checkpoint-every 50 --keep-checkpoints 1 --log-every 25 --sample-tokens 0 --no-progress)

variant_flags() {
  local model packing="${1#*-}"
  case "${1%%-*}" in
    F) model="--preset cpu --pattern F --n-heads 8" ;;
    A) model="--preset cpu-mha --n-heads 8" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
  echo "$model --packing $packing"
}

ON_FINISH=commit_finished_run
run_grid
collect_raw "$RAW"

# Every finished run's final model in both layouts, on the whole validation split.
TABLE="docs/results/packing/eval.csv"
echo "run,trained_with,evaluated_with,tokens,loss,bits_per_byte" > "$TABLE.tmp"
for dir in "$OUT"/*-s*/; do
  name=$(basename "$dir")
  [ "$(finished_steps "$dir")" -ge "$STEPS" ] || continue
  trained=$(sed -n 's/.*"packing": "\(.*\)".*/\1/p' "$dir/config.json")
  for layout in documents windows; do
    line=$("$BIN" eval --run-dir "$dir" --packing "$layout" | tail -n 1)
    tokens=$(sed -n 's/.*: \([0-9]*\) tokens |.*/\1/p' <<< "$line")
    loss=$(sed -n 's/.*| loss \([0-9.]*\) nats.*/\1/p' <<< "$line")
    bpb=$(sed -n 's/.*| \([0-9.]*\) bits\/byte.*/\1/p' <<< "$line")
    echo "$name,$trained,$layout,$tokens,$loss,$bpb" >> "$TABLE.tmp"
  done
done
mv "$TABLE.tmp" "$TABLE"
cat "$TABLE"
"$BIN" report "$RAW" --out docs/results/packing --baseline A-windows
