#!/usr/bin/env bash
# A/B of two `relation` binaries on the trainer, interleaved (A, B, A, B, …) so this VM's drift
# hits both alike. Per run: the median tokens/s of steps 2..8 and the fastest step's forward +
# backward time (from RUST_LOG=relation_train=debug). Even A = B differs by 10-30 % between runs
# here: compare medians over several rounds, never one pair.
#
#   scripts/bench/ab.sh path/to/A/relation path/to/B/relation [ROUNDS] -- [relation train flags]
#   e.g. scripts/bench/ab.sh /tmp/a/relation target/release/relation 4 -- --preset cpu
set -euo pipefail
a=$1 b=$2
shift 2
rounds=3
if [[ ${1:-} != -- ]]; then rounds=$1; shift; fi
shift # --
run() {
  local bin=$1 dir
  shift
  dir=$(mktemp -d)
  RUST_LOG=relation_train=debug "$bin" train --run-dir "$dir/run" --steps 8 --eval-every 100000 \
    --checkpoint-every 100000 --sample-tokens 0 --log-every 1 "$@" > "$dir/log" 2>&1 \
    || { cat "$dir/log" >&2; exit 1; }
  python3 - "$dir/log" <<'PY'
import re, statistics, sys
log = open(sys.argv[1]).read()
steps = [float(f) + float(b) for f, b in re.findall(r"forward_ms=([\d.]+) backward_ms=([\d.]+)", log)][1:]
rates = [float(r) for r in re.findall(r"\| (\d+) tok/s", log)][1:]
print(f"tokens/s {statistics.median(rates):,.0f} | fastest step {min(steps):,.0f} ms")
PY
  rm -rf "$dir"
}
for _ in $(seq "$rounds"); do
  echo "A $(run "$a" "$@")"
  echo "B $(run "$b" "$@")"
done
