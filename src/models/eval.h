#pragma once
// Prompt logits and greedy continuations through the one forward path: the oracle interface that
// tests and `qinfer eval` use.
#include <string>
#include <vector>

#include "models/model.h"

namespace qinfer::models {

// prefill: the whole prompt in one forward; decode: one token per forward through the cache;
// chunked: the prompt in chunks of `chunk` tokens; cached: through the engine's prefix cache, after
// an earlier request of the first `chunk` ids (engine/cached_logits.h; prompt_logits refuses it).
struct EvalMode {
  enum Kind { prefill, decode, chunked, cached } kind = prefill;
  int32_t chunk = 0;
};
EvalMode parse_eval_mode(const std::string& text);  // "prefill" | "decode" | "chunked:N" | "cached:N"

// A cache big enough for `tokens` tokens in each of `sequences` sequences.
ModelCache make_cache(const Model& model, int64_t tokens, int64_t sequences = 1);

// Logits f32 [L, V] for every prompt position, from a fresh cache. `dump` as in Model::forward.
Tensor prompt_logits(Model& model, const std::vector<int32_t>& prompt, EvalMode mode,
                     const std::function<void(const std::string&, const Tensor&)>& dump = {});
// `count` greedily generated tokens after the prompt (argmax, lowest id on ties).
std::vector<int32_t> greedy_continuation(Model& model, const std::vector<int32_t>& prompt, int32_t count);

}  // namespace qinfer::models
