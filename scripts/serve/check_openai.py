"""`relation serve` checked with the official `openai` client (scripts/serve/check.sh runs it).

usage: check_openai.py URL GENERATE_TXT TEXT_TXT PER_TOKEN_JSONL

GENERATE_TXT: `relation generate --temperature 0 --prompt "the owl" --max-new-tokens 20`'s output;
TEXT_TXT and PER_TOKEN_JSONL: a text and `relation eval --per-token` on it.
"""

import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai

url, generate_txt, text_txt, per_token = sys.argv[1:5]
client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

models = client.models.list()
model = models.data[0].id
print(f"model {model!r}")

# Greedy: the same continuation as `relation generate`.
want = open(generate_txt).read()
answer = client.completions.create(model=model, prompt="the owl", max_tokens=20, temperature=0)
got = "the owl" + answer.choices[0].text + "\n"
assert got == want, (got, want)
assert answer.choices[0].finish_reason == "stop", answer
assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
print(f"greedy: {answer.choices[0].text!r} == relation generate")

# Streaming: the same text, piece by piece.
pieces, reasons = [], []
for chunk in client.completions.create(
    model=model, prompt="the owl", max_tokens=20, temperature=0, stream=True
):
    pieces.append(chunk.choices[0].text)
    reasons.append(chunk.choices[0].finish_reason)
assert "".join(pieces) == answer.choices[0].text, pieces
assert reasons[-1] == "stop" and all(r is None for r in reasons[:-1]), reasons
print(f"stream: {len(pieces)} chunks, same text")

# echo + logprobs: the log-likelihoods of `relation eval --per-token`.
text = open(text_txt).read()
window = json.loads(open(per_token).readline())
scored = client.completions.create(
    model=model, prompt=text, max_tokens=0, echo=True, logprobs=1
)
lp = scored.choices[0].logprobs
assert lp.token_logprobs[0] is None
assert "".join(lp.tokens) == text
served = lp.token_logprobs[1:]
worst = max(abs(a - b) for a, b in zip(served, window["logprobs"]))
assert len(served) >= 10 and worst < 1e-4, (len(served), worst)
print(f"echo + logprobs: {len(served)} tokens, worst |served - eval| {worst:.1e}")

# 32 concurrent requests, half streamed: no error, every greedy answer the same.
def one(i):
    prompt = ["the owl", "the dog", "the cat", "the fox"][i % 4]
    if i % 2:
        return "".join(
            c.choices[0].text
            for c in client.completions.create(
                model=model, prompt=prompt, max_tokens=20, temperature=0, stream=True
            )
        )
    return client.completions.create(
        model=model, prompt=prompt, max_tokens=20, temperature=0
    ).choices[0].text

with ThreadPoolExecutor(32) as pool:
    outs = list(pool.map(one, range(32)))
assert all(o == " sat on the mat." for o in outs), outs
print("32 concurrent requests: all answered, all equal")

# Refusals, each with its status.
def status_of(**kwargs):
    try:
        client.completions.create(model=model, **kwargs)
    except openai.APIStatusError as e:
        return e.status_code, e.body
    raise AssertionError(f"accepted: {kwargs}")

code, body = status_of(prompt="the cat sat on the mat. " * 12)
assert code == 400 and "context is 32 tokens" in body["message"], body
code, body = status_of(prompt="the owl", temperature=7)
assert code == 400 and body["param"] == "temperature", body
code, body = status_of(prompt="the owl", extra_body={"n": 0})
assert code == 400 and body["param"] == "n", body
# Malformed JSON, sent raw (the client library only sends valid JSON).
request = urllib.request.Request(
    url + "/v1/completions", data=b'{"prompt": "the', headers={"Content-Type": "application/json"}
)
try:
    urllib.request.urlopen(request)
    raise AssertionError("malformed JSON accepted")
except urllib.error.HTTPError as e:
    assert e.code == 400 and "not valid JSON" in json.loads(e.read())["error"]["message"], e
print("refusals: 400 with the field named, malformed JSON 400")
