#include "models/eval.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "core/error.h"

namespace qinfer::models {

EvalMode parse_eval_mode(const std::string& text) {
  if (text == "prefill") return {EvalMode::prefill, 0};
  if (text == "decode") return {EvalMode::decode, 1};
  for (const auto& [prefix, kind, what] : {std::tuple("chunked:", EvalMode::chunked, "the chunk size"),
                                            std::tuple("cached:", EvalMode::cached, "the cached length")}) {
    if (!text.starts_with(prefix)) continue;
    const std::string n = text.substr(std::strlen(prefix));
    QINFER_CHECK(!n.empty() && n.size() < 9 && std::all_of(n.begin(), n.end(), ::isdigit) && std::stoi(n) > 0,
                 "--mode {}: {} must be a positive integer", text, what);
    return {kind, std::stoi(n)};
  }
  fail("--mode {}: expected prefill, decode, chunked:N or cached:N", text);
}

ModelCache make_cache(const Model& model, int64_t tokens, int64_t sequences) {
  return model.cache_for(tokens, sequences);
}

Tensor prompt_logits(Model& model, const std::vector<int32_t>& prompt, EvalMode mode,
                     const std::function<void(const std::string&, const Tensor&)>& dump) {
  QINFER_CHECK(!prompt.empty(), "the prompt is empty");
  QINFER_CHECK(mode.kind != EvalMode::cached, "prompt_logits: cached mode runs through the engine (cached_prompt_logits)");
  const int64_t L = static_cast<int64_t>(prompt.size()), V = model.config().vocab_size;
  ModelCache cache = make_cache(model, L);
  SequenceCache seq = cache.sequence(0);
  const int64_t step = mode.kind == EvalMode::prefill ? L : mode.chunk;
  Tensor out = host_tensor(DType::f32, {L, V});
  for (int64_t begin = 0; begin < L; begin += step) {
    const int64_t end = std::min(L, begin + step);
    Batch batch;
    batch.sequences.push_back({std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end), &seq, true});
    const Tensor logits = to_host(model.ops(), model.forward(batch, cache, dump));
    std::memcpy(out.ptr<float>() + begin * V, logits.data, static_cast<size_t>((end - begin) * V) * sizeof(float));
  }
  return out;
}

std::vector<int32_t> greedy_continuation(Model& model, const std::vector<int32_t>& prompt, int32_t count) {
  QINFER_CHECK(!prompt.empty(), "the prompt is empty");
  const int64_t V = model.config().vocab_size;
  ModelCache cache = make_cache(model, static_cast<int64_t>(prompt.size()) + count);
  SequenceCache seq = cache.sequence(0);
  std::vector<int32_t> generated, next = prompt;
  for (int32_t i = 0; i < count; ++i) {
    Batch batch;
    batch.sequences.push_back({next, &seq, false});
    const Tensor logits = to_host(model.ops(), model.forward(batch, cache));
    const float* row = logits.ptr<float>();
    const int32_t token = static_cast<int32_t>(std::max_element(row, row + V) - row);
    generated.push_back(token);
    next = {token};
  }
  return generated;
}

}  // namespace qinfer::models
