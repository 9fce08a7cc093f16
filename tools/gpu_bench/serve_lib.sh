# What serve_bench.sh, prefix_bench.sh and interval_sweep.sh share; sourced, after they set `log`.

# The build pack (QINFER_GPU_PACK, default build-pack/gpu.tar.xz) into build-gpu and the Qwen3
# tokenizer into .deps; sets `qinfer`.
unpack_packs() {
  mkdir -p build-gpu .deps && tar -C build-gpu -xJf "${QINFER_GPU_PACK:-build-pack/gpu.tar.xz}" &&
    tar -C .deps -xJf build-pack/qwen3-tokenizer.tar.xz || return 1
  export LD_LIBRARY_PATH=$PWD/build-gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  qinfer=build-gpu/qinfer
}

# save_shape SHAPE DIR: a random-weight checkpoint of SHAPE in DIR, the real Qwen3 tokenizer beside it.
save_shape() {
  rm -rf "$2"
  $qinfer bench --shape "$1" --save "$2" >> "$log" 2>&1 || { echo "$1: --save failed" | tee -a "$log"; return 1; }
  cp .deps/qwen3-tokenizer/tokenizer.json .deps/qwen3-tokenizer/tokenizer_config.json "$2/"
}

# start_server DIR PORT [SERVE FLAGS...]: `qinfer serve` of DIR on the GPU (its pid in `server`);
# fails when it exits or does not answer /health within 5 minutes.
start_server() {
  local dir=$1 port=$2
  shift 2
  $qinfer serve --model "$dir" --device cuda --port "$port" "$@" >> "$log" 2>&1 &
  server=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && return 0
    kill -0 $server 2> /dev/null || break
    sleep 0.5
  done
  echo "the server of $dir did not start" | tee -a "$log"
  return 1
}
