#pragma once
// The model's caches: paged KV blocks for full-attention layers (one pool per layer, shared block
// ids across layers) and recurrent-state slots for Gated DeltaNet layers (conv window + fp32 delta
// state) that can be zeroed, snapshotted and restored. Which sequence holds which blocks and slot is
// the engine's block manager's to say (engine/block_manager.h); callers that run fixed sequences
// without one take equal shares (ModelCache::sequence).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/ops.h"

namespace qinfer {

struct CacheShape {
  int64_t attention_layers = 0, kv_heads = 0, head_dim = 0;
  int64_t linear_layers = 0, conv_channels = 0, conv_window = 0;  // conv_window = kernel - 1
  int64_t value_heads = 0, value_head_dim = 0, key_head_dim = 0;
  DType kv_dtype = DType::f32;  // the KV pools' elements (Ops::kv_dtype of the backend holding them)
};

struct SequenceCache;

class ModelCache {
 public:
  ModelCache(Ops& ops, const CacheShape& shape, int64_t num_blocks, int32_t block_size, int64_t num_slots);
  // A tensor-parallel group's cache: rank r's pools and states (`shape`: one rank's heads) on
  // ranks[r]. This object is rank 0's: an id names the same rows on every rank, and a slot is zeroed
  // and a snapshot taken and restored on every rank through it.
  ModelCache(std::span<Ops* const> ranks, const CacheShape& shape, int64_t num_blocks, int32_t block_size,
             int64_t num_slots);

  int ranks() const { return 1 + static_cast<int>(shards_.size()); }
  // The cache rank r's model runs on (rank(0) is this one). Only its pools and states are used: its
  // own blocks and slots are never assigned, sequences carry this cache's.
  ModelCache& rank(int r) { return r == 0 ? *this : *shards_.at(static_cast<size_t>(r - 1)); }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_slots() const { return num_slots_; }

  const CacheShape& shape() const { return shape_; }
  Ops& ops() const { return *ops_; }  // the backend holding this rank's pools and states
  // Rows in other processes too (set_mirror): what only a snapshot reaches.
  bool mirrored() const { return mirror_ != nullptr; }
  // Distinct for every cache made in this process: a recorded step (Ops::begin_step) is bound to
  // the pools and states of one cache.
  uint64_t id() const { return id_; }
  int32_t block_size() const { return block_size_; }
  KvPool& kv(int64_t attention_layer) { return kv_.at(attention_layer); }
  Tensor& conv_state(int64_t linear_layer) { return conv_.at(linear_layer); }
  Tensor& delta_state(int64_t linear_layer) { return delta_.at(linear_layer); }

  // Sequence `index` of a cache made for equal sequences (Runner::cache_for): blocks [index·n,
  // (index+1)·n) for n = blocks / slots, and slot `index`, nothing cached. A new cache's state is zero.
  SequenceCache sequence(int64_t index) const;
  // Zeroes a slot's recurrent state in every linear-attention layer of every rank (and of the
  // mirror's processes): a sequence that starts in a slot another one used.
  void zero_slot(int32_t slot);
  // Copies slot `from`'s recurrent state into slot `to` (a fork of a sequence), on each rank's device;
  // the mirror's processes through a snapshot.
  void copy_slot(int32_t from, int32_t to);

  // A copy of one slot's recurrent state in every linear-attention layer of every rank.
  struct StateSnapshot {
    std::vector<std::vector<float>> conv, delta;
  };
  StateSnapshot snapshot(int32_t slot) const;
  void restore(int32_t slot, const StateSnapshot& snapshot);

  // The same cache's rows in other processes (a tensor-parallel group over processes whose process 0
  // runs the engine: models/tensor_parallel.h). Blocks and slots are assigned by this process; slots are
  // zeroed there too, and snapshots hold the other processes' ranks after this one's.
  class Mirror {
   public:
    virtual ~Mirror() = default;
    virtual int ranks() const = 0;  // ranks in the other processes
    virtual void zero_slot(int32_t slot) = 0;
    // Appends the other processes' layers of `slot` to `s`, in rank order.
    virtual void snapshot(int32_t slot, StateSnapshot& s) = 0;
    // Restores the other processes' part of `s` (from rank `first_rank` of it on) into `slot`.
    virtual void restore(int32_t slot, const StateSnapshot& s, int first_rank) = 0;
  };
  void set_mirror(std::unique_ptr<Mirror> mirror) { mirror_ = std::move(mirror); }

 private:
  Ops* ops_;  // the backend holding the pools and states
  uint64_t id_;
  CacheShape shape_;
  int32_t block_size_;
  int64_t num_blocks_, num_slots_;
  std::vector<KvPool> kv_;
  std::vector<Tensor> conv_, delta_;
  std::vector<std::unique_ptr<ModelCache>> shards_;  // ranks 1..N-1
  std::unique_ptr<Mirror> mirror_;
};

// One sequence's view of the cache: its blocks, how many tokens are cached, its state slot.
struct SequenceCache {
  std::vector<int32_t> blocks;
  int32_t cached = 0;
  int32_t slot = -1;
};

// Throws unless `s` has blocks for `new_tokens` more tokens and, for a model with recurrent state, a
// slot of `cache`, and `state_to` and `snapshot_to` (slots to write its state to) are -1 or slots of
// it (a forward writes only where it was given room).
void check_room(const ModelCache& cache, const SequenceCache& s, int64_t new_tokens, int32_t state_to = -1,
                int32_t snapshot_to = -1);

}  // namespace qinfer
