#!/usr/bin/env bash
# The offline tensor-core check, no GPU needed: compiles the half-precision tile
# kernels to PTX for NVIDIA GPUs with the CUDA runtime's own compiler (CubeCL's LLVM backend,
# LLVM's NVPTX target), asserts that every kernel holds matrix instructions (`mma`) and no local
# memory, and assembles each with NVIDIA's `ptxas` (from PyPI's nvidia-cuda-nvcc-cu12 wheel,
# hash-pinned, cached, with the libdevice the compiler links for exp and log) to assert no
# register spills. Prints a table (kernel, dtype, head dim,
# sm, tile shape, shared memory, mma count, registers, spills) and exits non-zero on a failure.
#
#   scripts/gpu/nvptx-check.sh                      # sm 80 and 90, f16 and bf16, D 64 and 128
#   scripts/gpu/nvptx-check.sh --sm 90 --head-dims 64,80,128 --out docs/bench/gpu/nvptx
#
# Needs python3 with pip (the two downloads) and, the first time, a build of relation-kernels
# with `cuda,cpu` in a target folder of its own (the NVPTX LLVM, as scripts/gpu/build.sh --cuda).
set -euo pipefail
cd "$(dirname "$0")/../.."
export XDG_DATA_HOME="$HOME/.local/share/relation-llvm-cuda"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/relation-target}-cuda"
scripts/llvm-sdk.sh --targets nvptx --data-home "$XDG_DATA_HOME"

NVCC_WHEEL_VERSION=12.9.86
NVCC_WHEEL_SHA256=5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0
cache="${RELATION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relation}/ptxas/$NVCC_WHEEL_VERSION"
ptxas="$cache/ptxas"
# The same wheel holds libdevice, LLVM's implementation of the math functions NVPTX has no
# instruction for (exp, log): the compiler finds it under $CUDA_PATH/nvvm/libdevice.
libdevice="$cache/cuda/nvvm/libdevice/libdevice.10.bc"
if [ ! -x "$ptxas" ] || [ ! -f "$libdevice" ]; then
  mkdir -p "$cache"
  echo "nvidia-cuda-nvcc-cu12==$NVCC_WHEEL_VERSION --hash=sha256:$NVCC_WHEEL_SHA256" > "$cache/requirements.txt"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_12_x86_64 --python-version 3.11 --implementation py \
    --require-hashes -r "$cache/requirements.txt" -d "$cache" \
    || { echo "nvptx-check: pip could not download nvidia-cuda-nvcc-cu12 (is PyPI reachable?)" >&2; exit 1; }
  python3 - "$cache" <<'PY'
import pathlib, sys, zipfile
cache = pathlib.Path(sys.argv[1])
wheel = next(cache.glob("nvidia_cuda_nvcc_cu12-*.whl"))
with zipfile.ZipFile(wheel) as z:
    (cache / "ptxas.partial").write_bytes(z.read("nvidia/cuda_nvcc/bin/ptxas"))
    lib = cache / "cuda" / "nvvm" / "libdevice"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "libdevice.10.bc").write_bytes(z.read("nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc"))
PY
  chmod +x "$cache/ptxas.partial" && mv "$cache/ptxas.partial" "$ptxas"
fi
export CUDA_PATH="$cache/cuda"
"$ptxas" --version | tail -1

out="$CARGO_TARGET_DIR/nvptx"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
cargo run --quiet -p relation-kernels --features cuda,cpu,testing --example nvptx_check -- \
  --ptxas "$ptxas" --out "$out" "${args[@]}"
