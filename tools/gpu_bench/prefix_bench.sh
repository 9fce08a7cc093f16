#!/usr/bin/env bash
# Prefix caching on the GPU machine: `qinfer serve` on random-weight released shapes (the real Qwen3
# tokenizer beside them). For each shape: tools/multiturn_bench.py (a conversation of --turns turns,
# each turn's TTFT cached and cold), then tools/loadgen.py at each --concurrency with nothing shared,
# once with the prefix cache on and once with --no-prefix-caching (the cache must cost nothing when
# nothing hits). Results (one JSON object per shape) go to $OUT/prefix_bench.json; the log to
# $OUT/prefix_bench.log.
#
#   tools/gpu_bench/prefix_bench.sh [--shapes qwen3-8b,qwen3_5-9b] [--turns 20] [--user-tokens 64]
#       [--reply-tokens 336] [--concurrency 64,256] [--max-tokens 1024] [--max-running 256]
# (carry build-pack: an archive holding qinfer, QINFER_GPU_PACK or build-pack/gpu.tar.xz, and
# qwen3-tokenizer.tar.xz, as for serve_bench.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
shapes=qwen3-8b,qwen3_5-9b turns=20 user_tokens=64 reply_tokens=336 concurrency=64,256 max_tokens=1024
max_running=256 level_timeout=150
while [[ $# -gt 0 ]]; do
  case $1 in
    --shapes) shapes=$2 ;; --turns) turns=$2 ;; --user-tokens) user_tokens=$2 ;; --reply-tokens) reply_tokens=$2 ;;
    --concurrency) concurrency=$2 ;; --max-tokens) max_tokens=$2 ;; --max-running) max_running=$2 ;;
    --level-timeout) level_timeout=$2 ;;
    *) echo "prefix_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
out=${OUT:-.}
log=$out/prefix_bench.log
results=$out/prefix_bench.json
source tools/gpu_bench/serve_lib.sh
unpack_packs || exit 1
scratch=${TMPDIR:-/tmp}/prefix-bench
port=8124
server=

stop_server() {
  curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^qinfer_(prefix|state_checkpoint|computed|prompt|kv_blocks)' >> "$log"
  kill -TERM $server; wait $server
}

loadgen_levels() {  # prints a JSON list of levels
  local levels="[]" c line
  for c in ${concurrency//,/ }; do
    line=$(timeout "$level_timeout" python3 tools/loadgen.py --url "http://127.0.0.1:$port/v1" --concurrency "$c" \
      --requests "$c" --max-tokens "$max_tokens" --prompt-words 90 --json 2>> "$log")
    echo "$shape $1 c$c: $line" >> "$log"
    [[ -n $line ]] && levels=$(python3 -c 'import json,sys; l=json.loads(sys.argv[1]); l.append(json.loads(sys.argv[2])); print(json.dumps(l))' "$levels" "$line")
  done
  echo "$levels"
}

echo "[]" > "$results"
for shape in ${shapes//,/ }; do
  dir=$scratch/$shape
  save_shape "$shape" "$dir" || continue
  start_server "$dir" $port --max-running "$max_running" || continue
  multiturn=$(python3 tools/multiturn_bench.py --url "http://127.0.0.1:$port/v1" --turns "$turns" \
    --user-tokens "$user_tokens" --reply-tokens "$reply_tokens" --floor 0.1 --floor-from 5 --json 2>> "$log")
  echo "$shape multiturn: $multiturn" | tee -a "$log"
  cached=$(loadgen_levels cache-on)
  stop_server
  start_server "$dir" $port --max-running "$max_running" --no-prefix-caching || continue
  uncached=$(loadgen_levels cache-off)
  stop_server
  python3 - "$results" "$shape" "$multiturn" "$cached" "$uncached" <<'PY'
import json, sys
path, shape, multiturn, cached, uncached = sys.argv[1:]
all_ = json.load(open(path))
try:
    multiturn = json.loads(multiturn)
except json.JSONDecodeError:
    multiturn = {"raw": multiturn}
all_.append({"shape": shape, "multiturn": multiturn, "loadgen_cache_on": json.loads(cached),
             "loadgen_cache_off": json.loads(uncached)})
json.dump(all_, open(path, "w"), indent=1)
for e in all_[-1:]:
    m = e["multiturn"]
    print(shape, "median ratio", m.get("median_ratio_from_floor_turn"), "worst", m.get("worst_ratio_from_floor_turn"))
    for on, off in zip(e["loadgen_cache_on"], e["loadgen_cache_off"]):
        print(shape, f"c{on['concurrency']}: cache on {on['output_tok_s']} tok/s, off {off['output_tok_s']} tok/s")
PY
  rm -rf "$dir"
done
echo "done" | tee -a "$log"
