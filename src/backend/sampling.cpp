#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/tensor.h"
#include "core/error.h"

namespace qinfer {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void apply_penalties(const SamplingParams& p, const std::vector<int32_t>& history, std::vector<float>& logits) {
  if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> ids;
  ids.reserve(history.size());
  for (int32_t id : history)
    if (id >= 0 && id < vocab) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    float& l = logits[ids[i]];
    if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(j - i);
    i = j;
  }
}

int32_t argmax(const std::vector<float>& logits) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > best_value) best = static_cast<int32_t>(i), best_value = logits[i], found = true;
  }
  return best;
}

// Candidate ids ordered by weight (descending, lower id first), sorted lazily: most rows only ever
// look at a short prefix, and sorting a 150k vocabulary per token would dominate a CPU decode step.
class SortedCandidates {
 public:
  explicit SortedCandidates(const std::vector<double>& weight) : weight_(weight), ids_(weight.size()) {
    for (size_t i = 0; i < ids_.size(); ++i) ids_[i] = static_cast<int32_t>(i);
  }
  size_t size() const { return ids_.size(); }
  // The i-th best id (i < size()).
  int32_t at(size_t i) {
    if (i >= sorted_) {
      const size_t want = std::min(ids_.size(), std::max<size_t>(2 * i + 1, 256));
      auto better = [this](int32_t a, int32_t b) {
        return weight_[a] > weight_[b] || (weight_[a] == weight_[b] && a < b);
      };
      std::partial_sort(ids_.begin() + sorted_, ids_.begin() + want, ids_.end(), better);
      sorted_ = want;
    }
    return ids_[i];
  }

 private:
  const std::vector<double>& weight_;
  std::vector<int32_t> ids_;
  size_t sorted_ = 0;
};

int32_t sample_row(std::vector<float>& logits, const SamplingParams& p, uint64_t step) {
  if (p.temperature <= 0.0f) return argmax(logits);
  const int32_t best = argmax(logits);
  const float max_logit = logits[best];
  if (std::isnan(max_logit) || std::isinf(max_logit)) return best;

  const size_t vocab = logits.size();
  std::vector<double> weight(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    const double z = (static_cast<double>(logits[i]) - max_logit) / p.temperature;
    weight[i] = std::isnan(z) ? 0.0 : std::exp(z);
  }
  SortedCandidates order(weight);

  size_t kept = vocab;
  double mass = 0.0;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab) {
    kept = static_cast<size_t>(p.top_k);
    for (size_t i = 0; i < kept; ++i) mass += weight[order.at(i)];
  } else {
    for (double w : weight) mass += w;
  }
  if (p.top_p < 1.0f) {
    const double target = static_cast<double>(p.top_p) * mass;
    double cum = 0.0;
    size_t i = 0;
    while (i < kept) {
      cum += weight[order.at(i++)];
      if (cum >= target) break;
    }
    kept = i, mass = cum;
  }
  if (p.min_p > 0.0f) {
    const double threshold = static_cast<double>(p.min_p) * weight[order.at(0)];
    size_t i = 1;
    while (i < kept && weight[order.at(i)] >= threshold) ++i;
    if (i < kept) {
      kept = i, mass = 0.0;
      for (size_t j = 0; j < kept; ++j) mass += weight[order.at(j)];
    }
  }

  const double target = sampling_uniform(p.seed, step) * mass;
  double cum = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cum += weight[order.at(i)];
    if (target < cum) return order.at(i);
  }
  return order.at(kept - 1);  // only reached through rounding when u is within an ulp of 1
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t step) {
  return static_cast<double>(splitmix64(splitmix64(seed) + step) >> 11) * 0x1.0p-53;
}

void sample_rows(const Tensor& logits, const std::vector<SamplingParams>& params,
                 const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
                 std::vector<int32_t>& out) {
  QINFER_CHECK(logits.dtype == DType::f32 && logits.rank() == 2 && logits.device == Device::cpu,
               "sample: logits must be a host f32 [rows, vocab] tensor (got {} of rank {})", name(logits.dtype),
               logits.rank());
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  QINFER_CHECK(vocab > 0, "sample: logits have an empty vocabulary");
  QINFER_CHECK(static_cast<int64_t>(params.size()) == rows && static_cast<int64_t>(history.size()) == rows &&
                   static_cast<int64_t>(step.size()) == rows,
               "sample: {} logit rows but {} params, {} histories and {} steps", rows, params.size(),
               history.size(), step.size());
  out.resize(rows);
  std::vector<float> row(vocab);
  for (int64_t s = 0; s < rows; ++s) {
    const float* src = logits.ptr<float>() + s * vocab;
    row.assign(src, src + vocab);
    apply_penalties(params[s], history[s], row);
    out[s] = sample_row(row, params[s], step[s]);
  }
}

}  // namespace qinfer
