#!/usr/bin/env bash
# Packs what the GPU machine needs from a CUDA build into one small archive that travels with the
# working tree: qinfer, op_harness and cuda_tests (stripped), and the shared libraries they link that
# the machine does not have (everything ldd names outside libc, the C++ runtime and CUDA, which it has).
#
#   tools/gpu_bench/pack.sh [--also NAME=BINARY]... [BUILD_DIR] [ARCHIVE]
#                                                (defaults: build, build-pack/gpu.tar.xz)
#
# --also adds another qinfer (another commit's build, say) under NAME, for check.sh --compare NAME.
#
# There: mkdir -p build-gpu && tar -C build-gpu -xJf build-pack/gpu.tar.xz && tools/gpu_bench/check.sh
# (carry build-pack).
set -euo pipefail
also=()
while [[ ${1:-} == --also ]]; do
  [[ ${2:-} == ?*=?* ]] || { echo "pack.sh: --also takes NAME=BINARY" >&2; exit 2; }
  also+=("$(realpath "${2#*=}")=${2%%=*}")
  shift 2
done
cd "$(dirname "$0")/../.."
build=${1:-build}
archive=${2:-build-pack/gpu.tar.xz}
binaries=("$build/qinfer" "$build/tests/op_harness" "$build/tests/cuda/cuda_tests")
for b in "${binaries[@]}"; do
  [[ -x $b ]] || { echo "pack.sh: $b is not built (cmake --build $build)" >&2; exit 1; }
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for b in "${binaries[@]}"; do strip -o "$stage/$(basename "$b")" "$b"; done
for a in "${also[@]}"; do
  [[ -x ${a%=*} ]] || { echo "pack.sh: ${a%=*} is not an executable" >&2; exit 1; }
  strip -o "$stage/${a##*=}" "${a%=*}"
done
# The machine's own: the C and C++ runtimes, the loader, and CUDA's libraries under /usr/local/cuda.
ldd "${binaries[@]}" | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|^/usr/local/cuda' |
  while read -r lib; do cp -L "$lib" "$stage/"; done
mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cf - . | xz -9 -T0 > "$archive"
echo "$archive: $(du -h "$archive" | cut -f1) ($(ls "$stage" | tr '\n' ' '))"
