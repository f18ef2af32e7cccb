#!/usr/bin/env bash
# The 3.7M model's training speed, ours against PyTorch CPU, interleaved: ROUNDS rounds of
# (our Relation, our MHA, PyTorch SDPA, PyTorch materialized Relation), then each one's median.
# Interleaving spreads this VM's drift over every contender instead of whichever ran last.
#
#   TORCH_PYTHON=/path/to/venv/bin/python scripts/bench/vs-torch.sh   # table on stdout
#
# Needs the release `relation` binary (`cargo build --release -p relation-train`) and a
# throw-away virtualenv with torch (never a project dependency).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${TORCH_PYTHON:?set TORCH_PYTHON to a python with torch}"
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-12}
BIN=${CARGO_TARGET_DIR:-target}/release
# shellcheck source=lib.sh
source scripts/bench/lib.sh   # train_rate
CFG37="--n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 --seq-len 256 --batch-size 16 --tokens-per-step 4096"
rate_of() { grep -oE '[0-9,]+ \|$|tokens/s=[0-9]+' | tr -dc '0-9'; }
declare -A all
for _ in $(seq "$ROUNDS"); do
  all[ours_relation]+="$(train_rate r --preset cpu $CFG37 | rate_of) "
  all[ours_mha]+="$(train_rate a --preset cpu-mha $CFG37 | rate_of) "
  all[torch_sdpa]+="$("$TORCH_PYTHON" scripts/bench/torch_cpu_train.py sdpa --steps "$STEPS" | rate_of) "
  all[torch_relation]+="$("$TORCH_PYTHON" scripts/bench/torch_cpu_train.py relation --steps "$STEPS" | rate_of) "
done
echo "| 3.7M model, 2 threads, $ROUNDS interleaved rounds of $STEPS steps | tokens/s per round | median |"
echo "|---|---|---|"
for k in ours_relation ours_mha torch_sdpa torch_relation; do
  python3 - "$k" ${all[$k]} <<'PY'
import statistics, sys
v = [int(x) for x in sys.argv[2:]]
print(f"| {sys.argv[1]} | {', '.join(f'{x:,}' for x in v)} | {statistics.median(v):,.0f} |")
PY
done
