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
#include "parallel/communicator.h"
#include "parallel/sharding.h"

namespace qinfer::models {

struct Batch {
  struct Sequence {
    std::vector<int32_t> tokens;
    SequenceCache* cache = nullptr;  // advanced by forward()
    bool all_logits = false;          // logits for every token, else for the last one
    // A model with recurrent state: the slot its state is written to (-1: its own, in place). The
    // state it started from then stays behind in its slot, and forward() moves cache->slot here.
    int32_t state_to = -1;
    // And a slot that gets the state after its first snapshot_at tokens (-1: none), a checkpoint.
    int32_t snapshot_at = 0, snapshot_to = -1;
  };
  std::vector<Sequence> sequences;
  // A decode step's block-table width (0: the smallest power of two ≥ 8 that holds every sequence's
  // blocks). The engine fixes it so that a batch size's recorded step serves every context length.
  int32_t block_table_width = 0;
  // A decode step may be recorded and replayed (Ops::begin_step); false runs it as is, unkeyed.
  bool may_record = true;
};

// One decoder layer: a token mixer and a feed-forward block, each after its own pre-norm.
struct DecoderLayer {
  Tensor input_norm, post_attention_norm;
  std::variant<layers::Attention, layers::GatedDeltaNet> mixer;
  std::variant<layers::Mlp, layers::Moe> ffn;
};

// What the engine (generate, the scheduler, bench) drives: one Model, or a tensor-parallel group of
// them (models/tensor_parallel.h) that looks like one.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual const io::TextConfig& config() const = 0;
  // The backend holding the logits forward() returns: sampling and free-memory queries go there.
  virtual Ops& ops() const = 0;
  virtual CacheShape cache_shape() const = 0;  // one rank's (of a group: each rank holds this much)
  // Ranks of this process, each holding a cache_shape() cache: on the CPU they share host memory.
  virtual int local_ranks() const { return 1; }
  // Caches for every rank: `num_blocks` KV blocks of `block_size` tokens, `num_slots` state slots.
  virtual ModelCache make_cache(int64_t num_blocks, int32_t block_size, int64_t num_slots) const = 0;
  // A cache for `sequences` sequences of up to `tokens` tokens each.
  ModelCache cache_for(int64_t tokens, int64_t sequences = 1) const;
  // Runs the batch and advances each sequence's cache once. Returns logits f32 [rows, vocab]: every
  // position of sequences with all_logits, else their last position, in sequence order.
  virtual Tensor forward(const Batch& batch, ModelCache& cache,
                         const std::function<void(const std::string&, const Tensor&)>& dump = {}) = 0;
};

class Model final : public Runner {
 public:
  // With a communicator of size N > 1 the model is rank communicator->rank() of a tensor-parallel
  // group: it loads only its slice of the weights (parallel/sharding.h), its caches hold its heads,
  // and every row-parallel output is summed over the group before the residual add. Every rank runs
  // the same batches in the same order and gets the same logits.
  Model(const Checkpoint& checkpoint, Ops& ops, parallel::Communicator* communicator = nullptr);
  const io::TextConfig& config() const override { return config_; }
  const parallel::ShardPlan& shard() const { return shard_; }
  CacheShape cache_shape() const override;  // this rank's: its KV heads and GDN heads
  Ops& ops() const override { return ops_; }
  ModelCache make_cache(int64_t num_blocks, int32_t block_size, int64_t num_slots) const override;

  // Runs the batch and advances each sequence's cache. Returns logits f32 [rows, vocab]: every
  // position of sequences with all_logits, else their last position, in sequence order.
  // `dump`, when set, receives every named intermediate (layers.{i}.*, norm, logits).
  Tensor forward(const Batch& batch, ModelCache& cache,
                 const std::function<void(const std::string&, const Tensor&)>& dump = {}) override;

 private:
  Tensor run(const Batch& batch, const std::vector<int32_t>& tokens, layers::ForwardContext& ctx,
             const std::function<void(const std::string&, const Tensor&)>& dump);

  // The partial sums of a row-parallel block's output, summed over the ranks.
  void reduce(Tensor& partial) const;

  io::TextConfig config_;
  Ops& ops_;
  parallel::Communicator* communicator_;
  parallel::ShardPlan shard_;  // shard_.local: the layer shapes this rank holds
  Weight embed_tokens, lm_head;  // lm_head is embed_tokens when tied (dequantized rows / packed head alike)
  Tensor final_norm;
  std::vector<DecoderLayer> layers_;
};

}  // namespace qinfer::models
