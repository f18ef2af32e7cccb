"""Load on `relation serve` from a real HTTP client (Python's http.client, one connection per
request, server-sent events read as they arrive).

usage: load.py URL CORPUS [--streams 1,4,16] [--requests 2] [--max-tokens 64] [--context 1024]

For each concurrency C, C client threads each send --requests streamed completions one after
another (prompts: slices of CORPUS of about --context tokens, from 1/2 to 3/2 of it; `ignore_eos`
so every completion has --max-tokens tokens). Prints one Markdown row per C: total completion
tokens per second over the wall time, each stream's tokens/s after its first token, and the
median and worst time to first token.
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlparse

parser = argparse.ArgumentParser()
parser.add_argument("url")
parser.add_argument("corpus")
parser.add_argument("--streams", default="1,4,16")
parser.add_argument("--requests", type=int, default=2)
parser.add_argument("--max-tokens", type=int, default=64)
parser.add_argument("--context", type=int, default=1024)
parser.add_argument("--chars-per-token", type=float, default=3.6)
args = parser.parse_args()
host = urlparse(args.url)
text = open(args.corpus, encoding="utf-8").read()


def prompt(rng):
    tokens = args.context // 2 + rng.randrange(args.context)
    chars = int(tokens * args.chars_per_token)
    start = rng.randrange(len(text) - chars)
    return text[start : start + chars]


def one(p, seed):
    """(seconds to the first token, seconds in all, completion tokens, prompt tokens)."""
    body = json.dumps(
        {"prompt": p, "max_tokens": args.max_tokens, "temperature": 1.0, "seed": seed,
         "stream": True, "ignore_eos": True, "logprobs": 0}
    )
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, (response.status, response.read())
    first, tokens = None, 0
    for line in response:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        lp = chunk["choices"][0]["logprobs"]
        if lp and lp["tokens"]:
            tokens += len(lp["tokens"])
            if first is None:
                first = time.perf_counter() - start
    conn.close()
    return first, time.perf_counter() - start, tokens


print(f"| concurrent streams | requests | completion tok/s (all) | per stream tok/s after first token | TTFT median s | TTFT worst s |")
print("|---|---|---|---|---|---|")
for c in [int(s) for s in args.streams.split(",")]:
    results, lock = [], threading.Lock()

    def client(k):
        rng = random.Random(1000 * c + k)
        for r in range(args.requests):
            out = one(prompt(rng), 10 * k + r)
            with lock:
                results.append(out)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    total = sum(r[2] for r in results)
    assert total == c * args.requests * args.max_tokens, total
    ttft = [r[0] for r in results]
    per_stream = statistics.median((r[2] - 1) / (r[1] - r[0]) for r in results)
    print(f"| {c} | {len(results)} | {total / wall:.1f} | {per_stream:.1f} | {statistics.median(ttft):.2f} | {max(ttft):.2f} |")
