#!/usr/bin/env bash
# Runs on a GPU machine without a toolchain or network access, from the repository root, with .gpu/
# and .gl/ carried (see build.sh). Writes its logs and tables under $OUT, then checks that every
# table and log it promises is there and parses (`gpu_check summary`, which also writes
# $OUT/summary.md with the paper's anchors beside our ratios). Exit status: that check's.
#
#   OUT=/path/to/results bash scripts/gpu/run.sh       # the real check: at most ~10 minutes
#   OUT=/tmp/rehearsal bash scripts/gpu/run.sh --rehearse
#
# `--rehearse` runs every step of the real check, from the same bundle layout, on the wgpu
# device (software Vulkan in CI) at tiny sizes, with the build of `build.sh --rehearse`.
set -uo pipefail
cd "$(dirname "$0")/../.."
rehearse=0
case "${1:-}" in
  "") ;;
  --rehearse) rehearse=1 ;;
  *) echo "usage: scripts/gpu/run.sh [--rehearse]" >&2; exit 2 ;;
esac
OUT="${OUT:-/tmp/relation-gpu}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" # wgpu's loader warns on every device without it
mkdir -p "$OUT"
start=$(date +%s)
[ -f .gpu/features ] || { echo "no .gpu/features: build the bundle first (scripts/gpu/build.sh)" >&2; exit 2; }
features=$(cat .gpu/features)
if [ "$rehearse" = 1 ] && [ ! -f .gpu/rehearsal ]; then
  echo "note: rehearsing with a real bundle ($features)"
fi

if [ "$rehearse" = 0 ]; then
  # The Vulkan loader (the machine may have the NVIDIA driver but no loader), pointed at the
  # driver's ICD file when the system lists none of its own.
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  if ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1 \
     && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  fi
fi
bin="${BIN_DIR:-/tmp/relation-gpu-bin}"
mkdir -p "$bin"
xz -dc .gpu/bundle.tar.xz | tar -x -C "$bin" \
  && [ -x "$bin/kernels" ] && [ -x "$bin/gpu_check" ] \
  || { echo "cannot unpack .gpu/bundle.tar.xz into $bin" >&2; exit 2; }
cp .gpu/features "$OUT/features.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 \
  || echo "no nvidia-smi on this machine" >> "$OUT/gpu.txt"

# Devices, as named in the output files: the Vulkan one (SPIR-V with a `vulkan` build, WGSL with
# the rehearsal's `wgpu` build), then CUDA when compiled in.
case "$features" in *vulkan*) vk=vulkan ;; *) vk=wgpu ;; esac
devices="$vk"
case "$features" in *cuda*) devices="$vk cuda" ;; esac
dtypes="f32 f16 bf16" # bf16 tables say "not supported" where the device has no bf16
b8_dtype=bf16 # steps 2b and 2c; f16 in the rehearsal, whose software Vulkan has no bf16

if [ "$rehearse" = 1 ]; then
  kernel_filter=flash_relation_f16; t_kernels=600; kernel_threads=1; b8_dtype=f16
  flash=(--seqs 64,128 --batch 1 --heads 2 --head-dim 32 --iters 1); t_flash=300
  flash_b8=(--seqs 64 --batch 8 --heads 2 --head-dim 32 --iters 1)
  linear=(--seqs 64,128 --max-flash 128 --heads 2 --head-dim 32 --iters 1 --chunk 16); t_linear=300
  train=(--d-model 64 --n-layers 2 --n-heads 4 --d-ff 128 --seq-len 64 --batch-size 2
    --tokens-per-step 128 --steps 4 --log-every 1 --eval-tokens 256); t_train=300
  decode=(--patterns LLLF,A --contexts 64 --streams 2 --steps 2); t_decode=300
  staging=(--params 1000,100000 --reps 2); t_staging=300
else
  # Four test threads: on one (an H200, 16 cores) the suite ran past 150 s; on four it took 98 s.
  kernel_filter=""; t_kernels=160; kernel_threads=4
  flash=(--seqs 512,1024,2048,4096,8192,16384 --batch 1 --heads 8 --head-dim 64 --iters 5
    --max-materialized 8192); t_flash=25
  # bf16 at a batch that fills a large GPU (B 8 x H 8 = 64 heads of T x D); materialized only at
  # T = 1024 (at 8K its T x T buffers alone are 8.6 GB each).
  flash_b8=(--seqs 1024,8192 --batch 8 --heads 8 --head-dim 64 --iters 3 --max-materialized 1024)
  linear=(--seqs 1024,2048,4096,8192,16384,32768,65536 --max-flash 16384 --iters 3 --chunk 64)
  t_linear=45
  train=(--seq-len 1024 --batch-size 8 --tokens-per-step 8192 --steps 40 --log-every 5
    --eval-tokens 8192); t_train=25
  # A beside F: attention decodes on the same split-K kernels.
  decode=(--patterns L,LLLF,F,A --contexts 1024,10240 --streams 16 --steps 16); t_decode=40
  staging=(--params 3670000,10430000,84570000 --reps 5); t_staging=15
fi

# 1. Kernel tests: every test on every device compiled in (Flex, the Vulkan device, CUDA, and in
#    the rehearsal CubeCL's CPU runtime).
timeout "$t_kernels" "$bin/kernels" --test-threads "$kernel_threads" $kernel_filter > "$OUT/kernel-tests.log" 2>&1
echo "kernel tests exit $?" >> "$OUT/kernel-tests.log"
grep '^test result' "$OUT/kernel-tests.log"

for dev in $devices; do
  # 2. FlashRelation fused vs materialized vs Burn's attention: time, held and peak memory.
  for dtype in $dtypes; do
    timeout "$t_flash" "$bin/gpu_check" flash --device "$dev" --dtype "$dtype" "${flash[@]}" \
      --out "$OUT/flash_relation_${dtype}_$dev.md" > "$OUT/bench-flash-${dtype}-$dev.log" 2>&1
    echo "flash $dtype $dev exit $?"
  done
  # 2b. bf16 at B 8: the same methods, the GEMM rate, the emulated tiles where tensor cores exist.
  timeout "$t_flash" "$bin/gpu_check" flash --device "$dev" --dtype $b8_dtype "${flash_b8[@]}" \
    --out "$OUT/flash_relation_${b8_dtype}_b8_$dev.md" > "$OUT/bench-flash-$b8_dtype-b8-$dev.log" 2>&1
  echo "flash $b8_dtype b8 $dev exit $?"
  # 2c. Burn's attention alone from the build with `autotune` (its best), the shapes of 2b.
  if [ -x "$bin/gpu_check_autotune" ]; then
    timeout "$t_flash" "$bin/gpu_check_autotune" flash --device "$dev" --dtype $b8_dtype \
      --only-attention "${flash_b8[@]}" --out "$OUT/flash_attention_autotune_${b8_dtype}_b8_$dev.md" \
      > "$OUT/bench-flash-autotune-$dev.log" 2>&1
    echo "flash autotune $dev exit $?"
  fi
  # 3. Linear Relation (chunked, recurrent) against FlashRelation as T grows.
  timeout "$t_linear" "$bin/gpu_check" linear --device "$dev" "${linear[@]}" \
    --out "$OUT/linear_relation_$dev.md" > "$OUT/bench-linear-$dev.log" 2>&1
  echo "linear $dev exit $?"
  # 3b. Decoding steps of the 3.7M widths: one sequence and 16 of different lengths; the Linear
  #     Relation layer's step.
  timeout "$t_decode" "$bin/gpu_check" decode --device "$dev" \
    "${decode[@]}" --out "$OUT/decode_$dev.md" > "$OUT/bench-decode-$dev.log" 2>&1
  echo "decode $dev exit $?"
  # 3c. Gradient-sized copies device -> host -> device: what the MPI exchange stages per step.
  timeout "$t_staging" "$bin/gpu_check" staging --device "$dev" "${staging[@]}" \
    --out "$OUT/staging_$dev.md" > "$OUT/bench-staging-$dev.log" 2>&1
  echo "staging $dev exit $?"
  # 4. The trainer, Relation and MHA on the same backbone (the paper's 10M shape, T 1024),
  #    bf16 where the device computes in it.
  precision=f32
  [ "$dev" = cuda ] && [ "$rehearse" = 0 ] && precision=bf16
  train_dev=$([ "$dev" = cuda ] && echo cuda:0 || echo "$dev")
  for model in relation mha; do
    preset=$([ "$model" = mha ] && echo 10m-mha || echo 10m)
    run="/tmp/relation-gpu-train-$dev-$model"
    rm -rf "$run"
    timeout "$t_train" "$bin/gpu_check" relation train --device "$train_dev" --preset "$preset" \
      --precision "$precision" "${train[@]}" --eval-every 1000 --sample-tokens 0 \
      --checkpoint-every 1000 --no-progress --cache-dir /tmp/relation-gpu-cache --run-dir "$run" \
      > "$OUT/train-$dev-$model.log" 2>&1
    echo "train exit $?" >> "$OUT/train-$dev-$model.log"
    tail -1 "$OUT/train-$dev-$model.log"
    cp "$run/metrics.csv" "$OUT/metrics-$dev-$model.csv" 2>/dev/null
    cp "$run/loss.png" "$OUT/loss-$dev-$model.png" 2>/dev/null
  done
done

# 5. Check everything promised above and write summary.md.
autotune=()
[ -x "$bin/gpu_check_autotune" ] && autotune=(--autotune)
"$bin/gpu_check" summary --dir "$OUT" --devices "$(echo $devices | tr ' ' ,)" \
  --dtypes "$(echo $dtypes | tr ' ' ,)" --b8-dtype $b8_dtype ${autotune[@]+"${autotune[@]}"}
status=$?
echo "gpu check $([ "$rehearse" = 1 ] && echo rehearsal) finished in $(( $(date +%s) - start )) s, status $status"
exit $status
