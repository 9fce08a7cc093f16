#!/usr/bin/env bash
# Installs what is needed, builds qinfer (with the CUDA backend when nvcc is found) and runs every
# CPU test; then builds again with clang under AddressSanitizer + UndefinedBehaviorSanitizer, runs the
# CPU tests there too, and fuzzes the safetensors header parser for a bounded time.
# GPU tests (label `gpu`) run on a GPU machine: ctest --test-dir build -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/fetch-test-data.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build -LE 'gpu|fuzz' --output-on-failure -j"$jobs"

CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DQINFER_CUDA=OFF -DQINFER_SANITIZE=ON -DQINFER_FUZZ=ON
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan -LE gpu --output-on-failure -j"$jobs"
