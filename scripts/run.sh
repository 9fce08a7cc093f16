#!/usr/bin/env bash
# Installs what is needed, builds qinfer and runs the main job: generation with the bundled demo model
# (models/demo: a 16M-parameter Qwen3.5 trained on the Python standard library by tools/train_demo/).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
./build/qinfer run --raw --seed 2 --repetition-penalty 1.1 -n 96 -p 'def is_palindrome(s):
    """Return True if s reads the same forwards and backwards."""
'
./build/qinfer run --seed 1 -n 160 --repetition-penalty 1.1 -p "Write a function that reverses the words of a sentence."
