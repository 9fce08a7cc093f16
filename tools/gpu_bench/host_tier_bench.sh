#!/usr/bin/env bash
# The prefix cache's host tier on the GPU machine: `qinfer serve` on a random-weight released shape with
# a device KV pool too small for a conversation and the cold prompt sent beside each of its turns
# (tools/multiturn_bench.py), so that every cold prompt evicts the conversation's blocks. Run once
# without the host tier (evicted blocks are recomputed) and once with --host-cache-gb (they come back
# from pinned host memory). Results go to $OUT/host_tier_bench.json; the log to $OUT/host_tier_bench.log.
#
#   tools/gpu_bench/host_tier_bench.sh [--shapes qwen3-8b,qwen3_5-9b] [--kv-blocks 640] [--host-cache-gb 16]
#       [--turns 20] [--user-tokens 64] [--reply-tokens 336]
# (carry build-pack as for serve_bench.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
shapes=qwen3-8b,qwen3_5-9b kv_blocks=640 host_gb=16 turns=20 user_tokens=64 reply_tokens=336
while [[ $# -gt 0 ]]; do
  case $1 in
    --shapes) shapes=$2 ;; --kv-blocks) kv_blocks=$2 ;; --host-cache-gb) host_gb=$2 ;; --turns) turns=$2 ;;
    --user-tokens) user_tokens=$2 ;; --reply-tokens) reply_tokens=$2 ;;
    *) echo "host_tier_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
out=${OUT:-.}
log=$out/host_tier_bench.log
results=$out/host_tier_bench.json
source tools/gpu_bench/serve_lib.sh
unpack_packs || exit 1
scratch=${TMPDIR:-/tmp}/host-tier-bench
port=8125
server=

stop_server() {
  curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^qinfer_(prefix|host_cache|state_checkpoint|kv_blocks)' >> "$log"
  kill -TERM $server; wait $server
}

echo "[]" > "$results"
for shape in ${shapes//,/ }; do
  dir=$scratch/$shape
  save_shape "$shape" "$dir" || continue
  for tier in 0 "$host_gb"; do
    start_server "$dir" $port --max-running 8 --kv-blocks "$kv_blocks" --host-cache-gb "$tier" || continue
    line=$(python3 tools/multiturn_bench.py --url "http://127.0.0.1:$port/v1" --turns "$turns" \
      --user-tokens "$user_tokens" --reply-tokens "$reply_tokens" --json 2>> "$log")
    echo "$shape host-cache-gb $tier: $line" | tee -a "$log"
    stop_server
    python3 - "$results" "$shape" "$tier" "$kv_blocks" "$line" <<'PY'
import json, sys
path, shape, tier, kv_blocks, line = sys.argv[1:]
all_ = json.load(open(path))
try:
    multiturn = json.loads(line)
except json.JSONDecodeError:
    multiturn = {"raw": line}
all_.append({"shape": shape, "host_cache_gb": float(tier), "kv_blocks": int(kv_blocks), "multiturn": multiturn})
json.dump(all_, open(path, "w"), indent=1)
print(shape, "host", tier, "GB: median cached/cold TTFT ratio", multiturn.get("median_ratio_from_floor_turn"))
PY
  done
done
