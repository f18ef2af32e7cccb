#!/usr/bin/env bash
# Runs on a GPU machine without a toolchain or network access, from the repository root, with .gpu/
# and .gl/ carried (see build.sh). Writes its logs and tables under $OUT. At most 9.5 minutes
# (the sum of its timeouts), usually far less. With a `--cuda` build (.gpu/features names
# `cuda`) every step runs on CUDA as well, with shorter Vulkan steps to fit.
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
features=$(cat .gpu/features 2>/dev/null || echo vulkan)
cp .gpu/features "$OUT/features.txt" 2>/dev/null
if [[ "$features" == *cuda* ]]; then devices="wgpu cuda"; t_flash=40; t_linear=60; t_train=35
else devices="wgpu"; t_flash=80; t_linear=140; t_train=60; fi

# 1. Kernel tests on the GPU: every test runs on each compiled-in GPU device (Device::wgpu picks
#    the GPU through Vulkan / SPIR-V; Device::cuda(0) through PTX), and on Flex.
timeout 200 /tmp/bin/kernels --test-threads 1 > "$OUT/kernel-tests.log" 2>&1
echo "kernel tests exit $?" >> "$OUT/kernel-tests.log"
tail -3 "$OUT/kernel-tests.log"

for dev in $devices; do
  # 2. Benchmarks: forward and training, fused vs materialized vs Burn attention.
  for dtype in f32 f16; do
    timeout $t_flash /tmp/bin/flash_relation_bench --device $dev --seqs 256,512,1024,2048,4096 --iters 10 \
      --dtype $dtype --out "$OUT/flash_relation_${dtype}_$dev.md" > "$OUT/bench-${dtype}-$dev.log" 2>&1
  done
  # 3. Linear Relation scaling (chunked and recurrent kernels) against FlashRelation, up to 64K tokens.
  timeout $t_linear /tmp/bin/linear_relation_bench --device $dev --seqs 1024,2048,4096,8192,16384,32768,65536 \
    --max-flash 16384 --iters 3 --chunk 64 --out "$OUT/linear_relation_$dev.md" > "$OUT/bench-linear-$dev.log" 2>&1
  # 4. The trainer's default run on the GPU (tokens/s, loss), stopped early; the full log is kept.
  train_dev=$([ "$dev" = wgpu ] && echo vulkan || echo cuda:0)
  timeout $t_train /tmp/bin/relation train --device "$train_dev" --cache-dir /tmp/relation-cache \
    --run-dir "/tmp/train-run-$dev" --no-progress --log-every 10 > "$OUT/train-$dev.log" 2>&1
  echo "train exit $?" >> "$OUT/train-$dev.log"
  cp "/tmp/train-run-$dev/metrics.csv" "$OUT/metrics-$dev.csv" 2>/dev/null
  cp "/tmp/train-run-$dev/loss.png" "$OUT/loss-$dev.png" 2>/dev/null
done
cat "$OUT"/flash_relation_*.md "$OUT"/linear_relation_*.md
tail -8 "$OUT"/train-*.log
