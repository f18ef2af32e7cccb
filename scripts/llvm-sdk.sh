#!/usr/bin/env bash
# Installs the LLVM that CubeCL's `cpu`, `cuda` and `rocm` runtimes link, from PyPI instead of the
# download `tracel-llvm-bundler` would make from outside the package registries.
#
#   scripts/llvm-sdk.sh                       # x86 backend: enough for `--features cpu`
#   scripts/llvm-sdk.sh --targets nvptx,amdgpu   # also NVPTX/AMDGPU (`--features cuda` / `rocm`)
#   scripts/llvm-sdk.sh --targets all         # every target of the extra wheel (large binaries)
#   scripts/llvm-sdk.sh --data-home DIR       # install under DIR instead of ~/.local/share
#   scripts/llvm-sdk.sh --check               # say what is installed, change nothing
#
# How it works: the bundler's build script (tracel-llvm-bundler 23.1.0-4, resolved in Cargo.lock)
# skips its download when `$XDG_DATA_HOME/tracel/tracel-llvm-<bundler version>/` already holds its
# sentinel file `.tracel-llvm-installed`, and then asks that directory's `bin/llvm-config` for the
# libraries to link. PyPI's `mlc-llvm-static` is a relocatable static LLVM SDK with such an
# `llvm-config` (a Python script: the build needs `python3` on PATH). This script downloads the
# pinned wheels into a cache of the project's (never into a Python environment), checks their
# hashes, unpacks the SDK there, and creates the sentinel. It is idempotent: a second run with
# the same targets does nothing.
#
# When CubeCL moves to another LLVM: `cargo update` changes the bundler version in Cargo.lock and
# this script stops with a message naming both versions. Then pick the `mlc-llvm-static` release
# with the same LLVM major.minor (`python3 -m pip index versions mlc-llvm-static`), download its
# wheels once, and update BUNDLER, SDK_VERSION and the hashes below.
set -euo pipefail
cd "$(dirname "$0")/.."

BUNDLER=23.1.0-4          # tracel-llvm-bundler version this SDK stands in for
LLVM_SERIES=23.1          # LLVM major.minor that bundler links (its TRACEL_LLVM_VERSION)
SDK_VERSION=23.1.1.post0  # mlc-llvm-static (and -extra-targets) release on PyPI
# sha256 of the wheels per platform tag (only x86_64 Linux is pinned so far).
declare -A SHA256=(
  [mlc-llvm-static:manylinux_2_28_x86_64]=dcfec888abfaa418be77d41af585805f31463584cf9c90582992c00f392c1ac5
  [mlc-llvm-static-extra-targets:manylinux_2_28_x86_64]=c36e834d9a4e9cf9759f27fece65711ece7a2fc2b5a96dbb15d66f5e9e787929
)

targets=""
data_home="${XDG_DATA_HOME:-$HOME/.local/share}"
check_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --targets) targets="${2:?--targets needs a list, e.g. nvptx,amdgpu}"; shift 2 ;;
    --targets=*) targets="${1#*=}"; shift ;;
    --data-home) data_home="${2:?--data-home needs a directory}"; shift 2 ;;
    --data-home=*) data_home="${1#*=}"; shift ;;
    --check) check_only=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "llvm-sdk: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "llvm-sdk: $*" >&2; exit 1; }

# Extra targets: nvptx and amdgpu (and the others LLVM has) come in one extra wheel. `keep` is
# what a binary links: X86 (the host) and the targets asked for, unless `all`.
extra=0
keep="X86"
IFS=',' read -r -a wanted <<<"$targets"
for t in "${wanted[@]}"; do
  case "$t" in
    "") ;;
    nvptx) extra=1; keep="$keep NVPTX" ;;
    amdgpu) extra=1; keep="$keep AMDGPU" ;;
    all) extra=1; keep=all ;;
    x86|native) ;;
    *) die "unknown target '$t': expected nvptx, amdgpu (or all)" ;;
  esac
done
[ "$extra" = 1 ] || keep=native

# 1. The bundler Cargo.lock resolves must be the one this SDK stands in for.
locked=$(awk '/^name = "tracel-llvm-bundler"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
[ -n "$locked" ] || die "Cargo.lock resolves no tracel-llvm-bundler (did CubeCL drop LLVM?); nothing to install"
if [ "$locked" != "$BUNDLER" ]; then
  die "Cargo.lock resolves tracel-llvm-bundler $locked, but this script pins mlc-llvm-static \
$SDK_VERSION for bundler $BUNDLER (LLVM $LLVM_SERIES). Find the mlc-llvm-static release for the \
new bundler's LLVM (python3 -m pip index versions mlc-llvm-static) and update BUNDLER, \
LLVM_SERIES, SDK_VERSION and the hashes at the top of scripts/llvm-sdk.sh."
fi

dest="$data_home/tracel/tracel-llvm-$BUNDLER"
sentinel="$dest/.tracel-llvm-installed"
marker="$dest/.relation-llvm-sdk"
want="mlc-llvm-static $SDK_VERSION extra-targets=$extra"
[ "$extra" = 0 ] || want="$want linked=$(echo "$keep" | tr ' ' ,)"
export_line=""
[ "$data_home" = "${XDG_DATA_HOME:-$HOME/.local/share}" ] || export_line="export XDG_DATA_HOME=$data_home"

report() {
  echo "LLVM for CubeCL: $dest"
  echo "  $("$dest/bin/llvm-config" --version 2>/dev/null || echo '?') ($(cat "$marker" 2>/dev/null || echo 'not installed by this script')), targets in the SDK: $("$dest/bin/llvm-config" --targets-built 2>/dev/null || echo '?')"
  if [ -n "$export_line" ]; then
    echo "Before building with --features cpu, cuda or rocm:"
    echo "  $export_line"
  else
    echo "Nothing to export: this is where the bundler looks by default. Build with e.g."
    echo "  cargo test -p relation-kernels --features cpu --test kernels"
  fi
}

if [ "$check_only" = 1 ]; then
  [ -f "$sentinel" ] || die "not installed at $dest (run scripts/llvm-sdk.sh)"
  report
  exit 0
fi

if [ -f "$sentinel" ]; then
  if [ "$(cat "$marker" 2>/dev/null)" = "$want" ] \
     || { [ "$extra" = 0 ] && grep -q "^mlc-llvm-static $SDK_VERSION extra-targets=1" "$marker" 2>/dev/null; }; then
    echo "llvm-sdk: already installed"
    report
    exit 0
  fi
  if [ ! -f "$marker" ]; then
    echo "llvm-sdk: $dest holds an LLVM this script did not install (the bundler's own download?); leaving it"
    report
    exit 0
  fi
fi

command -v python3 >/dev/null || die "python3 is needed (to download the wheels, and at build time: the SDK's llvm-config is a Python script)"
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) platform=manylinux_2_28_x86_64 ;;
  *) die "no pinned mlc-llvm-static wheel for $(uname -s)-$(uname -m) yet; add its hashes to scripts/llvm-sdk.sh" ;;
esac

# 2. Download the pinned wheels into the project's cache, hash-checked by pip.
cache="${RELATION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relation}/llvm-sdk/$SDK_VERSION"
mkdir -p "$cache"
req="$cache/requirements.txt"
{
  echo "mlc-llvm-static==$SDK_VERSION --hash=sha256:${SHA256[mlc-llvm-static:$platform]}"
  if [ "$extra" = 1 ]; then
    echo "mlc-llvm-static-extra-targets==$SDK_VERSION --hash=sha256:${SHA256[mlc-llvm-static-extra-targets:$platform]}"
  fi
} >"$req"
echo "llvm-sdk: downloading mlc-llvm-static $SDK_VERSION$([ "$extra" = 1 ] && echo ' + extra targets') into $cache"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --platform "$platform" --python-version 3.11 --implementation py --require-hashes -r "$req" -d "$cache" \
  || die "pip could not download the wheels (is PyPI reachable? see $req)"

# 3. Unpack into a fresh directory beside the destination, check the LLVM version, then swap it in,
#    so that an interrupted run never leaves a sentinel over half an SDK.
mkdir -p "$(dirname "$dest")"
staging="$dest.partial.$$"
rm -rf "$staging" && mkdir -p "$staging"
trap 'rm -rf "$staging"' EXIT
for wheel in "$cache"/mlc_llvm_static-"$SDK_VERSION"-*.whl \
             $([ "$extra" = 1 ] && echo "$cache"/mlc_llvm_static_extra_targets-"$SDK_VERSION"-*.whl); do
  [ -f "$wheel" ] || die "missing wheel $wheel"
  python3 -m zipfile -e "$wheel" "$staging/wheel"
done
mv "$staging/wheel/mlc_llvm_static/static" "$staging/sdk"
chmod +x "$staging"/sdk/bin/llvm-config*
version=$("$staging/sdk/bin/llvm-config" --version) || die "the SDK's llvm-config does not run"
case "$version" in
  "$LLVM_SERIES".*) ;;
  *) die "mlc-llvm-static $SDK_VERSION is LLVM $version, but bundler $BUNDLER links LLVM $LLVM_SERIES" ;;
esac
# The extra wheel's headers enumerate all twenty targets, and the `LLVM_InitializeAll*` wrappers
# that llvm-sys compiles against them reference every one, so every binary would link all
# twenty backends (~4x the size). Enumerate only the targets asked for (and X86, the host); the
# other targets' archives stay in lib/ and are never pulled in by the static link.
if [ "$keep" != all ] && [ "$keep" != native ]; then
  pattern=$(echo "$keep" | tr ' ' '|')
  for def in "$staging"/sdk/include/llvm/Config/mlc-all/*.def; do
    sed -E -i "/^LLVM_[A-Z_]+\(([A-Za-z0-9]+)\)\$/{/\((${pattern})\)\$/!d}" "$def"
  done
fi
echo "$want" >"$staging/sdk/.relation-llvm-sdk"
touch "$staging/sdk/.tracel-llvm-installed"
rm -rf "$dest"
mv "$staging/sdk" "$dest"
echo "llvm-sdk: installed LLVM $version"
report
