#!/usr/bin/env bash
# Build, here, what a GPU machine without a Rust toolchain or network access runs: the kernel
# test binary, both benchmarks and the `relation` trainer, stripped and xz-compressed into .gpu/
# (git-ignored), with the Vulkan loader packages in .gl/.
#
#   scripts/gpu/build.sh          # `vulkan` (SPIR-V through wgpu; any GPU with a Vulkan driver)
#   scripts/gpu/build.sh --cuda   # `vulkan,cuda`: the same binaries also run the kernels on CUDA
#                                 # (PTX through LLVM; needs only the NVIDIA driver there). Installs
#                                 # the LLVM SDK with the NVPTX backend first (scripts/llvm-sdk.sh).
#
# Then copy .gpu and .gl to the GPU machine and run `bash scripts/gpu/run.sh` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/relation-target}"
features=vulkan
if [ "${1:-}" = "--cuda" ]; then
  features=vulkan,cuda
  # An LLVM with the NVPTX backend, in a data home of its own, and a target folder of its own:
  # the bundler's build script notices neither a changed XDG_DATA_HOME nor a changed SDK behind
  # an unchanged sentinel, so the X86-only SDK of the CPU-runtime tests must not share either.
  export XDG_DATA_HOME="$HOME/.local/share/relation-llvm-cuda"
  export CARGO_TARGET_DIR="$CARGO_TARGET_DIR-cuda"
  scripts/llvm-sdk.sh --targets nvptx --data-home "$XDG_DATA_HOME"
fi
rm -rf .gpu && mkdir -p .gpu
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
echo "$features" > .gpu/features

# One cargo invocation for everything, so features unify once (building the tests and the
# examples separately compiles Burn twice). `cargo test --no-run` also builds the examples, and
# the `relation` binary (relation-train's tests run it).
cargo test --release --workspace --features "$features" --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
want={"kernels","flash_relation_bench","linear_relation_bench","relation"}
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])' > .gpu/binaries.txt
[ "$(wc -l < .gpu/binaries.txt)" -eq 4 ] || { echo "expected 4 binaries, got: $(cat .gpu/binaries.txt)" >&2; exit 1; }
while read -r name path; do
  strip -o ".gpu/$name" "$path"
  xz -T2 -6 -f ".gpu/$name"
done < .gpu/binaries.txt
ls -la .gpu

# The Vulkan loader for the GPU machine (it may have a driver but no loader).
if [ ! -d .gl ]; then
  grep -qx '/.gl/' .git/info/exclude || echo '/.gl/' >> .git/info/exclude
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .gpu .gl
# The bundle is meant for small uploads (at most 64 MiB). A `--cuda` build links all of LLVM's targets
# (the SDK's llvm-config profile with the extra-targets wheel) and measured 127 MiB here
# (four binaries of ~32 MiB): carry only what a call runs, one binary per call, until the build
# links NVPTX + X86 alone.
total=$(du -sm .gpu .gl | awk '{s += $1} END {print s}')
if [ "$total" -gt 64 ]; then
  echo "warning: .gpu + .gl is ${total} MiB, over the 64 MiB upload budget" >&2
fi
