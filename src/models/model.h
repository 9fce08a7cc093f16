#pragma once
// A loaded model and the one forward path: a flat, variable-length batch of tokens from many
// sequences. Prefill, decode, chunked prefill and verification are all this call.
#include <memory>
#include <variant>
#include <vector>

#include "cache/cache.h"
#include "layers/attention.h"
#include "layers/gated_deltanet.h"
#include "layers/mlp.h"
#include "models/registry.h"

namespace qinfer::models {

struct Batch {
  struct Sequence {
    std::vector<int32_t> tokens;
    SequenceCache* cache = nullptr;  // advanced by forward()
    bool all_logits = false;          // logits for every token, else for the last one
  };
  std::vector<Sequence> sequences;
};

// One decoder layer: a token mixer and a feed-forward block, each after its own pre-norm.
struct DecoderLayer {
  Tensor input_norm, post_attention_norm;
  std::variant<layers::Attention, layers::GatedDeltaNet> mixer;
  std::variant<layers::Mlp, layers::Moe> ffn;
};

class Model {
 public:
  Model(const Checkpoint& checkpoint, Ops& ops);
  const io::TextConfig& config() const { return config_; }
  CacheShape cache_shape() const;
  Ops& ops() const { return ops_; }

  // Runs the batch and advances each sequence's cache. Returns logits f32 [rows, vocab]: every
  // position of sequences with all_logits, else their last position, in sequence order.
  // `dump`, when set, receives every named intermediate (layers.{i}.*, norm, logits).
  Tensor forward(const Batch& batch, ModelCache& cache,
                 const std::function<void(const std::string&, const Tensor&)>& dump = {});

 private:
  Tensor run(const Batch& batch, const std::vector<int32_t>& tokens, layers::ForwardContext& ctx,
             const std::function<void(const std::string&, const Tensor&)>& dump);

  io::TextConfig config_;
  Ops& ops_;
  Weight embed_tokens, lm_head;  // lm_head is embed_tokens when tied (dequantized rows / packed head alike)
  Tensor final_norm;
  std::vector<DecoderLayer> layers_;
};

}  // namespace qinfer::models
