#!/usr/bin/env bash
# Runs on a lent GPU machine (no toolchain, no network), from the repository root, with .gpu/
# and .gl/ carried (see build.sh). Writes its logs and tables under $OUT; at most 9.5 minutes (the sum of its timeouts, 560 s), usually far less.
set -uo pipefail
OUT="${OUT:-/tmp/relation-gpu}"
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
if ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1 \
   && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
mkdir -p /tmp/bin
for b in kernels flash_relation_bench linear_relation_bench relation; do xz -dc ".gpu/$b.xz" > "/tmp/bin/$b"; chmod +x "/tmp/bin/$b"; done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1

# 1. Kernel tests on the GPU (Device::wgpu picks the GPU through Vulkan / SPIR-V).
timeout 200 /tmp/bin/kernels --test-threads 1 > "$OUT/kernel-tests.log" 2>&1
echo "kernel tests exit $?" >> "$OUT/kernel-tests.log"
tail -3 "$OUT/kernel-tests.log"

# 2. Benchmarks: forward and training, fused vs materialized vs Burn attention.
timeout 80 /tmp/bin/flash_relation_bench --device wgpu --seqs 256,512,1024,2048,4096 --iters 10 \
  --dtype f32 --out "$OUT/flash_relation_f32.md" > "$OUT/bench-f32.log" 2>&1
timeout 80 /tmp/bin/flash_relation_bench --device wgpu --seqs 256,512,1024,2048,4096 --iters 10 \
  --dtype f16 --out "$OUT/flash_relation_f16.md" > "$OUT/bench-f16.log" 2>&1
# 3. Linear Relation scaling (chunked and recurrent kernels) against FlashRelation, up to 64K tokens.
timeout 140 /tmp/bin/linear_relation_bench --device wgpu --seqs 1024,2048,4096,8192,16384,32768,65536 \
  --max-flash 16384 --iters 3 --chunk 64 --out "$OUT/linear_relation.md" > "$OUT/bench-linear.log" 2>&1
# 4. The trainer's default run on the GPU (tokens/s, loss), stopped early; the full log is kept.
timeout 60 /tmp/bin/relation train --device vulkan --cache-dir /tmp/relation-cache \
  --run-dir /tmp/train-run --no-progress --log-every 10 > "$OUT/train.log" 2>&1
echo "train exit $?" >> "$OUT/train.log"
cp /tmp/train-run/metrics.csv /tmp/train-run/loss.png "$OUT/" 2>/dev/null
cat "$OUT"/flash_relation_*.md "$OUT"/linear_relation.md
tail -8 "$OUT/train.log"
