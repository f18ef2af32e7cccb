#!/usr/bin/env bash
# Training speed, ours against PyTorch CPU on the same model, interleaved: ROUNDS rounds of
# (our Relation, our MHA, PyTorch SDPA eager and torch.compile'd, PyTorch materialized Relation
# eager and compiled), then each one's median. Interleaving spreads the machine's drift over
# every contender instead of whichever ran last. Two shapes: the 3.7M model of the results page
# (L 4, d 256, H 8, d_ff 512, T 256, batch 16) and the paper's 10M shape (L 6, d 384, H 8,
# d_ff 768, T 1024, batch 4); 4,096 tokens per step for both.
#
#   TORCH_PYTHON=/path/to/venv/bin/python scripts/bench/vs-torch.sh      # both shapes
#   SHAPES=3.7m ROUNDS=5 TORCH_PYTHON=... scripts/bench/vs-torch.sh
#
# Needs the release `relation` binary (`cargo build --release -p relation-train`) and a
# throw-away virtualenv with torch (never a project dependency). The compiled contenders are
# compiled on their first step, which is not timed (every rate is from step 2 to the last).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${TORCH_PYTHON:?set TORCH_PYTHON to a python with torch}"
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-12}
SHAPES=${SHAPES:-3.7m 10m}
BIN=${CARGO_TARGET_DIR:-target}/release
# shellcheck source=lib.sh
source scripts/bench/lib.sh   # train_rate
rate_of() { grep -oE '[0-9,]+ \|$|tokens/s=[0-9]+' | tr -dc '0-9'; }
CONTENDERS="ours_relation ours_mha torch_sdpa torch_sdpa_compiled torch_relation torch_relation_compiled"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, ${RAYON_NUM_THREADS:-$(nproc)} threads; commit $(git rev-parse --short HEAD)"
for shape in $SHAPES; do
  case "$shape" in
    3.7m)
      ours="--n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 --seq-len 256 --batch-size 16 --tokens-per-step 4096"
      theirs="--layers 4 --d-model 256 --heads 8 --d-ff 512 --seq-len 256 --batch 16"
      relation="--preset cpu"; mha="--preset cpu-mha" ;;
    10m)
      ours="--seq-len 1024 --batch-size 4 --tokens-per-step 4096"
      theirs="--layers 6 --d-model 384 --heads 8 --d-ff 768 --seq-len 1024 --batch 4"
      relation="--preset 10m"; mha="--preset 10m-mha" ;;
    *) echo "unknown shape $shape (3.7m or 10m)" >&2; exit 2 ;;
  esac
  declare -A all=()
  for _ in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    {
      all[ours_relation]+="$(train_rate r $relation $ours | rate_of) "
      all[ours_mha]+="$(train_rate a $mha $ours | rate_of) "
      for mixer in sdpa relation; do
        all[torch_$mixer]+="$("$TORCH_PYTHON" scripts/bench/torch_cpu_train.py $mixer $theirs --steps "$STEPS" | rate_of) "
        all[torch_${mixer}_compiled]+="$("$TORCH_PYTHON" scripts/bench/torch_cpu_train.py $mixer $theirs --steps "$STEPS" --compile | rate_of) "
      done
    }
  done
  echo
  echo "| $shape model, $ROUNDS interleaved rounds of $STEPS steps | tokens/s per round | median | ours_relation / this |"
  echo "|---|---|---|---|"
  for k in $CONTENDERS; do
    python3 - "$k" "${all[ours_relation]}" ${all[$k]} <<'PY'
import statistics, sys
ours = statistics.median(int(x) for x in sys.argv[2].split())
v = [int(x) for x in sys.argv[3:]]
m = statistics.median(v)
print(f"| {sys.argv[1]} | {', '.join(f'{x:,}' for x in v)} | {m:,.0f} | {ours / m:.2f}x |")
PY
  done
  unset all
done
