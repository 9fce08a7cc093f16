#pragma once
// Sampling parameters and the one definition of how a token is picked from logits, shared by every
// backend so that a seeded request gives the same tokens on CPU and GPU.
#include <cstdint>
#include <vector>

namespace qinfer {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;  // 1: off (HF/vLLM semantics: logit>0 ? logit/p : logit*p, per seen id)
  float presence_penalty = 0.0f;    // OpenAI semantics: −presence if the id occurred
  float frequency_penalty = 0.0f;   // OpenAI semantics: −frequency × count
  uint64_t seed = 0;
};

}  // namespace qinfer
