#pragma once
// Sampling parameters and the one definition of how a token is picked from logits, shared by every
// backend so that a seeded request gives the same tokens on CPU and GPU.
#include <cstddef>
#include <cstdint>
#include <utility>
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

struct Tensor;

// Picks one token per row of host logits f32 [S,V] into out[S]. For each row, in this order:
//  1. penalties over history[s] (ids outside [0,V) are ignored): repetition_penalty once per distinct
//     id (logit > 0 ? logit / p : logit · p), then −presence_penalty once and −frequency_penalty per
//     occurrence of each id;
//  2. temperature == 0: argmax, the lowest id on ties (NaN logits never win);
//  3. else weights w = exp((logit − max) / temperature) in f32 (the softmax before normalising;
//     exp is sampling.cpp's own +/× polynomial, so a device backend can reproduce the bits; weights
//     below e^-87.3 and those of −inf / NaN logits are exactly 0 and never drawn);
//     candidates ordered by weight, descending, lower id first on ties; top_k keeps the first k;
//     top_p keeps the shortest prefix whose mass (renormalised over what top_k kept, summed in
//     double) reaches top_p, at least one token; min_p drops tokens whose weight is below
//     min_p · the largest;
//  4. draws from the kept candidates in ascending id order: the first whose running sum (double)
//     exceeds u · their total, u = uniform [0,1) from splitmix64(splitmix64(seed) + step[s]). The
//     pick depends only on (logits, params, history, seed, step), never on the batch around it.
void sample_rows(const Tensor& logits, const std::vector<SamplingParams>& params,
                 const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
                 std::vector<int32_t>& out);

// Ops::mask_logits on host tensors: the one definition, which host backends run and device backends
// reproduce. Throws for bad shapes, dtypes, or rows out of range or repeated.
void mask_logits_rows(Tensor& logits, const Tensor& rows, const Tensor& allowed);

// The uniform [0,1) draw of step 3 (53 random bits), exposed for tests and for device backends.
double sampling_uniform(uint64_t seed, uint64_t step);

// The pieces of sample_rows a device backend reproduces (its kernels compute the same bits; these
// are the definitions):
// whether step 1 changes anything, and the distinct ids of a history inside [0, vocab_size),
// ascending, with their occurrence counts (what step 1 applies);
bool has_penalties(const SamplingParams& p);
std::vector<std::pair<int32_t, int32_t>> history_counts(const std::vector<int32_t>& history, int64_t vocab_size);
// step 3's weight of one logit (after penalties and canonicalisation; max_logit the row's largest);
float sampling_weight(float logit, float max_logit, float temperature);
// the mass of a block of n ≤ kSamplingBlock weights: four interleaved double sums over i, i+1, i+2,
// i+3 (a tail of n % 4 into the first), then (s0 + s1) + (s2 + s3);
constexpr int64_t kSamplingBlock = 1024;
double sampling_block_sum(const float* w, size_t n);
// the first candidate threshold of top_k / top_p / min_p (lowered by 64× while too few pass).
float sampling_threshold(const SamplingParams& p);

// Where a row's weights are, for the filters and the draw: ids (ascending) with their weights where
// the weight ≥ threshold, and the weights of an id range. Device backends answer from what their
// kernels brought back, fetching more only when the pick needs it.
class RowWeights {
 public:
  virtual ~RowWeights() = default;
  virtual void at_least(float threshold, std::vector<int32_t>& ids, std::vector<float>& weights) = 0;
  virtual void range(int64_t begin, int64_t end, std::vector<float>& weights) = 0;
};

// RowWeights over a whole row of weights in host memory (which it does not own).
class VectorWeights final : public RowWeights {
 public:
  explicit VectorWeights(const std::vector<float>& w) : w_(w) {}
  void at_least(float threshold, std::vector<int32_t>& ids, std::vector<float>& weights) override;
  void range(int64_t begin, int64_t end, std::vector<float>& weights) override;

 private:
  const std::vector<float>& w_;
};

// Steps 3-4 once the weights exist: `best` is the row's argmax, blocks[b] the mass of ids
// [b·kSamplingBlock, ...) (sampling_block_sum). Used by sample_rows itself.
int32_t pick_weighted(const SamplingParams& p, uint64_t step, int32_t best, int64_t vocab_size,
                      const std::vector<double>& blocks, RowWeights& weights);

}  // namespace qinfer
