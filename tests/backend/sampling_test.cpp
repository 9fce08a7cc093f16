// sample_rows: every filter on hand-made distributions, the penalties, reproducibility from
// (seed, step) alone, and the empirical distribution against the exact one.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "backend/sampling.h"
#include "backend/tensor.h"
#include "core/error.h"

namespace qinfer {
namespace {

Tensor logits_of(const std::vector<std::vector<float>>& rows) {
  Tensor t = host_tensor(DType::f32, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t r = 0; r < rows.size(); ++r) std::copy(rows[r].begin(), rows[r].end(), t.ptr<float>() + r * rows[0].size());
  return t;
}

// Logits whose softmax is exactly `probs`.
std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return l;
}

int32_t pick(const std::vector<float>& logits, const SamplingParams& p, uint64_t step = 0,
             const std::vector<int32_t>& history = {}) {
  std::vector<int32_t> out;
  sample_rows(logits_of({logits}), {p}, {history}, {step}, out);
  return out.at(0);
}

// Token counts over `steps` consecutive steps of one seeded row.
std::map<int32_t, int> histogram(const std::vector<float>& logits, const SamplingParams& p, int steps) {
  std::map<int32_t, int> counts;
  for (int s = 0; s < steps; ++s) counts[pick(logits, p, s)]++;
  return counts;
}

std::set<int32_t> support(const std::map<int32_t, int>& counts) {
  std::set<int32_t> ids;
  for (auto [id, n] : counts) ids.insert(id);
  return ids;
}

TEST(Sampling, GreedyTakesTheLowestIdAmongTiesAndSkipsNan) {
  EXPECT_EQ(pick({1.0f, 3.0f, 3.0f, -2.0f}, {}), 1);
  EXPECT_EQ(pick({NAN, 0.5f, NAN, 0.7f}, {}), 3);
  EXPECT_EQ(pick({-INFINITY, -1e30f}, {}), 1);
  EXPECT_EQ(pick({0.0f, -0.0f}, {}), 0);  // −0 == +0: a tie, so the lower id
  EXPECT_EQ(pick({-0.0f, 0.0f}, {}), 0);
}

// −inf is how callers mask tokens out; NaN must not poison the weights.
TEST(Sampling, MaskedAndNanLogitsAreNeverDrawn) {
  const std::vector<float> row = {-INFINITY, 0.3f, NAN, 0.1f, -INFINITY, -90.0f, 0.2f};
  const auto counts = histogram(row, {.temperature = 1.0f, .seed = 77}, 3000);
  EXPECT_EQ(support(counts), (std::set<int32_t>{1, 3, 6}));  // e^-90 is below the f32 weight floor too
  EXPECT_EQ(pick({-INFINITY, -INFINITY}, {.temperature = 1.0f}), 0);
  EXPECT_EQ(pick({NAN, NAN}, {.temperature = 1.0f}), 0);
}

TEST(Sampling, SeededDrawsAreReproducibleAndIndependentOfTheBatch) {
  const std::vector<float> row = {0.1f, 0.5f, -0.3f, 0.0f, 0.9f, 0.2f};
  const SamplingParams p{.temperature = 1.0f, .seed = 42};
  std::vector<int32_t> alone, batched;
  for (uint64_t step = 0; step < 50; ++step) alone.push_back(pick(row, p, step));
  EXPECT_EQ(alone, [&] {
    std::vector<int32_t> again;
    for (uint64_t step = 0; step < 50; ++step) again.push_back(pick(row, p, step));
    return again;
  }());
  EXPECT_GT(std::set<int32_t>(alone.begin(), alone.end()).size(), 3u);  // steps really vary the draw
  // The same row in the middle of a batch of others, with other seeds and steps around it.
  for (uint64_t step = 0; step < 50; ++step) {
    std::vector<int32_t> out;
    const SamplingParams other{.temperature = 0.7f, .top_k = 2, .seed = 7};
    sample_rows(logits_of({{3, 2, 1, 0, -1, -2}, row, {0, 0, 0, 0, 0, 0}}), {other, p, other}, {{}, {}, {1}},
                {999, step, 3}, out);
    batched.push_back(out[1]);
  }
  EXPECT_EQ(alone, batched);
  // Another seed gives another sequence.
  std::vector<int32_t> reseeded;
  for (uint64_t step = 0; step < 50; ++step) reseeded.push_back(pick(row, {.temperature = 1.0f, .seed = 43}, step));
  EXPECT_NE(alone, reseeded);
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  const std::vector<float> row = log_probs({0.1, 0.4, 0.05, 0.3, 0.15});
  EXPECT_EQ(support(histogram(row, {.temperature = 1.0f, .top_k = 1, .seed = 1}, 200)), (std::set<int32_t>{1}));
  EXPECT_EQ(support(histogram(row, {.temperature = 1.0f, .top_k = 2, .seed = 1}, 400)), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(support(histogram(row, {.temperature = 1.0f, .top_k = 3, .seed = 1}, 600)), (std::set<int32_t>{1, 3, 4}));
}

TEST(Sampling, TopPKeepsTheShortestPrefixReachingP) {
  const std::vector<float> row = log_probs({0.15, 0.5, 0.05, 0.3});  // sorted: 1 (.5), 3 (.3), 0 (.15), 2 (.05)
  auto with_p = [&](float top_p) { return support(histogram(row, {.temperature = 1.0f, .top_p = top_p, .seed = 5}, 600)); };
  EXPECT_EQ(with_p(0.01f), (std::set<int32_t>{1}));  // always at least one
  EXPECT_EQ(with_p(0.45f), (std::set<int32_t>{1}));
  EXPECT_EQ(with_p(0.79f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(with_p(0.81f), (std::set<int32_t>{1, 3, 0}));
  // After top_k = 2 the mass is renormalised over the two: 0.5/0.8 = 0.625 alone reaches 0.6.
  EXPECT_EQ(support(histogram(row, {.temperature = 1.0f, .top_k = 2, .top_p = 0.6f, .seed = 5}, 300)),
            (std::set<int32_t>{1}));
}

TEST(Sampling, MinPDropsTokensBelowAFractionOfTheBest) {
  const std::vector<float> row = log_probs({0.15, 0.5, 0.05, 0.3});
  EXPECT_EQ(support(histogram(row, {.temperature = 1.0f, .min_p = 0.5f, .seed = 9}, 600)), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(support(histogram(row, {.temperature = 1.0f, .min_p = 0.2f, .seed = 9}, 900)), (std::set<int32_t>{0, 1, 3}));
}

// Chi-square of 20000 seeded draws against the exact temperature-scaled softmax. The draws are a
// fixed function of (seed, step), so this is deterministic; a biased sampler lands far above the
// bound (the 99.9% point of chi-square with 5 degrees of freedom is 20.5).
TEST(Sampling, DrawsFollowTheTemperatureScaledDistribution) {
  const std::vector<float> row = {1.0f, 0.2f, -0.5f, 1.5f, 0.0f, -2.0f};
  const float temperature = 0.8f;
  std::vector<double> p(row.size());
  double z = 0.0;
  for (size_t i = 0; i < row.size(); ++i) z += p[i] = std::exp(row[i] / temperature);
  const int n = 20000;
  const auto counts = histogram(row, {.temperature = temperature, .seed = 2024}, n);
  double chi2 = 0.0;
  for (size_t i = 0; i < row.size(); ++i) {
    const double expected = n * p[i] / z;
    const double observed = counts.count(static_cast<int32_t>(i)) ? counts.at(static_cast<int32_t>(i)) : 0;
    chi2 += (observed - expected) * (observed - expected) / expected;
  }
  EXPECT_LT(chi2, 20.5);
  EXPECT_EQ(counts.size(), row.size());  // every token drawn, down to the 1.5% one
}

TEST(Sampling, UniformDrawsAreInTheUnitIntervalAndCentred) {
  double sum = 0.0;
  std::set<double> seen;
  for (uint64_t step = 0; step < 10000; ++step) {
    const double u = sampling_uniform(123, step);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    seen.insert(u);
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.01);
  EXPECT_EQ(seen.size(), 10000u);
  EXPECT_NE(sampling_uniform(1, 0), sampling_uniform(2, 0));
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  // 2.0 seen → 1.0, below the unseen 1.5.
  EXPECT_EQ(pick({2.0f, 1.5f, -1.0f}, {.repetition_penalty = 2.0f}, 0, {0}), 1);
  EXPECT_EQ(pick({2.0f, 1.5f, -1.0f}, {.repetition_penalty = 1.2f}, 0, {0}), 0);
  // −1 seen → −2, below the unseen −1.5; penalised once however often it was seen.
  EXPECT_EQ(pick({-1.0f, -1.5f}, {.repetition_penalty = 2.0f}, 0, {0, 0, 0}), 1);
  EXPECT_EQ(pick({-1.0f, -1.5f}, {.repetition_penalty = 1.4f}, 0, {0, 0, 0}), 0);
  // Ids outside the vocabulary are ignored.
  EXPECT_EQ(pick({2.0f, 1.5f}, {.repetition_penalty = 2.0f}, 0, {-1, 5}), 0);
}

TEST(Sampling, PresenceAndFrequencyPenaltiesCountOccurrences) {
  // 3 − 0.1 − 3·0.2 = 2.3 < 2.5, but 3 − 0.1 − 3·0.1 = 2.6 > 2.5.
  EXPECT_EQ(pick({3.0f, 2.5f}, {.presence_penalty = 0.1f, .frequency_penalty = 0.2f}, 0, {0, 0, 0}), 1);
  EXPECT_EQ(pick({3.0f, 2.5f}, {.presence_penalty = 0.1f, .frequency_penalty = 0.1f}, 0, {0, 0, 0}), 0);
  EXPECT_EQ(pick({3.0f, 2.5f}, {.presence_penalty = 0.6f}, 0, {0}), 1);
}

TEST(Sampling, MismatchedArgumentsThrow) {
  std::vector<int32_t> out;
  EXPECT_THROW(sample_rows(logits_of({{1, 2}, {3, 4}}), {SamplingParams{}}, {{}, {}}, {0, 0}, out), Error);
  EXPECT_THROW(sample_rows(host_tensor(DType::bf16, {1, 4}), {SamplingParams{}}, {{}}, {0}, out), Error);
}

}  // namespace
}  // namespace qinfer
