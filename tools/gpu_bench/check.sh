#!/usr/bin/env bash
# On the GPU machine, from the repository root, with pack.sh's archive unpacked into build-gpu: what
# the GPU test label covers, memcheck on the golden run, and optionally kernel perf and model
# benchmarks, in one call (device time is scarce), a few lines per result on stdout.
#
#   tools/gpu_bench/check.sh [--no-tests] [--perf OP_SUBSTRING] [--bench SHAPE[:4bit],...] [--tp N]
#                            [--compare NAME] [--sampled] [--kernel-times]
#
#   --no-tests   skip cuda_tests, op_harness (cuda, cuda-fast) and memcheck
#   --perf S     op_harness --perf over the ops whose case names contain S (fast precision)
#   --bench L    qinfer bench per shape (qwen3-8b, qwen3_5-9b, ...; ":4bit" = MLX affine 4-bit g64):
#                decode at batch 1 and 8 after a 512-token prompt, prefill at 512 and 8192 tokens
#   --tp N       the benches also at --tensor-parallel N (a machine with N GPUs)
#   --compare B  per benched shape, batch-1 decode of build-gpu/B (packed with pack.sh --also B=...)
#                and of this qinfer in turn, three rounds each: an A/B in one call, on one machine
#   --sampled    per benched shape, decode at batch 1 and 8 also sampled (temperature 0.7, top-k 20,
#                top-p 0.8: Qwen's chat settings), and at temperature 1 with no filter
#   --kernel-times  per benched shape, each kernel of a batch-1 decode step timed alone by Nsight
#                Compute (graphs off), grouped by tools/gpu_bench/kernel_times.py
#
# Everything each step printed goes to $OUT/check.log (one file: a call returns only a few).
set -uo pipefail
build=${QINFER_GPU_BUILD:-build-gpu}
export LD_LIBRARY_PATH="$PWD/$build:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TMPDIR=${TMPDIR:-/dev/shm} QINFER_TEST_DATA="$PWD/tests/fixtures" PATH="$PATH:/usr/local/cuda/bin"
log="${OUT:-.}/check.log"
tests=1 perf="" bench="" tp="" compare="" sampled=0 kernel_times=0
while (($#)); do
  case $1 in
    --no-tests) tests=0 ;;
    --perf) perf=$2; shift ;;
    --bench) bench=$2; shift ;;
    --tp) tp=$2; shift ;;
    --compare) compare=$2; shift ;;
    --sampled) sampled=1 ;;
    --kernel-times) kernel_times=1 ;;
    *) echo "check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
t0=$(date +%s)
failed=0
# run NAME LIMIT_S CMD...: its output to the log and to $step_out; a line with its status and time.
run() {
  local name=$1 limit=$2
  shift 2
  step_out=$(mktemp)
  local start=$(date +%s)
  timeout "$limit" "$@" > "$step_out" 2>&1
  local rc=$?
  { echo "=== $name (exit $rc): $*"; cat "$step_out"; } >> "$log"
  echo "[$(( $(date +%s) - t0 ))s] $name: exit $rc in $(( $(date +%s) - start ))s"
  ((rc == 0)) || failed=1
  return $rc
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sed 's/^/gpu: /'
if ((tests)); then
  run cuda_tests 300 "$build/cuda_tests"
  grep -E '^\[  (PASSED|FAILED) ' "$step_out" | head -20
  for backend in cuda cuda-fast; do
    run "op_harness $backend" 300 "$build/op_harness" --backend "$backend"
    grep -v '^ok' "$step_out" | tail -12
  done
  # CudaCheck.* provokes invalid-device API errors on purpose, which memcheck would count.
  run "memcheck (golden run)" 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$build/cuda_tests" \
    --gtest_filter=-CudaCheck.*
  grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$step_out" | head -12
fi
if [[ -n $perf ]]; then
  run "perf $perf" 300 "$build/op_harness" --backend cuda-fast --perf --op "$perf"
  grep -E 'probe|GB/s|[0-9]%' "$step_out" | head -60
fi
IFS=, read -ra shapes <<< "$bench"
for item in "${shapes[@]}"; do
  shape=${item%%:*} bits=()
  [[ $item == *:4bit ]] && bits=(--bits 4)
  dir="$TMPDIR/check-$shape${bits[*]:+-4bit}"
  rm -rf "$dir"  # --save refuses a folder that exists
  run "make $item" 300 "$build/qinfer" bench --shape "$shape" "${bits[@]}" --save "$dir" || continue
  for n in 1 ${tp}; do
    run "bench $item TP=$n" 420 "$build/qinfer" bench --model "$dir" --device cuda --tensor-parallel "$n" \
      --batch 1,8 --prompt 512,8192 --gen 64 --context 512
    grep -E 'model|probe|prefill|decode batch' "$step_out"
  done
  if ((sampled)); then
    for how in "--temp 0.7 --top-k 20 --top-p 0.8" "--temp 1"; do
      run "sampled $item ($how)" 300 "$build/qinfer" bench --model "$dir" --device cuda --batch 1,8 --prompt 16 \
        --gen 64 --context 512 $how
      grep -E 'decode batch' "$step_out"
    done
  fi
  if ((kernel_times)); then
    run "kernel times $item" 300 env QINFER_CUDA_GRAPHS=0 ncu --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv "$build/qinfer" bench --model "$dir" --device cuda --batch 1 \
      --prompt 16 --gen 3 --context 512
    python3 tools/gpu_bench/kernel_times.py "$step_out" | head -24
  fi
  if [[ -n $compare ]]; then
    for round in 1 2 3; do
      for bin in "$compare" qinfer; do
        run "compare $item $bin round $round" 120 "$build/$bin" bench --model "$dir" --device cuda --batch 1 \
          --prompt 512 --gen 128 --context 512
        grep -E 'decode batch' "$step_out"
      done
    done
  fi
  rm -rf "$dir"
done
echo "[$(( $(date +%s) - t0 ))s] done; $( ((failed)) && echo 'SOME STEPS FAILED' || echo 'every step exited 0'); details: $log"
exit $failed
