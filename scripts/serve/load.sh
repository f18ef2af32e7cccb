#!/usr/bin/env bash
# The server under load from a real HTTP client, beside in-process batched decoding of the same
# model widths, on this machine in one run (docs/bench/serving.md):
#   1. examples/batched_decode.rs: 1, 4, 16 streams of ~1K-token prompts through one
#      DecodeBatch in process (random weights of the 3.7M widths; speed does not depend on them);
#   2. `relation serve` on a run of the same widths and pattern, and scripts/serve/load.py: the
#      same concurrency from client threads, streamed, with time to first token.
#
#   scripts/serve/load.sh RUN_DIR [PATTERN]     # PATTERN: the run's layer pattern (default LLLF)
set -euo pipefail
cd "$(dirname "$0")/../.."
run="${1:?usage: scripts/serve/load.sh RUN_DIR [PATTERN]}"
pattern="${2:-LLLF}"
PYTHON="${PYTHON:-python3}"
cargo build --release -q -p relation-train --bin relation
cargo build --release -q -p relation-examples --example batched_decode
target="${CARGO_TARGET_DIR:-target}/release"
lscpu | grep -E "Model name|^CPU\(s\)" | sed 's/  */ /g'
echo "## In process (examples/batched_decode.rs, $pattern)"
"$target/examples/batched_decode" --patterns "$pattern" --context 1024 --streams 1,4,16 \
  --new-tokens 64 --repeats 2
log=$(mktemp)
"$target/relation" serve --run-dir "$run" --port 0 --max-context 2048 --max-batch 16 \
  --queue 64 2> "$log" &
server=$!
trap 'kill $server 2> /dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do grep -q "http://" "$log" && break; sleep 0.1; done
url=$(grep -o "http://[0-9.:]*" "$log" | head -1)
echo "## Server ($url, run $(basename "$run"))"
"$PYTHON" scripts/serve/load.py "$url" data/austen.txt --streams 1,4,16 --requests 2 \
  --max-tokens 64 --context 1024
kill -TERM $server
wait $server
