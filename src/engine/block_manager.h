#pragma once
// Who holds which KV blocks and recurrent-state slots. Pure accounting over the ids of a ModelCache's
// pools (the engine's model runner owns the memory): allocation, reference counts so that choices of
// one request share their prompt's whole blocks, and release. No device work happens here: a fresh
// slot's zeroing and a fork's state copy are the caller's to schedule.
#include <cstdint>
#include <vector>

#include "cache/cache.h"

namespace qinfer::engine {

class BlockManager {
 public:
  // `num_slots` 0: the model keeps no recurrent state, and sequences get no slot.
  BlockManager(int64_t num_blocks, int32_t block_size, int64_t num_slots);

  int32_t block_size() const { return block_size_; }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  int64_t total_blocks() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  int64_t used_blocks() const { return total_blocks() - free_blocks(); }
  int64_t total_slots() const { return num_slots_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_slots_.size()); }
  int64_t used_slots() const { return total_slots() - free_slots(); }
  int32_t refcount(int32_t block) const { return refcount_.at(static_cast<size_t>(block)); }

  // New blocks `cache` needs to hold `tokens` tokens in all.
  int64_t blocks_needed(const SequenceCache& cache, int64_t tokens) const;
  bool can_hold(const SequenceCache& cache, int64_t tokens) const {
    return blocks_needed(cache, tokens) <= free_blocks() && (cache.slot >= 0 || num_slots_ == 0 || free_slots() > 0);
  }
  // Gives `cache` room for `tokens` tokens in all (and a slot, if the model has state and it has none).
  // Returns true when it got a new slot, whose state must be zeroed before the sequence runs. Throws
  // when the pool cannot (check can_hold first): nothing is taken then.
  bool hold(SequenceCache& cache, int64_t tokens);
  // Returns every block (one reference each) and the slot; `cache` is empty afterwards.
  void release(SequenceCache& cache);
  // A branch of `parent` that shares its first `shared` tokens' whole blocks (a reference each) and
  // gets a slot of its own (the caller copies the parent's state into it). `shared` must be a
  // multiple of the block size: a partial block would be written by both.
  SequenceCache fork(const SequenceCache& parent, int32_t shared);

 private:
  int32_t block_size_;
  int64_t num_slots_;
  std::vector<int32_t> refcount_, free_blocks_, free_slots_;
};

}  // namespace qinfer::engine
