#pragma once
// The two algorithms of the ref gated delta rule, on one value head of one sequence gathered into
// contiguous arrays (the op in ref_ops.cpp validates, gathers and scatters).
#include <cstdint>

namespace qinfer::ref {

struct DeltaHead {
  int64_t len = 0, dk = 0, dv = 0;
  const float* q = nullptr;     // [len, dk]
  const float* k = nullptr;     // [len, dk]
  const float* v = nullptr;     // [len, dv]
  const float* g = nullptr;     // [len] log decay
  const float* beta = nullptr;  // [len]
  float* out = nullptr;         // [len, dv]

  // Its first n tokens, and the rest.
  DeltaHead first(int64_t n) const {
    DeltaHead h = *this;
    h.len = n;
    return h;
  }
  DeltaHead rest(int64_t n) const {
    DeltaHead h = *this;
    h.len = len - n;
    h.q += n * dk;
    h.k += n * dk;
    h.v += n * dv;
    h.g += n;
    h.beta += n;
    h.out += n * dv;
    return h;
  }
};

// Token by token, exactly the loop of ops.h. state [dv, dk], updated in place.
void delta_rule_recurrent(const DeltaHead& head, float* state);
// The chunked WY / UT-transform form: one triangular solve per chunk of `chunk` tokens, the state
// touched once per chunk. Same inputs, outputs and state meaning as the recurrent form.
void delta_rule_chunked(const DeltaHead& head, float* state, int64_t chunk = 64);

}  // namespace qinfer::ref
