#include "engine/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace qinfer::engine {

BlockManager::BlockManager(int64_t num_blocks, int32_t block_size, int64_t num_slots, bool prefix_caching,
                           int64_t num_checkpoints)
    : block_size_(block_size),
      num_slots_(num_slots),
      prefix_caching_(prefix_caching && (num_slots == 0 || num_checkpoints > 0)),
      num_checkpoints_(prefix_caching_ && num_slots > 0 ? num_checkpoints : 0) {
  QINFER_CHECK(num_blocks > 0 && block_size > 0 && num_slots >= 0 && num_checkpoints >= 0,
               "block manager: {} blocks of {} tokens, {} slots and {} checkpoints (blocks and block size must be "
               "positive)",
               num_blocks, block_size, num_slots, num_checkpoints);
  refcount_.assign(static_cast<size_t>(num_blocks), 0);
  parent_.assign(static_cast<size_t>(num_blocks), kNotCached);
  children_.assign(static_cast<size_t>(num_blocks), 0);
  run_.resize(static_cast<size_t>(num_blocks));
  last_used_.assign(static_cast<size_t>(num_blocks), 0);
  // Popped from the back: low ids first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
  for (int64_t s = num_slots - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
  checkpoint_.assign(static_cast<size_t>(num_blocks), -1);
  checkpoint_used_.assign(static_cast<size_t>(num_blocks), 0);
  for (int64_t c = num_checkpoints_ - 1; c >= 0; --c) free_checkpoints_.push_back(static_cast<int32_t>(num_slots + c));
}

int64_t BlockManager::blocks_needed(const SequenceCache& cache, int64_t tokens) const {
  return std::max<int64_t>(0, blocks_for(tokens) - static_cast<int64_t>(cache.blocks.size()));
}

int32_t BlockManager::take_block() {
  if (!free_blocks_.empty()) {
    const int32_t b = free_blocks_.back();
    free_blocks_.pop_back();
    return b;
  }
  // The least recently used cached leaf no sequence holds (free_blocks() counted it).
  QINFER_CHECK(!evictable_.empty(), "block manager: no free block (the free count was wrong)");
  const int32_t b = evictable_.begin()->second;
  unlink(b);
  --idle_cached_;
  ++evictions_;
  return b;
}

// Takes an unheld cached leaf out of the tree; its parent may become an evictable leaf.
void BlockManager::unlink(int32_t block) {
  const size_t i = static_cast<size_t>(block);
  evictable_.erase({last_used_[i], block});
  const uint64_t key = run_hash(parent_[i], run_[i].data());
  for (auto [it, end] = nodes_.equal_range(key); it != end; ++it) {
    if (it->second == block) {
      nodes_.erase(it);
      break;
    }
  }
  detach_checkpoint(block);
  const int32_t parent = parent_[i];
  parent_[i] = kNotCached;
  run_[i].clear();
  --cached_;
  if (parent == kRoot) return;
  const size_t p = static_cast<size_t>(parent);
  if (--children_[p] == 0 && refcount_[p] == 0) evictable_.insert({last_used_[p], parent});
}

// A cached block no sequence holds any more: evictable once it is a leaf.
void BlockManager::make_idle(int32_t block) {
  ++idle_cached_;
  if (children_[static_cast<size_t>(block)] == 0) evictable_.insert({last_used_[static_cast<size_t>(block)], block});
}

bool BlockManager::hold(SequenceCache& cache, int64_t tokens) {
  QINFER_CHECK(can_hold(cache, tokens),
               "KV cache exhausted: {} more blocks of {} tokens wanted, {} of {} free ({} of {} state slots free)",
               blocks_needed(cache, tokens), block_size_, free_blocks(), total_blocks(), free_slots(), num_slots_);
  for (int64_t n = blocks_needed(cache, tokens); n > 0; --n) {
    const int32_t b = take_block();
    refcount_[static_cast<size_t>(b)] = 1;
    cache.blocks.push_back(b);
  }
  return take_slot(cache);
}

bool BlockManager::take_slot(SequenceCache& cache) {
  if (cache.slot >= 0 || num_slots_ == 0) return false;
  QINFER_CHECK(!free_slots_.empty(), "block manager: no free state slot ({} of {} held)", used_slots(), num_slots_);
  cache.slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

void BlockManager::release(SequenceCache& cache) {
  for (int32_t b : cache.blocks) {
    QINFER_CHECK(b >= 0 && b < total_blocks() && refcount_[static_cast<size_t>(b)] > 0,
                 "block manager: release of block {} that is not held", b);
    if (--refcount_[static_cast<size_t>(b)] > 0) continue;
    if (in_cache(b)) make_idle(b);
    else free_blocks_.push_back(b);
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

uint64_t BlockManager::run_hash(int32_t parent, const int32_t* run) const {
  // FNV-1a over the parent's id and the run; equal keys are told apart by comparing the runs.
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) h = (h ^ ((v >> (8 * k)) & 0xFFu)) * 1099511628211ull;
  };
  mix(static_cast<uint32_t>(parent));
  for (int32_t i = 0; i < block_size_; ++i) mix(static_cast<uint32_t>(run[i]));
  return h;
}

int32_t BlockManager::find_child(int32_t parent, const int32_t* run) const {
  for (auto [it, end] = nodes_.equal_range(run_hash(parent, run)); it != end; ++it) {
    const size_t b = static_cast<size_t>(it->second);
    if (parent_[b] == parent && std::equal(run_[b].begin(), run_[b].end(), run)) return it->second;
  }
  return kNotCached;
}

void BlockManager::reference(int32_t block) {
  const size_t j = static_cast<size_t>(block);
  if (refcount_[j]++ == 0) {
    --idle_cached_;
    evictable_.erase({last_used_[j], block});
  }
  last_used_[j] = ++clock_;
}

BlockManager::Match BlockManager::match(const std::vector<int32_t>& tokens, int64_t max_blocks) {
  Match m;
  if (!prefix_caching_) return m;
  const int64_t whole = static_cast<int64_t>(tokens.size()) / block_size_;
  // The path as far as it goes; a model with state reuses it up to its deepest checkpoint.
  std::vector<int32_t> path;
  int64_t usable = 0;
  for (int32_t parent = kRoot; static_cast<int64_t>(path.size()) < whole;) {
    const int32_t b = find_child(parent, tokens.data() + static_cast<int64_t>(path.size()) * block_size_);
    if (b == kNotCached) break;
    path.push_back(b);
    parent = b;
    if (static_cast<int64_t>(path.size()) <= max_blocks && (num_slots_ == 0 || checkpoint_[static_cast<size_t>(b)] >= 0))
      usable = static_cast<int64_t>(path.size());
  }
  m.path_blocks = static_cast<int64_t>(path.size());
  for (int64_t i = 0; i < usable; ++i) {
    reference(path[static_cast<size_t>(i)]);
    m.blocks.push_back(path[static_cast<size_t>(i)]);
  }
  if (num_slots_ > 0 && usable > 0) {
    const int32_t b = m.blocks.back();
    const size_t j = static_cast<size_t>(b);
    m.checkpoint = checkpoint_[j];
    checkpoint_lru_.erase({checkpoint_used_[j], b});
    checkpoint_used_[j] = ++clock_;
    checkpoint_lru_.insert({checkpoint_used_[j], b});
  }
  return m;
}

void BlockManager::publish(SequenceCache& cache, const std::vector<int32_t>& tokens, int32_t from_token) {
  if (!prefix_caching_) return;
  const int64_t whole = std::min<int64_t>(cache.cached / block_size_, static_cast<int64_t>(cache.blocks.size()));
  for (int64_t i = from_token / block_size_; i < whole; ++i) {
    const int32_t b = cache.blocks[static_cast<size_t>(i)];
    const size_t j = static_cast<size_t>(b);
    const int32_t parent = i == 0 ? kRoot : cache.blocks[static_cast<size_t>(i - 1)];
    if (in_cache(b)) {
      last_used_[j] = ++clock_;
      continue;
    }
    // The path to here is cached (every earlier block was published or swapped).
    if (parent != kRoot && !in_cache(parent)) return;
    const int32_t* run = tokens.data() + i * block_size_;
    if (const int32_t cached = find_child(parent, run); cached != kNotCached) {
      // Computed twice (two sequences prefilled it at once, or one recomputed it after a checkpoint):
      // keep the cached block, so the path goes on under it.
      reference(cached);
      cache.blocks[static_cast<size_t>(i)] = cached;
      if (--refcount_[j] == 0) free_blocks_.push_back(b);
      continue;
    }
    parent_[j] = parent;
    run_[j].assign(run, run + block_size_);
    last_used_[j] = ++clock_;
    nodes_.emplace(run_hash(parent, run), b);
    if (parent != kRoot) ++children_[static_cast<size_t>(parent)];
    ++cached_;
  }
}

int32_t BlockManager::take_checkpoint(bool rolling) {
  if (num_checkpoints_ == 0 || (rolling && 2 * (rolling_ + 1) > num_checkpoints_)) return -1;
  int32_t c = -1;
  if (!free_checkpoints_.empty()) {
    c = free_checkpoints_.back();
    free_checkpoints_.pop_back();
  } else if (!checkpoint_lru_.empty()) {
    const int32_t block = checkpoint_lru_.begin()->second;
    c = checkpoint_[static_cast<size_t>(block)];
    detach_checkpoint(block);
    free_checkpoints_.pop_back();  // detach gave it back
    ++checkpoint_evictions_;
  } else {
    return -1;  // every checkpoint is a running sequence's, being written
  }
  rolling_ += rolling;
  return c;
}

void BlockManager::attach_checkpoint(const SequenceCache& cache, int64_t blocks, int32_t checkpoint, bool rolling) {
  QINFER_CHECK(blocks > 0 && blocks <= static_cast<int64_t>(cache.blocks.size()) && checkpoint >= 0 &&
                   checkpoint < num_slots_ + num_checkpoints_,
               "block manager: checkpoint {} after {} blocks of a sequence holding {}", checkpoint, blocks,
               cache.blocks.size());
  rolling_ -= rolling;
  const int32_t b = cache.blocks[static_cast<size_t>(blocks - 1)];
  const size_t j = static_cast<size_t>(b);
  if (!in_cache(b) || checkpoint_[j] >= 0) {
    free_checkpoints_.push_back(checkpoint);
    return;
  }
  checkpoint_[j] = checkpoint;
  checkpoint_used_[j] = ++clock_;
  checkpoint_lru_.insert({checkpoint_used_[j], b});
  ++attached_;
}

void BlockManager::drop_checkpoint(int32_t checkpoint, bool rolling) {
  rolling_ -= rolling;
  free_checkpoints_.push_back(checkpoint);
}

void BlockManager::detach_checkpoint(int32_t block) {
  const size_t j = static_cast<size_t>(block);
  if (checkpoint_[j] < 0) return;
  checkpoint_lru_.erase({checkpoint_used_[j], block});
  free_checkpoints_.push_back(checkpoint_[j]);
  checkpoint_[j] = -1;
  --attached_;
}

}  // namespace qinfer::engine
