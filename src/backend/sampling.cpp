#include "backend/sampling.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
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
  if (!has_penalties(p)) return;
  for (const auto& [id, count] : history_counts(history, static_cast<int64_t>(logits.size()))) {
    float& l = logits[id];
    if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  }
}

// NaN logits become −inf (never picked) and −0 becomes +0, so that float order is the order of
// integer keys below; integer operations only, so the loop vectorises.
void canonicalize(std::vector<float>& logits) {
  uint32_t* bits = reinterpret_cast<uint32_t*>(logits.data());
  for (size_t i = 0; i < logits.size(); ++i) {
    const uint32_t b = bits[i];
    bits[i] = (b & 0x7FFFFFFFu) > 0x7F800000u ? 0xFF800000u : b == 0x80000000u ? 0u : b;
  }
}

// A signed integer with the order of the (canonical) float: negative floats have their magnitude
// bits flipped.
int32_t order_key(float f) {
  const int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7FFFFFFF);
}

// The lowest id of the largest logit (after canonicalize), through an integer max that vectorises.
int32_t argmax(const std::vector<float>& logits) {
  int32_t best = std::numeric_limits<int32_t>::min();
  for (float l : logits) best = std::max(best, order_key(l));
  int32_t i = 0;
  while (order_key(logits[i]) != best) ++i;
  return i;
}

// The candidates every filter looks at, best first (weight descending, lower id first): all tokens
// whose weight reaches a threshold, lowered until the set holds the top `count` and a prefix of
// mass `mass` (weights are ≤ 1, the best being exp(0)). They are put in order only as far as the
// filters read (a top-k of 20 out of a flat 152k-token row sorts 20, not 152k): the order is a
// strict total one, so what is read is what a full sort would give.
class LeadingCandidates {
 public:
  LeadingCandidates(RowWeights& weights, size_t count, double mass, float threshold) {
    std::vector<int32_t> ids;
    std::vector<float> w;
    for (;;) {
      weights.at_least(threshold, ids, w);
      double sum = 0.0;
      for (float v : w) sum += v;
      if (threshold == 0.0f || (ids.size() >= count && sum >= mass)) break;
      threshold = threshold > 1e-30f ? threshold / 64.0f : 0.0f;
    }
    c_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) c_[i] = {ids[i], w[i]};
  }
  size_t size() const { return c_.size(); }
  float weight(size_t i) { return at(i).second; }
  // The first n, in order.
  std::vector<std::pair<int32_t, float>> first(size_t n) {
    if (n > 0) at(n - 1);
    return {c_.begin(), c_.begin() + static_cast<std::ptrdiff_t>(n)};
  }

 private:
  static bool before(const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  }
  const std::pair<int32_t, float>& at(size_t i) {
    if (i >= sorted_) {
      // The next best up to past i, a growing stretch at a time: linear selection, then a sort of it.
      const size_t end = std::min(c_.size(), std::max(i + 1, 4 * sorted_ + 64));
      const auto first = c_.begin() + static_cast<std::ptrdiff_t>(sorted_);
      const auto last = c_.begin() + static_cast<std::ptrdiff_t>(end);
      if (end < c_.size()) std::nth_element(first, last, c_.end(), before);
      std::sort(first, last, before);
      sorted_ = end;
    }
    return c_[i];
  }
  std::vector<std::pair<int32_t, float>> c_;
  size_t sorted_ = 0;  // c_[0, sorted_) is in final order
};

int32_t sample_row(std::vector<float>& logits, const SamplingParams& p, uint64_t step) {
  if (p.temperature <= 0.0f) return argmax(logits);
  const int32_t best = argmax(logits);
  const float max_logit = logits[best];
  if (std::isinf(max_logit)) return best;  // +inf wins outright; all −inf: nothing to weigh

  const size_t vocab = logits.size();
  std::vector<float>& weight = logits;  // in place
  float* w = weight.data();
  const float temperature = p.temperature;  // a local: stores through w could alias p
  for (size_t i = 0; i < vocab; ++i) w[i] = sampling_weight(w[i], max_logit, temperature);
  std::vector<double> blocks((vocab + kSamplingBlock - 1) / kSamplingBlock);
  for (size_t b = 0; b < blocks.size(); ++b)
    blocks[b] = sampling_block_sum(w + b * kSamplingBlock, std::min<size_t>(kSamplingBlock, vocab - b * kSamplingBlock));
  VectorWeights source(weight);
  return pick_weighted(p, step, best, static_cast<int64_t>(vocab), blocks, source);
}

}  // namespace

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

std::vector<std::pair<int32_t, int32_t>> history_counts(const std::vector<int32_t>& history, int64_t vocab_size) {
  std::vector<int32_t> ids;
  ids.reserve(history.size());
  for (int32_t id : history)
    if (id >= 0 && id < vocab_size) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<std::pair<int32_t, int32_t>> counts;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    counts.emplace_back(ids[i], static_cast<int32_t>(j - i));
    i = j;
  }
  return counts;
}

// Σ w[0, n) in double over four interleaved partial sums (independent add chains).
double sampling_block_sum(const float* w, size_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += w[i + j];
  for (; i < n; ++i) s[0] += w[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// exp((logit − max) / temperature) from integer and +/× operations alone (Cody–Waite reduction,
// degree-6 polynomial, ~1 ulp), exactly 0 below e^-87.3 (−inf logits included): the same bits on
// every compiler and device, and branch-free so the loop over the vocabulary vectorises (a libm
// call per token would dominate a CPU decode step).
float sampling_weight(float logit, float max_logit, float temperature) {
  const float x = (logit - max_logit) / temperature;  // ≤ 0
  const uint32_t limit = std::bit_cast<uint32_t>(-87.33654f), bits = std::bit_cast<uint32_t>(x);
  const uint32_t keep = 0u - static_cast<uint32_t>(bits <= limit);  // as unsigned, +0 and x ≥ −87.3 sort below
  const float xc = std::bit_cast<float>(std::min(bits, limit));
  const float shifter = 12582912.0f;  // 1.5·2^23: the sum rounds n to an integer in its low mantissa bits
  const float t = xc * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * (r * r) + (r + 1.0f);
  const uint32_t scale = (std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(shifter) + 127u) << 23;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(poly * std::bit_cast<float>(scale)) & keep);
}

void VectorWeights::at_least(float threshold, std::vector<int32_t>& ids, std::vector<float>& weights) {
  ids.clear(), weights.clear();
  for (size_t i = 0; i < w_.size(); ++i)
    if (w_[i] >= threshold) ids.push_back(static_cast<int32_t>(i)), weights.push_back(w_[i]);
}

void VectorWeights::range(int64_t begin, int64_t end, std::vector<float>& weights) {
  weights.assign(w_.begin() + begin, w_.begin() + end);
}

int32_t pick_weighted(const SamplingParams& p, uint64_t step, int32_t best, int64_t vocab_size,
                      const std::vector<double>& blocks, RowWeights& weights) {
  const auto vocab = static_cast<size_t>(vocab_size);
  // Mass in blocks of kSamplingBlock tokens: the total, and the draw's walk over the whole
  // vocabulary, visit block sums first and then a single block.
  double total = 0.0;
  for (double b : blocks) total += b;

  const bool top_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab;
  std::vector<std::pair<int32_t, float>> kept;  // ascending ids; empty: the whole vocabulary
  double mass = total;
  if (top_k || p.top_p < 1.0f || p.min_p > 0.0f) {
    size_t n = top_k ? static_cast<size_t>(p.top_k) : vocab;
    // Without top_k the top_p prefix is measured against the whole vocabulary's mass; with it,
    // against the top k's, which the candidates hold anyway.
    const double p_mass = p.top_p < 1.0f && !top_k ? static_cast<double>(p.top_p) * total : 0.0;
    LeadingCandidates order(weights, top_k ? n : 1, p_mass, sampling_threshold(p));
    n = std::min(n, order.size());
    if (p.top_p < 1.0f) {
      double target = static_cast<double>(p.top_p) * total;
      if (top_k) {
        double n_mass = 0.0;
        for (size_t i = 0; i < n; ++i) n_mass += order.weight(i);
        target = static_cast<double>(p.top_p) * n_mass;
      }
      double cum = 0.0;
      size_t i = 0;
      while (i < n) {
        cum += order.weight(i++);
        if (cum >= target) break;
      }
      n = i;
    }
    if (p.min_p > 0.0f) {
      const float cut = p.min_p * order.weight(0);
      size_t i = 1;
      while (i < n && order.weight(i) >= cut) ++i;
      n = i;
    }
    kept = order.first(n);
    std::sort(kept.begin(), kept.end());
    mass = 0.0;
    for (const auto& [id, w] : kept) mass += w;
  }

  const double target = sampling_uniform(p.seed, step) * mass;
  double cum = 0.0;
  int32_t last = best;  // the last positive weight passed: the pick when rounding leaves u·mass unreached
  if (!kept.empty()) {
    for (const auto& [id, w] : kept) {
      if (w == 0.0f) continue;
      cum += w, last = id;
      if (target < cum) return id;
    }
    return last;
  }
  size_t b = 0;
  while (b + 1 < blocks.size() && cum + blocks[b] <= target) cum += blocks[b++];
  const int64_t begin = static_cast<int64_t>(b * kSamplingBlock);
  std::vector<float> w;
  weights.range(begin, std::min<int64_t>(vocab_size, begin + kSamplingBlock), w);
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == 0.0f) continue;
    cum += w[i], last = static_cast<int32_t>(begin + static_cast<int64_t>(i));
    if (target < cum) return last;
  }
  return last;
}

float sampling_threshold(const SamplingParams& p) {
  return p.min_p > 0.0f ? std::min(p.min_p, 1.0f / 4096) : 1.0f / 4096;
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  return static_cast<double>(splitmix64(splitmix64(seed) + step) >> 11) * 0x1.0p-53;
}

void mask_logits_rows(Tensor& logits, const Tensor& rows, const Tensor& allowed) {
  const auto shape_str = [](const Tensor& t) { return fmt::format("[{}]", fmt::join(t.shape, ", ")); };
  QINFER_CHECK(logits.dtype == DType::f32 && logits.rank() == 2, "mask_logits: logits must be f32 [S, V], got {} {}",
               name(logits.dtype), shape_str(logits));
  const int64_t S = logits.dim(0), V = logits.dim(1), words = (V + 31) / 32;
  QINFER_CHECK(rows.dtype == DType::i32 && rows.rank() == 1, "mask_logits: rows must be i32 [R], got {} {}",
               name(rows.dtype), shape_str(rows));
  const int64_t R = rows.dim(0);
  QINFER_CHECK(allowed.dtype == DType::u32 && allowed.shape == std::vector<int64_t>({R, words}),
               "mask_logits: allowed must be u32 [{}, {}], got {} {}", R, words, name(allowed.dtype),
               shape_str(allowed));
  std::vector<char> seen(S, 0);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t row = rows.ptr<int32_t>()[r];
    QINFER_CHECK(row >= 0 && row < S && !seen[row], "mask_logits: row {} is out of [0, {}) or repeated", row, S);
    seen[row] = 1;
    float* l = logits.ptr<float>() + row * V;
    const uint32_t* bits = allowed.ptr<uint32_t>() + r * words;
    for (int64_t v = 0; v < V; ++v)
      if (!((bits[v >> 5] >> (v & 31)) & 1)) l[v] = -std::numeric_limits<float>::infinity();
  }
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
    canonicalize(row);
    out[s] = sample_row(row, params[s], step[s]);
  }
}

}  // namespace qinfer
