"""PyTorch's CPU GEMM at the 3.7M model's product shapes, to read our `examples/matmul_bench`
against (same machine, same thread count). Run with a throw-away virtualenv's python:

    /path/to/venv/bin/python scripts/bench/torch_gemm.py [--threads 2] [--tokens 4096]

Prints GFLOP/s of `a @ b` per shape: the best of 5 timings, each the mean of 5 products, after
3 warm-up products.
"""
import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--tokens", type=int, default=4096, help="rows M of the token-parallel products")
args = parser.parse_args()
torch.set_num_threads(args.threads)
m = args.tokens
# (name, M, K, N): d = 256, d_ff = 512, vocabulary 4096, and a square reference.
shapes = [
    ("x @ W (d -> d)", m, 256, 256),
    ("x @ W (d -> 2 d)", m, 256, 512),
    ("x @ W (2 d -> d)", m, 512, 256),
    ("x @ W (d -> 4 d)", m, 256, 1024),
    ("x @ E^T (LM head)", m, 256, 4096),
    ("square 1024", 1024, 1024, 1024),
]
print(f"torch {torch.__version__}, {args.threads} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}")
print("| product | M x K x N | GFLOP/s |")
print("|---|---|---|")
for name, rows, k, n in shapes:
    a, b = torch.randn(rows, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        best = min(best, (time.perf_counter() - start) / 5)
    print(f"| {name} | {rows} x {k} x {n} | {2 * rows * k * n / best / 1e9:.1f} |")
