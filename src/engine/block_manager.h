#pragma once
// Who holds which KV blocks and recurrent-state slots. Pure accounting over the ids of a ModelCache's
// pools (the engine's model runner owns the memory): allocation, reference counts so that choices of
// one request share their prompt's whole blocks, and release. No device work happens here: a fresh
// slot's zeroing and a fork's state copy are the caller's to schedule.
//
// The prefix cache: whole blocks of computed tokens stay behind when their sequences let go, as nodes
// of a tree whose edges are block-sized runs of token ids (a node's key is its run and its parent's
// node, so a path from the root spells a prefix). A new sequence takes the longest cached path its
// tokens spell, sharing those blocks by reference count. Unreferenced cached blocks count as free;
// when the free list runs dry the least recently used leaf is evicted.
//
// Models with recurrent state (Gated DeltaNet) need the state at the end of a reused prefix as well
// as its KV blocks: a checkpoint, a slot holding one sequence's state as it was after some node's
// block. Slots are alike: the sequences' pool (`num_slots`) and the checkpoints' (`num_checkpoints`)
// count them, and a sequence may trade its slot for a checkpoint's (a step that writes its state
// into its rolling slot leaves the one it read behind). The checkpoints are attached to nodes as the
// scheduler saves them; a match then ends at the deepest node of the path with a checkpoint, which
// the new sequence's slot starts from. Checkpoints go with their block's eviction, and the least
// recently used one goes first when the pool is dry. Without checkpoints such a model caches nothing.
//
// The host tier (off unless given room): an evicted block, and a checkpoint evicted alone or with its
// block, is copied into host memory instead of forgotten, keyed by a hash of the whole path it ends
// (so a copy stands for the same tokens wherever it lies). A match that runs out of device nodes goes
// on through host copies: each is copied back into a device block and becomes a node again, and a
// checkpoint found only on the host is copied back into a checkpoint slot; the copies stay, so what
// bounces between the tiers is saved once. The copies are work the caller runs in order
// (take_work), before the next forward.
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/cache.h"

namespace qinfer::engine {

// Cache work for the model runner, in the order it was recorded: slots to zero (state, from -1) or
// copy (state), and the host tier's copies (ids: device block or slot, host block or checkpoint).
struct CacheWork {
  enum class Kind : uint8_t { state, save_block, load_block, save_state, load_state };
  int32_t from = -1, to = -1;
  Kind kind = Kind::state;
  bool operator==(const CacheWork&) const = default;
};

class BlockManager {
 public:
  // `num_slots` 0: the model keeps no recurrent state, and sequences get no slot. `prefix_caching`:
  // keep computed blocks for later sequences (for a model with state, only with checkpoints: ids
  // num_slots .. num_slots + num_checkpoints - 1 at first; slots 0 .. num_slots - 1 the sequences').
  // `host_blocks` / `host_checkpoints`: the host tier's room (0: none; only with a prefix cache).
  BlockManager(int64_t num_blocks, int32_t block_size, int64_t num_slots, bool prefix_caching = false,
               int64_t num_checkpoints = 0, int64_t host_blocks = 0, int64_t host_checkpoints = 0);

  int32_t block_size() const { return block_size_; }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  int64_t total_blocks() const { return static_cast<int64_t>(refcount_.size()); }
  // Free: never used or released, and cached blocks no sequence holds (evicted when taken).
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()) + idle_cached_; }
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
  // Gives `cache` a slot if it has none (a model with state); true when it got one.
  bool take_slot(SequenceCache& cache);
  // Returns every block (one reference each) and the slot; `cache` is empty afterwards.
  void release(SequenceCache& cache);
  // A branch of `parent` that shares its first `shared` tokens' whole blocks (a reference each) and
  // gets a slot of its own (the caller copies the parent's state into it). `shared` must be a
  // multiple of the block size: a partial block would be written by both.
  SequenceCache fork(const SequenceCache& parent, int32_t shared);

  bool prefix_caching() const { return prefix_caching_; }
  // A sequence's start from the prefix cache.
  struct Match {
    std::vector<int32_t> blocks;  // reused, a reference each taken
    int32_t checkpoint = -1;      // models with state: the slot holding the state after `blocks`
    int64_t path_blocks = 0;      // blocks of the cached path the tokens spell (≥ blocks.size())
  };
  // The longest cached path that `tokens` spell, at most `max_blocks` blocks of it, and for a model
  // with state only up to its deepest checkpoint (nothing without a prefix cache).
  Match match(const std::vector<int32_t>& tokens, int64_t max_blocks);
  // Adds the whole blocks of `cache` among its first cache.cached tokens, from block `from_token` /
  // block size on, to the prefix cache (`tokens`: the sequence's ids). A block whose run another
  // block already caches under the same path is swapped for that one (its reference moves there,
  // and the sequence's own copy is freed): both hold the same tokens' keys and values.
  void publish(SequenceCache& cache, const std::vector<int32_t>& tokens, int32_t from_token);
  int64_t cached_blocks() const { return cached_; }  // in the prefix cache, held or not
  int64_t evictions() const { return evictions_; }

  // Checkpoints (models with state). A slot to save a state into, taken from the free ones or from
  // the least recently used attached checkpoint; -1 when there is none (`rolling`: one a running
  // sequence keeps overwriting, which may take at most half the pool).
  int32_t take_checkpoint(bool rolling);
  // Attaches a taken checkpoint holding the state after cache's first `blocks` blocks to the node of
  // its last one; one that cannot be (the block is not cached, or has a checkpoint) goes back.
  void attach_checkpoint(const SequenceCache& cache, int64_t blocks, int32_t checkpoint, bool rolling);
  void drop_checkpoint(int32_t checkpoint, bool rolling);
  int64_t total_checkpoints() const { return num_checkpoints_; }
  int64_t attached_checkpoints() const { return attached_; }
  int64_t checkpoint_evictions() const { return checkpoint_evictions_; }

  // Work recorded for the caller: its own (add_work: a fresh slot's zeroing, a fork's copy) and the
  // host tier's copies, in order.
  void add_work(CacheWork work) { work_.push_back(work); }
  std::vector<CacheWork> take_work() { return std::exchange(work_, {}); }

  // The host tier: its room, what it holds, and what came back from it.
  int64_t total_host_blocks() const { return num_host_blocks_; }
  int64_t total_host_checkpoints() const { return num_host_checkpoints_; }
  int64_t host_blocks() const { return static_cast<int64_t>(host_blocks_.size()); }
  int64_t host_checkpoints() const { return static_cast<int64_t>(host_checkpoints_.size()); }
  int64_t host_loaded_blocks() const { return host_loaded_blocks_; }
  int64_t host_loaded_checkpoints() const { return host_loaded_checkpoints_; }

 private:
  int32_t take_block();
  void unlink(int32_t block);
  void make_idle(int32_t block);
  void detach_checkpoint(int32_t block);
  void reference(int32_t block);
  bool in_cache(int32_t block) const { return parent_[static_cast<size_t>(block)] != kNotCached; }
  uint64_t run_hash(int32_t parent, const int32_t* run) const;
  int32_t find_child(int32_t parent, const int32_t* run) const;
  // The key of the path a block's node ends: its parent's (kRootKey at the root) mixed with its run.
  uint64_t path_key(uint64_t parent_key, const int32_t* run) const;
  uint64_t key_of(int32_t parent) const { return parent == kRoot ? kRootKey : key_[static_cast<size_t>(parent)]; }
  // The host tier: a cached block's KV (and its checkpoint) copied out before the block is reused;
  // a checkpoint's state copied out before its slot is.
  void spill_block(int32_t block);
  void spill_checkpoint(uint64_t key, int32_t checkpoint);
  int32_t take_host_block();
  int32_t take_host_checkpoint();

  static constexpr int32_t kNotCached = -2, kRoot = -1;
  static constexpr uint64_t kRootKey = 0x9E3779B97F4A7C15ull;
  int32_t block_size_;
  int64_t num_slots_;
  bool prefix_caching_;
  std::vector<int32_t> refcount_, free_blocks_, free_slots_;
  // The prefix cache, per block: its parent node (kRoot, or kNotCached), its run of ids, how many
  // cached children it has, when it was last matched or published.
  std::vector<int32_t> parent_, children_;
  std::vector<std::vector<int32_t>> run_;
  std::vector<uint64_t> last_used_;
  std::vector<uint64_t> key_;  // path_key of each cached block's node
  std::unordered_multimap<uint64_t, int32_t> nodes_;  // run_hash(parent, run) -> block
  std::set<std::pair<uint64_t, int32_t>> evictable_;  // (last used, block): unheld cached leaves
  int64_t idle_cached_ = 0, cached_ = 0, evictions_ = 0;
  uint64_t clock_ = 0;
  // Checkpoints: per block, the one attached (-1: none) and when it was last attached or matched;
  // the free ones; (last used, block) of every attached one, the least recently used first.
  int64_t num_checkpoints_;
  std::vector<int32_t> checkpoint_, free_checkpoints_;
  std::vector<uint64_t> checkpoint_used_;
  std::set<std::pair<uint64_t, int32_t>> checkpoint_lru_;
  int64_t attached_ = 0, rolling_ = 0, checkpoint_evictions_ = 0;
  std::vector<CacheWork> work_;
  // The host tier, by path key: copies of blocks (with the parent's key and the run, which a match
  // checks) and of checkpoints, each in a host slot; (last used, key), the least recently used first.
  struct HostBlock {
    uint64_t parent_key = 0;
    std::vector<int32_t> run;
    int32_t slot = -1;
    uint64_t used = 0;
  };
  struct HostCheckpoint {
    int32_t slot = -1;
    uint64_t used = 0;
  };
  int64_t num_host_blocks_, num_host_checkpoints_;
  std::unordered_map<uint64_t, HostBlock> host_blocks_;
  std::unordered_map<uint64_t, HostCheckpoint> host_checkpoints_;
  std::set<std::pair<uint64_t, uint64_t>> host_block_lru_, host_checkpoint_lru_;
  std::vector<int32_t> free_host_blocks_, free_host_checkpoints_;
  int64_t host_loaded_blocks_ = 0, host_loaded_checkpoints_ = 0;
};

}  // namespace qinfer::engine
