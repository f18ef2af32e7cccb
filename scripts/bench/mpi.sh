#!/usr/bin/env bash
# Data parallel over MPI ranks on one machine, measured (docs/bench/mpi.md):
#  1. the gradient exchange alone (examples/mpi_exchange.rs) at the gradient sizes of the 3.7M,
#     10M and 100M presets, on 2 and 4 ranks, against the ring all-reduce traffic model;
#  2. the 3.7M model (`--preset cpu --pattern F`, the budget runs' backbone) training 4
#     micro-batches of 8 x 256 tokens per step: one process with 2 threads, 2 ranks with 1
#     thread each, one process with 1 thread, 4 ranks with 1 thread each (more ranks than cores:
#     each rank then runs at a share of a core), interleaved over ROUNDS rounds.
# Needs the system's MPI (openmpi-bin, libopenmpi-dev) and libclang to build.
#
#   scripts/bench/mpi.sh [ROUNDS] [STEPS]      # default 2 rounds of 20 steps
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
steps=${2:-20}
cargo build --release -q -p relation-train --features mpi
cargo build --release -q -p relation-examples --features mpi --example mpi_exchange
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(mpirun --version | head -1)"
echo "## exchange alone"
for n in 2 4; do
  mpirun -np "$n" -x RAYON_NUM_THREADS=1 target/release/examples/mpi_exchange \
    --params 3670000,10430000,84570000 --reps 10
done

echo "## training, 3.7M F, 4 micro-batches of 8 x 256 tokens per step, $steps steps"
run() { # label, ranks, threads
  local dir
  dir=$(mktemp -d)
  local cmd=(target/release/relation train --run-dir "$dir/run" --preset cpu --pattern F
    --n-heads 8 --batch-size 8 --seq-len 256 --tokens-per-step 8192 --steps "$steps"
    --eval-every 100000 --checkpoint-every 100000 --sample-tokens 0 --log-every 1 --no-progress)
  if [[ $2 == 1 ]]; then
    RAYON_NUM_THREADS=$3 "${cmd[@]}" > "$dir/log" 2>&1
  else
    mpirun -np "$2" -x RAYON_NUM_THREADS="$3" "${cmd[@]}" > "$dir/log" 2>&1
  fi
  python3 - "$1" "$dir/log" <<'PY'
import re, statistics, sys
label, log = sys.argv[1], open(sys.argv[2]).read()
rates = [float(r) for r in re.findall(r"\| (\d+) tok/s", log)][2:]
comm = re.search(r"spent ([\d.]+) % of its step time", log)
share = f"{comm.group(1)} %" if comm else "-"
print(f"| {label} | {statistics.median(rates):,.0f} | {share} |")
PY
  rm -rf "$dir"
}
echo "| processes x threads | tokens/s (median of steps 3..) | step time exchanging |"
echo "|---|---:|---:|"
for r in $(seq "$rounds"); do
  run "1 x 2" 1 2
  run "2 ranks x 1" 2 1
  run "1 x 1" 1 1
  run "4 ranks x 1" 4 1
done
