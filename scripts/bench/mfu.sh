#!/usr/bin/env bash
# The training step's share of the machine's GEMM ceiling, measured in the same run: each round
# times the matrix products at the model's shapes (`dense`'s, through `examples/matmul_bench`:
# faer's GEMM, or this workspace's AVX-512 one on Intel; and
# PyTorch's when TORCH_PYTHON is set), then trains the 3.7M Relation model of the results page
# (d 256, 4 layers, 8 heads, d_ff 512, T 256, 4,096 tokens per step) for STEPS steps. Rounds
# alternate products and trainer, so the machine's drift hits both alike.
#
# The ceiling of a round is the fastest of the measured rates at the two shapes that carry most
# of the step's FLOPs, `x @ W` with d -> d and d -> 2d (`dense`'s or PyTorch's, whichever is
# higher); the trainer's rate is the median model GFLOP/s (FLOPs per token from the model's
# configuration, times tokens/s) of steps 5..STEPS.
#
#   scripts/bench/mfu.sh                                    # 3 rounds, `dense`'s ceiling only
#   ROUNDS=5 TORCH_PYTHON=/path/to/venv/bin/python scripts/bench/mfu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
PATTERN=${PATTERN:-F}
cargo build --release -q -p relation-train
cargo build --release -q -p relation-examples --example matmul_bench
TARGET=${CARGO_TARGET_DIR:-target}/release
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; pattern $PATTERN; commit $(git rev-parse --short HEAD)"
echo
echo "| round | \`dense\` d → d | \`dense\` d → 2d | PyTorch d → d | PyTorch d → 2d | ceiling | trainer model GFLOP/s (steps 5..$STEPS: min, median, max) | median / ceiling |"
echo "|---|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  : > "$run/torch"
  if [ -n "${TORCH_PYTHON:-}" ]; then
    "$TORCH_PYTHON" scripts/bench/torch_gemm.py > "$run/torch"
  fi
  "$TARGET/examples/matmul_bench" > "$run/faer"
  rm -rf "$run/r"
  "$TARGET/relation" train --preset cpu --pattern "$PATTERN" --n-layers 4 --d-model 256 \
    --n-heads 8 --d-ff 512 --seq-len 256 --batch-size 16 --tokens-per-step 4096 \
    --data data/sotu.txt --steps "$STEPS" --log-every 1 --eval-every 100000 \
    --sample-tokens 0 --checkpoint-every 100000 --no-progress --run-dir "$run/r" > "$run/log" 2>&1 \
    || { cat "$run/log" >&2; exit 1; }
  python3 - "$round" "$run/faer" "$run/torch" "$run/r/metrics.csv" <<'PY'
import csv, re, statistics, sys

round_, faer, torch, metrics = sys.argv[1:]

def rate(path, name, column):
    # The GFLOP/s column of the table row whose product cell is `name`.
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == name:
            return float(cells[column])
    return None

faer_dd = rate(faer, "x @ W (d -> d)", 5)   # `dense` GFLOP/s (column 6 of 6)
faer_d2 = rate(faer, "x @ W (d -> 2 d)", 5)
torch_dd = rate(torch, "x @ W (d -> d)", 2)
torch_d2 = rate(torch, "x @ W (d -> 2 d)", 2)
ceiling = max(r for r in (faer_dd, faer_d2, torch_dd, torch_d2) if r is not None)
rows = [r for r in csv.DictReader(open(metrics)) if r["loss"] and int(r["step"]) >= 5]
gflops = sorted(float(r["model_gflop_per_s"]) for r in rows)
med = statistics.median(gflops)
fmt = lambda r: "—" if r is None else f"{r:.1f}"
print(f"| {round_} | {fmt(faer_dd)} | {fmt(faer_d2)} | {fmt(torch_dd)} | {fmt(torch_d2)} | {ceiling:.1f} "
      f"| {gflops[0]:.1f}, {med:.1f}, {gflops[-1]:.1f} | {100 * med / ceiling:.0f} % |")
PY
done
