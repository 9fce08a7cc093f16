#include "engine/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace qinfer::engine {

BlockManager::BlockManager(int64_t num_blocks, int32_t block_size, int64_t num_slots)
    : block_size_(block_size), num_slots_(num_slots) {
  QINFER_CHECK(num_blocks > 0 && block_size > 0 && num_slots >= 0,
               "block manager: {} blocks of {} tokens and {} slots (blocks and block size must be positive)",
               num_blocks, block_size, num_slots);
  refcount_.assign(static_cast<size_t>(num_blocks), 0);
  // Popped from the back: low ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
  for (int64_t s = num_slots - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
}

int64_t BlockManager::blocks_needed(const SequenceCache& cache, int64_t tokens) const {
  return std::max<int64_t>(0, blocks_for(tokens) - static_cast<int64_t>(cache.blocks.size()));
}

bool BlockManager::hold(SequenceCache& cache, int64_t tokens) {
  QINFER_CHECK(can_hold(cache, tokens),
               "KV cache exhausted: {} more blocks of {} tokens wanted, {} of {} free ({} of {} state slots free)",
               blocks_needed(cache, tokens), block_size_, free_blocks(), total_blocks(), free_slots(), num_slots_);
  for (int64_t n = blocks_needed(cache, tokens); n > 0; --n) {
    const int32_t b = free_blocks_.back();
    free_blocks_.pop_back();
    refcount_[static_cast<size_t>(b)] = 1;
    cache.blocks.push_back(b);
  }
  if (cache.slot >= 0 || num_slots_ == 0) return false;
  cache.slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

void BlockManager::release(SequenceCache& cache) {
  for (int32_t b : cache.blocks) {
    QINFER_CHECK(b >= 0 && b < total_blocks() && refcount_[static_cast<size_t>(b)] > 0,
                 "block manager: release of block {} that is not held", b);
    if (--refcount_[static_cast<size_t>(b)] == 0) free_blocks_.push_back(b);
  }
  if (cache.slot >= 0) free_slots_.push_back(cache.slot);
  cache = SequenceCache{};
}

SequenceCache BlockManager::fork(const SequenceCache& parent, int32_t shared) {
  QINFER_CHECK(shared % block_size_ == 0 && shared <= parent.cached,
               "block manager: a fork shares whole cached blocks ({} tokens, blocks of {}, {} cached)", shared,
               block_size_, parent.cached);
  QINFER_CHECK(num_slots_ == 0 || free_slots() > 0, "block manager: no free state slot for a fork");
  SequenceCache branch;
  branch.blocks.assign(parent.blocks.begin(), parent.blocks.begin() + shared / block_size_);
  for (int32_t b : branch.blocks) ++refcount_[static_cast<size_t>(b)];
  branch.cached = shared;
  if (num_slots_ > 0) {
    branch.slot = free_slots_.back();
    free_slots_.pop_back();
  }
  return branch;
}

}  // namespace qinfer::engine
