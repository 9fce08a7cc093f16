#!/usr/bin/env bash
# Serving throughput on the GPU machine: `qinfer serve` on random-weight released shapes (the real
# Qwen3 tokenizer beside them), tools/loadgen.py at each concurrency, `qinfer bench` batch-1 decode
# of the same checkpoint for the c1 comparison. Results (one JSON object per shape) go to
# $OUT/serve_bench.json; the log to $OUT/serve_bench.log.
#
#   tools/gpu_bench/serve_bench.sh [--shapes qwen3-8b,qwen3_5-9b] [--concurrency 1,16,64,256]
#       [--max-tokens 1024] [--prompt-words 90] [--max-running 256] [--level-timeout 150]
#       [--extra-body JSON ...]   (each: every level again with this merged into the request bodies,
#                                  e.g. a structured-output constraint; those levels carry "extra_body")
# (carry build-pack, holding gpu.tar.xz from pack.sh and qwen3-tokenizer.tar.xz: the tokenizer
# folder of scripts/fetch-test-data.sh, `tar -C .deps -cf - qwen3-tokenizer | xz`, to fit the 64 MiB;
# QINFER_GPU_PACK names another archive holding qinfer, e.g. pack.sh's without the test binaries)
set -uo pipefail
cd "$(dirname "$0")/../.."
shapes=qwen3-8b concurrency=1,16,64,256 max_tokens=1024 prompt_words=90 max_running=256 level_timeout=150
extra_bodies=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --shapes) shapes=$2 ;; --concurrency) concurrency=$2 ;; --max-tokens) max_tokens=$2 ;;
    --prompt-words) prompt_words=$2 ;; --max-running) max_running=$2 ;; --level-timeout) level_timeout=$2 ;;
    --extra-body) extra_bodies+=("$2") ;;
    *) echo "serve_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
out=${OUT:-.}
log=$out/serve_bench.log
results=$out/serve_bench.json
source tools/gpu_bench/serve_lib.sh
unpack_packs || exit 1
scratch=${TMPDIR:-/tmp}/serve-bench
echo "[]" > "$results"
for shape in ${shapes//,/ }; do
  dir=$scratch/$shape
  start=$(date +%s)
  save_shape "$shape" "$dir" || continue
  echo "$shape: checkpoint in $(( $(date +%s) - start )) s" | tee -a "$log"
  bench=$($qinfer bench --model "$dir" --device cuda --batch 1 --prompt 128 --gen 128 --context 128 --json 2>>"$log")
  echo "$shape bench: $bench" | tee -a "$log"
  port=8123
  start_server "$dir" $port --max-running "$max_running" || continue
  levels="[]"
  for run in "" "${extra_bodies[@]}"; do
  for c in ${concurrency//,/ }; do
    # One wave of `c` requests: every stream generates max_tokens (ignore_eos).
    line=$(timeout "$level_timeout" python3 tools/loadgen.py --url "http://127.0.0.1:$port/v1" --concurrency "$c" \
      --requests "$(( c > 1 ? c : 2 ))" --max-tokens "$max_tokens" --prompt-words "$prompt_words" \
      --extra-body "${run:-{\}}" --json 2>> "$log")
    [[ -n $run && -n $line ]] && line=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["extra_body"]=json.loads(sys.argv[2]); print(json.dumps(d))' "$line" "$run")
    echo "$shape c$c ${run}: $line" | tee -a "$log"
    # The engine's step counters after the level (cumulative): steps, host and forward seconds.
    engine=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '/^qinfer_engine_/ {printf "%s%s=%s", sep, $1, $2; sep=","}')
    echo "$shape c$c engine: $engine" | tee -a "$log"
    [[ -n $line ]] && levels=$(python3 -c 'import json,sys; l=json.loads(sys.argv[1]); d=json.loads(sys.argv[2]); d["engine"]=dict(kv.split("=") for kv in sys.argv[3].split(",") if kv); l.append(d); print(json.dumps(l))' "$levels" "$line" "$engine")
  done
  done
  metrics=$(curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^qinfer_(engine|prompt|generation|preempt|kv_blocks_total)')
  echo "$metrics" >> "$log"
  kill -TERM $server; wait $server
  python3 - "$results" "$shape" "$bench" "$levels" "$metrics" <<'PY'
import json, sys
path, shape, bench, levels, metrics = sys.argv[1:]
all_ = json.load(open(path))
try:
    bench = json.loads(bench)
except json.JSONDecodeError:
    bench = {"raw": bench}
all_.append({"shape": shape, "bench": bench, "levels": json.loads(levels), "metrics": metrics.splitlines()})
json.dump(all_, open(path, "w"), indent=1)
PY
  rm -rf "$dir"
done
echo "done" | tee -a "$log"
