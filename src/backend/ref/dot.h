#pragma once
#include <cstdint>

namespace qinfer::ref {

// Σ a[i]·b[i] in double. Four running sums, so the loop is not one chain of dependent adds (the
// harness's long attention and delta-rule cases spend most of their time here); in double the
// order changes nothing the comparisons can see.
inline double dot(const float* a, const float* b, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(a[i + j]) * b[i + j];
  for (; i < n; ++i) s[0] += static_cast<double>(a[i]) * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace qinfer::ref
