#!/usr/bin/env bash
# The state-checkpoint interval, swept on the GPU machine: for each --intervals value, `qinfer serve`
# on a random-weight hybrid shape (the real Qwen3 tokenizer beside it) with --state-checkpoint-interval
# set, tools/interval_probe.py against it (cold long-prompt TTFT; a second request sharing each of
# --shared prefix lengths: its cached tokens), and the server's checkpoint metrics afterwards. Results
# (one JSON object per interval) go to $OUT/interval_sweep.json, the log to $OUT/interval_sweep.log.
#
#   tools/gpu_bench/interval_sweep.sh [--shape qwen3_5-9b] [--intervals 256,512,1024,2048,4096]
#       [--long 8192] [--shared 1500,3000,6000]
# (carry build-pack: QINFER_GPU_PACK or build-pack/gpu.tar.xz holding qinfer, and qwen3-tokenizer.tar.xz)
set -uo pipefail
cd "$(dirname "$0")/../.."
shape=qwen3_5-9b intervals=256,512,1024,2048,4096 long=8192 shared=1500,3000,6000
while [[ $# -gt 0 ]]; do
  case $1 in
    --shape) shape=$2 ;; --intervals) intervals=$2 ;; --long) long=$2 ;; --shared) shared=$2 ;;
    *) echo "interval_sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
out=${OUT:-.}
log=$out/interval_sweep.log
results=$out/interval_sweep.json
source tools/gpu_bench/serve_lib.sh
unpack_packs || exit 1
dir=${TMPDIR:-/tmp}/interval-sweep/$shape
port=8125
save_shape "$shape" "$dir" || exit 1
echo "[]" > "$results"
for interval in ${intervals//,/ }; do
  start_server "$dir" $port --state-checkpoint-interval "$interval" || continue
  probe=$(python3 tools/interval_probe.py --url "http://127.0.0.1:$port/v1" --long "$long" --shared "$shared" 2>> "$log")
  metrics=$(curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^qinfer_state_checkpoint')
  kill -TERM $server; wait $server
  echo "interval $interval: $probe" | tee -a "$log"
  python3 - "$results" "$interval" "$probe" "$metrics" <<'PY'
import json, sys
path, interval, probe, metrics = sys.argv[1:]
all_ = json.load(open(path))
entry = {"interval": int(interval)}
try:
    entry.update(json.loads(probe))
except json.JSONDecodeError:
    entry["error"] = probe or "no output (see the log)"
entry["metrics"] = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if len(line.split()) == 2}
all_.append(entry)
json.dump(all_, open(path, "w"), indent=1)
PY
done
rm -rf "$dir"
echo "done" | tee -a "$log"
