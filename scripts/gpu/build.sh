#!/usr/bin/env bash
# Build, here, what a GPU machine without a Rust toolchain or network access runs: two binaries
# (the kernel test binary and `gpu_check`, which holds both benchmarks and the trainer), stripped
# and xz-compressed together into .gpu/bundle.tar.xz (git-ignored), with the Vulkan loader
# packages in .gl/.
#
# A second `gpu_check`, built with Burn's `autotune` feature (a second Burn build: features unify
# per cargo invocation), times Burn's attention at its best (`run.sh` step 2c).
#
#   scripts/gpu/build.sh             # `vulkan` (SPIR-V through wgpu; any GPU with a Vulkan driver)
#   scripts/gpu/build.sh --cuda      # `vulkan,cuda`: the same binaries also run on CUDA (PTX
#                                    # through LLVM's NVPTX backend; needs only the NVIDIA driver)
#   scripts/gpu/build.sh --rehearse  # the README test command's build (`wgpu,cpu`, dev profile)
#                                    # packed in the same layout, for `run.sh --rehearse` (CI)
#
# A real bundle (.gpu + .gl) must stay within 64 MiB: the script prints the size and fails above
# it. Then copy .gpu and .gl to the GPU machine and run `bash scripts/gpu/run.sh` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/relation-target}"
LIMIT_MIB=64
mode="${1:-vulkan}"
case "$mode" in
  vulkan) features=vulkan; profile=(--release); xz_opts=(--lzma2=preset=9e,dict=768MiB -T1) ;;
  --cuda)
    features=vulkan,cuda; profile=(--release); xz_opts=(--lzma2=preset=9e,dict=768MiB -T1)
    # An LLVM with the NVPTX backend, in a data home of its own, and a target folder of its own:
    # the bundler's build script notices neither a changed XDG_DATA_HOME nor a changed SDK behind
    # an unchanged sentinel, so the X86-only SDK of the CPU-runtime tests must not share either.
    # `--targets nvptx` also makes the SDK's headers enumerate X86 and NVPTX alone, so the
    # binaries link those two backends, not all twenty of the SDK.
    export XDG_DATA_HOME="$HOME/.local/share/relation-llvm-cuda"
    export CARGO_TARGET_DIR="$CARGO_TARGET_DIR-cuda"
    scripts/llvm-sdk.sh --targets nvptx --data-home "$XDG_DATA_HOME"
    ;;
  --rehearse)
    # Exactly the features and profile of the README's test command, so after the tests this
    # build compiles nothing new. WGSL, not SPIR-V: Mesa's software Vulkan (22.x) crashes in
    # vkCreateComputePipelines on CubeCL's SPIR-V, so the rehearsal cannot use `vulkan`.
    # Fast compression: the rehearsal checks the layout, not the size.
    features=wgpu,cpu; profile=(); xz_opts=(-0 -T2) ;;
  *) echo "usage: scripts/gpu/build.sh [--cuda | --rehearse]" >&2; exit 2 ;;
esac
rm -rf .gpu && mkdir -p .gpu
echo "$features" > .gpu/features
[ "$mode" = --rehearse ] && touch .gpu/rehearsal

# One cargo invocation for everything, so features unify once (building the tests and the
# examples separately compiles Burn twice). `cargo test --no-run` also builds the examples.
start=$(date +%s)
# Cargo's own messages go to .gpu/cargo.log; a failed build prints its tail (the JSON stream on
# stdout carries the artifacts' paths).
failed() { echo "error: $1 failed; the end of .gpu/cargo.log:" >&2; tail -40 .gpu/cargo.log >&2; exit 1; }
cargo test "${profile[@]}" --workspace --features "$features" --no-run --message-format=json 2>.gpu/cargo.log \
  | python3 -c 'import json,sys
want={"kernels","gpu_check"}
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])' > .gpu/binaries.txt || failed "the build"
[ "$(wc -l < .gpu/binaries.txt)" -eq 2 ] || { echo "expected 2 binaries, got: $(cat .gpu/binaries.txt)" >&2; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
mkdir -p .gpu/bin
while read -r name path; do
  strip -o ".gpu/bin/$name" "$path"
done < .gpu/binaries.txt
if [ "$mode" = --rehearse ]; then
  # CI does not build Burn twice: the rehearsal's stand-in is the same gpu_check under the second
  # name (its tables say "without autotune"), which exercises run.sh's step and the summary.
  cp .gpu/bin/gpu_check .gpu/bin/gpu_check_autotune
else
  start=$(date +%s)
  cargo build "${profile[@]}" -p relation-examples --example gpu_check \
      --features "$features,autotune" --message-format=json 2>.gpu/cargo.log \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="gpu_check":
        print(m["executable"])' > .gpu/autotune.txt || failed "the autotune build of gpu_check"
  [ -s .gpu/autotune.txt ] || failed "the autotune build of gpu_check"
  strip -o .gpu/bin/gpu_check_autotune "$(cat .gpu/autotune.txt)"
  echo "autotune build: $(( $(date +%s) - start )) s"
fi
# The binaries in one xz stream with a dictionary larger than all of them together: each links
# the same LLVM and CubeCL code, and the later copies then cost little (measured with a `--cuda`
# build of two: 39.9 MiB in one stream against 62.3 MiB as two files). Decompressing needs
# about 768 MiB of memory; compressing at -9e about 8.5 GiB and several minutes on two cores.
start=$(date +%s)
tar -C .gpu/bin -c kernels gpu_check gpu_check_autotune | xz "${xz_opts[@]}" > .gpu/bundle.tar.xz
rm -rf .gpu/bin .gpu/cargo.log
echo "compression: $(( $(date +%s) - start )) s"
ls -la .gpu

if [ "$mode" = --cuda ]; then
  # The offline tensor-core check (no GPU needed): the tile kernels' PTX holds mma, no spills.
  # The PTX stays in the target folder (not carried); the table goes with the bundle.
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR%-cuda}" scripts/gpu/nvptx-check.sh | tee .gpu/nvptx.md
fi

if [ "$mode" = --rehearse ]; then
  # The rehearsal runs where the tests ran: the loader is the system's, no .gl needed.
  du -sh .gpu
  exit 0
fi

# The Vulkan loader for the GPU machine (it may have a driver but no loader).
if [ ! -d .gl ]; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .gpu .gl
total_kib=$(du -sk .gpu .gl | awk '{s += $1} END {print s}')
echo "bundle (.gpu + .gl): $(( total_kib / 1024 )) MiB of at most $LIMIT_MIB MiB"
if [ "$total_kib" -gt $(( LIMIT_MIB * 1024 )) ]; then
  echo "error: the bundle is over the $LIMIT_MIB MiB upload limit" >&2
  exit 1
fi
