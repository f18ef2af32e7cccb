# Shared by the benchmark scripts (sourced; needs BIN and STEPS).

# Trainer throughput as a table row: tokens/s between the end of step 2 and the last step
# (excludes the tokenizer, the first allocations), from metrics.csv.
#   train_rate NAME [relation train flags…]
train_rate() {
  local name=$1; shift
  local dir
  dir=$(mktemp -d)
  "$BIN/relation" train --run-dir "$dir/run" --steps "$STEPS" --eval-every 100000 \
    --checkpoint-every 100000 --sample-tokens 0 --log-every 1000 "$@" > "$dir/log" 2>&1 \
    || { cat "$dir/log" >&2; exit 1; }
  python3 - "$dir/run/metrics.csv" "$name" "$*" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["loss"]]
a, b = rows[1], rows[-1]
rate = (float(b["tokens"]) - float(a["tokens"])) / (float(b["elapsed_s"]) - float(a["elapsed_s"]))
print(f"| {sys.argv[2]} | `{sys.argv[3]}` | {rate:,.0f} |")
PY
  rm -rf "$dir"
}
