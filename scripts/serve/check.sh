#!/usr/bin/env bash
# `relation serve` driven by the official `openai` Python client: a tiny model is trained on
# one short sentence per document, served on a free localhost port, and checked by
# scripts/serve/check_openai.py (greedy answers equal `relation generate`, echo + logprobs equal
# `relation eval --per-token`, streaming, 32 concurrent requests, every refusal's status); then
# SIGTERM must stop the server cleanly. The server is always stopped on exit.
#
#   PYTHON=venv/bin/python scripts/serve/check.sh   # a python with the `openai` package
#   RELATION=path/to/relation                      # default: the release build
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON="${PYTHON:-python3}"
RELATION="${RELATION:-}"
if [[ -z "$RELATION" ]]; then
  cargo build --release -q -p relation-train --bin relation
  RELATION="${CARGO_TARGET_DIR:-target}/release/relation"
fi
work=$(mktemp -d)
server=""
cleanup() {
  [[ -n "$server" ]] && kill "$server" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The training text: "the <animal> sat on the mat." one per document (JSON Lines).
"$PYTHON" -c '
import json, sys
names = ["cat", "dog", "fox", "owl"]
with open(sys.argv[1], "w") as f:
    for i in range(3000):
        f.write(json.dumps({"text": f"the {names[(i * 7 + i // 5) % 4]} sat on the mat."}) + "\n")
' "$work/sat.jsonl"
"$RELATION" train --run-dir "$work/run" --cache-dir "$work/cache" --data "$work/sat.jsonl" \
  --split contiguous --vocab-size 300 --d-model 32 --n-layers 2 --n-heads 2 --d-ff 64 \
  --seq-len 32 --batch-size 4 --tokens-per-step 256 --steps 40 --warmup-steps 4 --lr 0.01 \
  --eval-every 40 --eval-tokens 256 --checkpoint-every 40 --sample-tokens 0 --no-progress \
  > "$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }

# What the server must agree with.
"$RELATION" generate --run-dir "$work/run" --temperature 0 --prompt "the owl" \
  --max-new-tokens 20 > "$work/generate.txt"
printf 'the cat sat on the mat. the dog sat on the mat.' > "$work/text.txt"
"$RELATION" eval --run-dir "$work/run" --data "$work/text.txt" --packing windows \
  --per-token "$work/tokens.jsonl" > /dev/null

"$RELATION" serve --run-dir "$work/run" --port 0 --max-batch 8 --queue 64 \
  2> "$work/serve.log" &
server=$!
for _ in $(seq 1 600); do
  grep -q "http://" "$work/serve.log" && break
  kill -0 "$server" 2> /dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done
url=$(grep -o "http://[0-9.:]*" "$work/serve.log" | head -1)
[[ -n "$url" ]] || { echo "the server printed no address" >&2; cat "$work/serve.log"; exit 1; }

timeout 300 "$PYTHON" scripts/serve/check_openai.py "$url" "$work/generate.txt" \
  "$work/text.txt" "$work/tokens.jsonl"

kill -TERM "$server"
status=0
timeout 60 tail --pid="$server" -f /dev/null || status=$?
wait "$server" || { echo "the server exited with an error after SIGTERM" >&2; cat "$work/serve.log"; exit 1; }
server=""
[[ $status -eq 0 ]] || { echo "the server did not stop within 60 s of SIGTERM" >&2; exit 1; }
grep -q "stopped: every request in flight has finished" "$work/serve.log"
echo "SIGTERM: stopped cleanly; $(grep -c 'completion_tokens=' "$work/serve.log") requests logged"
