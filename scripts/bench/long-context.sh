#!/usr/bin/env bash
# Long-context training cost on this machine: batch 1, the 3.7M configuration's widths (d 256,
# H 8, d_ff 512, 4 layers, vocab 4096), one row of T tokens of data/sotu.txt per step, for
# T in $LENGTHS and patterns $PATTERNS, with and without --activation-checkpointing: seconds per
# step (the second step, after the first one's allocations), tokens/s and the process's peak
# resident memory. A run that passes $LIMIT_S seconds or $MEM_GIB GiB of resident memory is
# stopped and recorded as such (the next length of that pattern and mode is then skipped).
#
#   scripts/bench/long-context.sh                  # rows appended to $OUT (CSV), table on stdout,
#                                                  # plot beside $OUT (long-context.png)
#   LENGTHS="4096 16384" PATTERNS=L scripts/bench/long-context.sh
#
# Needs the release `relation` binary (`cargo build --release -p relation-train`). Resumable:
# rows already in $OUT are not rerun.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release/relation}
LENGTHS=${LENGTHS:-"4096 16384 32768 65536 131072"}
PATTERNS=${PATTERNS:-"L LLLF F A"}
MODES=${MODES:-"checkpointed plain"}
LIMIT_S=${LIMIT_S:-1200}
MEM_GIB=${MEM_GIB:-20}
OUT=${OUT:-docs/bench/long-context.csv}
CACHE=${CACHE:-$HOME/.cache/relation}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

[ -s "$OUT" ] || echo "pattern,mode,seq_len,status,s_per_step,tokens_per_s,peak_rss_mib" > "$OUT"
mem_kib=$((MEM_GIB * 1024 * 1024))

# One run; prints "status,s_per_step,tokens_per_s,peak_rss_mib".
run() {
  local pattern=$1 mode=$2 t=$3 dir="$WORK/run" extra=()
  rm -rf "$dir"
  [ "$mode" = checkpointed ] && extra+=(--activation-checkpointing)
  [ "$pattern" = A ] && extra+=(--preset cpu-mha) || extra+=(--preset cpu --pattern "$pattern")
  /usr/bin/time -f "%M" -o "$WORK/rss" timeout "$LIMIT_S" "$BIN" train --run-dir "$dir" \
    --data data/sotu.txt --vocab-size 4096 --cache-dir "$CACHE" --packing windows \
    --n-layers 4 --d-model 256 --n-heads 8 --d-ff 512 \
    --seq-len "$t" --batch-size 1 --tokens-per-step "$t" --steps 2 --log-every 1 \
    --eval-every 100000 --checkpoint-every 100000 --sample-tokens 0 "${extra[@]}" \
    > "$WORK/log" 2>&1 &
  local pid=$! status=ok
  # Resident memory watchdog: the trainer is the `time` process's child.
  while kill -0 "$pid" 2>/dev/null; do
    local child rss
    child=$(pgrep -P "$(pgrep -P "$pid" | head -1)" 2>/dev/null | head -1 || true)
    rss=$(awk '/VmRSS/ {print $2}' "/proc/${child:-0}/status" 2>/dev/null || echo 0)
    if [ "${rss:-0}" -gt "$mem_kib" ]; then
      status="over ${MEM_GIB} GiB"
      kill -9 "$child" 2>/dev/null || true
    fi
    sleep 1
  done
  wait "$pid" || true
  local peak
  peak=$(tail -1 "$WORK/rss" | tr -dc '0-9')
  if [ "$status" = ok ] && ! grep -q "^2," "$dir/metrics.csv" 2>/dev/null; then
    if grep -q "Command exited with non-zero status 124" "$WORK/rss"; then
      status="over ${LIMIT_S} s"
    else
      status="failed: $(grep -iE 'error|panick' "$WORK/log" | head -1 | tr ',' ';' | cut -c1-120)"
    fi
  fi
  if [ "$status" = ok ]; then
    python3 - "$dir/metrics.csv" "$t" "${peak:-0}" <<'PY'
import csv, sys
rows = {r["step"]: r for r in csv.DictReader(open(sys.argv[1])) if r["loss"]}
s = float(rows["2"]["elapsed_s"]) - float(rows["1"]["elapsed_s"])
print(f"ok,{s:.2f},{int(sys.argv[2]) / s:.0f},{int(sys.argv[3]) / 1024:.0f}")
PY
  else
    echo "$status,,,$(( ${peak:-0} / 1024 ))"
  fi
}

for pattern in $PATTERNS; do
  for mode in $MODES; do
    skip=""
    for t in $LENGTHS; do
      if grep -q "^$pattern,$mode,$t," "$OUT"; then
        grep -q "^$pattern,$mode,$t,ok," "$OUT" || skip=1
        continue
      fi
      if [ -n "$skip" ]; then
        echo "$pattern,$mode,$t,skipped (a shorter length did not fit),,," >> "$OUT"
        continue
      fi
      row=$(run "$pattern" "$mode" "$t")
      echo "$pattern,$mode,$t,$row" >> "$OUT"
      echo "$pattern $mode T=$t: $row" >&2
      [[ $row == ok,* ]] || skip=1
    done
  done
done

python3 - "$OUT" <<'PY'
import csv, sys
print("| pattern | checkpointing | T | s / step | tokens/s | peak RSS (MiB) |")
print("|---|---|---|---|---|---|")
for r in csv.DictReader(open(sys.argv[1])):
    ckpt = "yes" if r["mode"] == "checkpointed" else "no"
    rss = f"{int(r['peak_rss_mib']):,}" if r["peak_rss_mib"] else ""
    if r["status"] == "ok":
        cells = [r["s_per_step"], f"{int(r['tokens_per_s']):,}", rss]
    else:
        cells = [r["status"], "", rss]
    print(f"| {r['pattern']} | {ckpt} | {int(r['seq_len']):,} | " + " | ".join(cells) + " |")
PY
"$BIN" report --long-context "$OUT" --out "$(dirname "$OUT")" >&2 || echo "(no plot)" >&2
