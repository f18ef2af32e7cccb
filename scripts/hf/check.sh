#!/usr/bin/env bash
# Hugging Face folders checked against the model that wrote them. For each run directory:
#   1. `relation export --format hf`, and `relation eval --per-token` on a short text;
#   2. the independent NumPy forward pass (scripts/hf/numpy_reference.py, which shares no code
#      with the Rust model or the PyTorch file) recomputes every log-likelihood: worst
#      difference <= 1e-4 nats;
#   3. with TORCH_PYTHON, the folder's own modeling_relation.py through transformers'
#      AutoModelForCausalLM the same way, plus greedy `generate`;
#   4. export -> import -> eval gives the log-likelihoods bit for bit, and exporting the import
#      gives the same model.safetensors byte for byte.
#
#   PYTHON=venv/bin/python scripts/hf/check.sh RUN_DIR...   # a python with numpy + safetensors
#   TORCH_PYTHON=venv/bin/python ...                        # also torch + transformers (not CI)
#   scripts/hf/check.sh --tiny                              # trains tiny F, L, LLLF and A runs first (CI)
#   RELATION=path/to/relation                               # default: the release build
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON="${PYTHON:-python3}"
RELATION="${RELATION:-}"
if [[ -z "$RELATION" ]]; then
  cargo build --release -q -p relation-train --bin relation
  RELATION="${CARGO_TARGET_DIR:-target}/release/relation"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

runs=("$@")
if [[ "${1:-}" == "--tiny" ]]; then
  runs=()
  # Small but not degenerate: 2 heads of 32, context 64, 30 steps (trained weights, not the
  # initialisation), on the shipped corpus's first 120 KB.
  head -c 120000 relation-train/data/moby_dick.txt > "$work/corpus.txt"
  for pattern in F L LLLF A; do
    layers=2; [[ $pattern == LLLF ]] && layers=4
    "$RELATION" train --run-dir "$work/run-$pattern" --cache-dir "$work/cache" \
      --data "$work/corpus.txt" --vocab-size 512 --d-model 64 --n-layers $layers --n-heads 2 \
      --d-ff 128 --pattern $pattern --seq-len 64 --batch-size 8 --tokens-per-step 512 \
      --steps 30 --warmup-steps 3 --lr 0.01 --eval-every 30 --eval-tokens 512 \
      --checkpoint-every 30 --sample-tokens 0 --no-progress > "$work/train-$pattern.log" 2>&1 \
      || { cat "$work/train-$pattern.log"; exit 1; }
    runs+=("$work/run-$pattern")
  done
fi
[[ ${#runs[@]} -gt 0 ]] || { echo "usage: scripts/hf/check.sh RUN_DIR... | --tiny" >&2; exit 2; }

# Text none of the runs trained on: the end of the shipped corpus (3,000 bytes).
tail -c 3000 relation-train/data/moby_dick.txt > "$work/text.txt"

for run in "${runs[@]}"; do
  name=$(basename "$run")
  hf="$work/$name-hf" back="$work/$name-back"
  "$RELATION" export --run-dir "$run" --format hf --out "$hf" > /dev/null
  "$RELATION" eval --run-dir "$run" --data "$work/text.txt" --packing windows \
    --per-token "$work/$name.jsonl" > /dev/null
  echo "== $name ($(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["mixer_pattern"], c["num_hidden_layers"], "layers, d", c["hidden_size"])' "$hf/config.json"))"
  echo -n "numpy:  "; "$PYTHON" scripts/hf/check_numpy.py "$hf" "$work/$name.jsonl"
  if [[ -n "${TORCH_PYTHON:-}" ]]; then
    "$TORCH_PYTHON" scripts/hf/check_torch.py "$hf" "$work/$name.jsonl" --prompt "Call me Ishmael." \
      2> >(grep -v "Loading weights" >&2)
  fi
  "$RELATION" import --from hf "$hf" --run-dir "$back" > /dev/null
  "$RELATION" eval --run-dir "$back" --data "$work/text.txt" --packing windows \
    --per-token "$work/$name-back.jsonl" > /dev/null
  cmp -s "$work/$name.jsonl" "$work/$name-back.jsonl" \
    || { echo "round trip: the imported run's log-likelihoods differ" >&2; exit 1; }
  "$RELATION" export --run-dir "$back" --format hf --out "$work/$name-again" > /dev/null
  cmp -s "$hf/model.safetensors" "$work/$name-again/model.safetensors" \
    || { echo "round trip: the weights changed" >&2; exit 1; }
  echo "round trip: export -> import -> eval identical, weights bit for bit"
done
