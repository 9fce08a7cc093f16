#include "engine/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace qinfer::engine {

BlockManager::BlockManager(int64_t num_blocks, int32_t block_size, int64_t num_slots, bool prefix_caching,
                           int64_t num_checkpoints, int64_t host_blocks, int64_t host_checkpoints)
    : block_size_(block_size),
      num_slots_(num_slots),
      prefix_caching_(prefix_caching && (num_slots == 0 || num_checkpoints > 0)),
      num_checkpoints_(prefix_caching_ && num_slots > 0 ? num_checkpoints : 0),
      num_host_blocks_(prefix_caching_ ? host_blocks : 0),
      num_host_checkpoints_(prefix_caching_ && num_slots > 0 ? host_checkpoints : 0) {
  QINFER_CHECK(host_blocks >= 0 && host_checkpoints >= 0 && host_blocks < (int64_t{1} << 31) &&
                   host_checkpoints < (int64_t{1} << 31),
               "block manager: {} host blocks and {} host checkpoints", host_blocks, host_checkpoints);
  QINFER_CHECK(num_blocks > 0 && block_size > 0 && num_slots >= 0 && num_checkpoints >= 0,
               "block manager: {} blocks of {} tokens, {} slots and {} checkpoints (blocks and block size must be "
               "positive)",
               num_blocks, block_size, num_slots, num_checkpoints);
  refcount_.assign(static_cast<size_t>(num_blocks), 0);
  parent_.assign(static_cast<size_t>(num_blocks), kNotCached);
  children_.assign(static_cast<size_t>(num_blocks), 0);
  run_.resize(static_cast<size_t>(num_blocks));
  last_used_.assign(static_cast<size_t>(num_blocks), 0);
  key_.assign(static_cast<size_t>(num_blocks), 0);
  for (int64_t h = num_host_blocks_ - 1; h >= 0; --h) free_host_blocks_.push_back(static_cast<int32_t>(h));
  for (int64_t h = num_host_checkpoints_ - 1; h >= 0; --h) free_host_checkpoints_.push_back(static_cast<int32_t>(h));
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
  if (num_host_blocks_ > 0) spill_block(b);
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
  // The path as far as it goes: device nodes, then (the host tier) copies of the blocks that were
  // evicted below the last of them. A model with state reuses it up to its deepest checkpoint, on
  // the device or the host.
  struct Step {
    int32_t block;  // kNotCached: a host copy
    uint64_t key;
  };
  std::vector<Step> path;
  int64_t usable = 0;
  auto checkpointed = [&](const Step& p) {
    return (p.block != kNotCached && checkpoint_[static_cast<size_t>(p.block)] >= 0) || host_checkpoints_.contains(p.key);
  };
  for (int32_t parent = kRoot; static_cast<int64_t>(path.size()) < whole;) {
    const int32_t* run = tokens.data() + static_cast<int64_t>(path.size()) * block_size_;
    const uint64_t parent_key = path.empty() ? kRootKey : path.back().key;
    int32_t b = parent == kNotCached ? kNotCached : find_child(parent, run);
    if (b != kNotCached) {
      path.push_back({b, key_[static_cast<size_t>(b)]});
    } else {
      const uint64_t key = path_key(parent_key, run);
      const auto it = host_blocks_.find(key);
      if (it == host_blocks_.end() || it->second.parent_key != parent_key ||
          !std::equal(it->second.run.begin(), it->second.run.end(), run))
        break;
      path.push_back({kNotCached, key});
    }
    parent = b;
    if (static_cast<int64_t>(path.size()) <= max_blocks && (num_slots_ == 0 || checkpointed(path.back())))
      usable = static_cast<int64_t>(path.size());
  }
  m.path_blocks = static_cast<int64_t>(path.size());
  // Copies come back into free blocks: as many as there are once the path's own idle blocks are held
  // (the sequence needs that many blocks anyway).
  auto too_many_copies = [&] {
    int64_t copies = 0, idle = 0;
    for (int64_t i = 0; i < usable; ++i) {
      const int32_t b = path[static_cast<size_t>(i)].block;
      if (b == kNotCached) ++copies;
      else idle += refcount_[static_cast<size_t>(b)] == 0;
    }
    return copies > free_blocks() - idle;
  };
  while (usable > 0 && too_many_copies()) {
    const int64_t before = usable;
    usable = 0;
    for (int64_t i = before - 1; i > 0 && usable == 0; --i)
      if (num_slots_ == 0 || checkpointed(path[static_cast<size_t>(i - 1)])) usable = i;
  }
  // A checkpoint only the host has comes back into a checkpoint slot; with none to take, the match
  // ends at the deepest checkpoint on the device.
  int32_t loaded_checkpoint = -1;
  if (num_slots_ > 0 && usable > 0) {
    const Step& last = path[static_cast<size_t>(usable - 1)];
    if (last.block == kNotCached || checkpoint_[static_cast<size_t>(last.block)] < 0) {
      HostCheckpoint& copy = host_checkpoints_.at(last.key);
      // Out of the LRU order while a slot is taken (which may spill into the tier): not pushed out.
      host_checkpoint_lru_.erase({copy.used, last.key});
      loaded_checkpoint = take_checkpoint(false);
      if (loaded_checkpoint < 0) {
        while (usable > 0 && (path[static_cast<size_t>(usable - 1)].block == kNotCached ||
                              checkpoint_[static_cast<size_t>(path[static_cast<size_t>(usable - 1)].block)] < 0))
          --usable;
      } else {
        add_work({copy.slot, loaded_checkpoint, CacheWork::Kind::load_state});
        ++host_loaded_checkpoints_;
      }
      copy.used = ++clock_;  // the copy stays: the checkpoint's next eviction needs no save
      host_checkpoint_lru_.insert({copy.used, last.key});
    }
  }
  // The host copies on the path leave the LRU order before any block is taken: taking one may evict
  // (and spill) another, which must not push out a copy this match is about to use. They stay in the
  // tier after: the blocks' next eviction needs no save.
  std::vector<uint64_t> protected_keys;
  for (int64_t i = 0; i < usable; ++i) {
    const Step& p = path[static_cast<size_t>(i)];
    if (p.block != kNotCached) continue;
    host_block_lru_.erase({host_blocks_.at(p.key).used, p.key});
    protected_keys.push_back(p.key);
  }
  for (int64_t i = 0; i < usable; ++i) {
    Step& p = path[static_cast<size_t>(i)];
    if (p.block == kNotCached) {
      // Back onto the device as a node under the previous one, held by this sequence.
      const HostBlock& copy = host_blocks_.at(p.key);
      const int32_t b = take_block();
      const size_t j = static_cast<size_t>(b);
      const int32_t parent = i == 0 ? kRoot : path[static_cast<size_t>(i - 1)].block;
      add_work({copy.slot, b, CacheWork::Kind::load_block});
      ++host_loaded_blocks_;
      parent_[j] = parent;
      run_[j] = copy.run;
      key_[j] = p.key;
      nodes_.emplace(run_hash(parent, run_[j].data()), b);
      if (parent != kRoot) ++children_[static_cast<size_t>(parent)];
      ++cached_;
      refcount_[j] = 1;
      last_used_[j] = ++clock_;
      p.block = b;
    } else {
      reference(p.block);
    }
    m.blocks.push_back(p.block);
  }
  for (const uint64_t key : protected_keys) {
    HostBlock& copy = host_blocks_.at(key);
    copy.used = ++clock_;
    host_block_lru_.insert({copy.used, key});
  }
  if (num_slots_ > 0 && usable > 0) {
    const int32_t b = m.blocks.back();
    const size_t j = static_cast<size_t>(b);
    if (loaded_checkpoint >= 0) {
      checkpoint_[j] = loaded_checkpoint;
      ++attached_;
    } else {
      checkpoint_lru_.erase({checkpoint_used_[j], b});
    }
    m.checkpoint = checkpoint_[j];
    checkpoint_used_[j] = ++clock_;
    checkpoint_lru_.insert({checkpoint_used_[j], b});
  }
  return m;
}

uint64_t BlockManager::path_key(uint64_t parent_key, const int32_t* run) const {
  // splitmix64 steps over the parent's key and the run: a path's key, whatever block holds it.
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(parent_key);
  for (int32_t i = 0; i < block_size_; ++i) h = mix(h + 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(run[i]));
  return h;
}

namespace {
// A host slot: a free one, or the least recently used copy's (which is forgotten).
template <typename Copies>
int32_t take_host_slot(std::vector<int32_t>& free, std::set<std::pair<uint64_t, uint64_t>>& lru, Copies& copies) {
  if (!free.empty()) {
    const int32_t h = free.back();
    free.pop_back();
    return h;
  }
  const uint64_t key = lru.begin()->second;
  lru.erase(lru.begin());
  const auto it = copies.find(key);
  const int32_t h = it->second.slot;
  copies.erase(it);
  return h;
}
}  // namespace

int32_t BlockManager::take_host_block() { return take_host_slot(free_host_blocks_, host_block_lru_, host_blocks_); }

int32_t BlockManager::take_host_checkpoint() {
  return take_host_slot(free_host_checkpoints_, host_checkpoint_lru_, host_checkpoints_);
}

// A path's contents are the same wherever they lie: a block or checkpoint that came back from the
// tier (its copy stayed there) goes out again with no save.
void BlockManager::spill_block(int32_t block) {
  const size_t j = static_cast<size_t>(block);
  const uint64_t key = key_[j];
  auto it = host_blocks_.find(key);
  if (it == host_blocks_.end()) {
    it = host_blocks_.emplace(key, HostBlock{key_of(parent_[j]), run_[j], take_host_block(), 0}).first;
    add_work({block, it->second.slot, CacheWork::Kind::save_block});
  } else {
    host_block_lru_.erase({it->second.used, key});
  }
  it->second.used = ++clock_;
  host_block_lru_.insert({it->second.used, key});
  if (checkpoint_[j] >= 0 && num_host_checkpoints_ > 0) spill_checkpoint(key, checkpoint_[j]);
}

void BlockManager::spill_checkpoint(uint64_t key, int32_t checkpoint) {
  auto it = host_checkpoints_.find(key);
  if (it == host_checkpoints_.end()) {
    it = host_checkpoints_.emplace(key, HostCheckpoint{take_host_checkpoint(), 0}).first;
    add_work({checkpoint, it->second.slot, CacheWork::Kind::save_state});
  } else {
    host_checkpoint_lru_.erase({it->second.used, key});
  }
  it->second.used = ++clock_;
  host_checkpoint_lru_.insert({it->second.used, key});
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
    key_[j] = path_key(key_of(parent), run);
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
    if (num_host_checkpoints_ > 0) spill_checkpoint(key_[static_cast<size_t>(block)], c);
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
