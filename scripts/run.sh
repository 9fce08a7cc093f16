#!/usr/bin/env bash
# Installs what is needed, builds qinfer and runs the main job: for now, the help text and an
# inspection of a bundled checkpoint (a tiny Qwen3.5 fixture in HF layout, with vision and MTP tensors).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
./build/qinfer --help
./build/qinfer inspect tests/fixtures/golden/qwen3_5
