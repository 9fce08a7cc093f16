#pragma once
// The prefix cache's host tier: copies of KV blocks and of recurrent-state checkpoints in host
// memory (pinned where the cache is on a device), for every rank of a ModelCache. Which block or
// checkpoint goes where is the block manager's to say; this only moves the bytes.
#include <cstdint>
#include <utility>
#include <vector>

#include "cache/cache.h"

namespace qinfer {

class HostTier {
 public:
  // Room for `blocks` KV blocks and `checkpoints` states of `cache` (a cache with rows in other
  // processes cannot have one: those rows are not reachable from here).
  HostTier(ModelCache& cache, int64_t blocks, int64_t checkpoints);

  // One batch of copies, run in the order they were added by run().
  void save_block(int32_t block, int32_t host);   // device block → host block
  void load_block(int32_t host, int32_t block);   // and back
  void save_state(int32_t slot, int32_t host);    // a slot's state → host checkpoint
  void load_state(int32_t host, int32_t slot);
  // Runs the queued copies (each rank's on its backend) and clears the queue.
  void run();

  int64_t blocks() const { return blocks_; }
  int64_t checkpoints() const { return checkpoints_; }

 private:
  struct Rank {
    ModelCache* cache = nullptr;
    std::vector<KvPool> kv;             // [blocks, block_size, kv_heads, head_dim] per attention layer
    std::vector<Tensor> conv, delta;    // [checkpoints, ...] per linear-attention layer
    std::vector<std::pair<Tensor, Tensor>> queue;
  };
  void queue_block(int32_t device, int32_t host, bool to_host);
  void queue_state(int32_t slot, int32_t host, bool to_host);

  int64_t blocks_, checkpoints_;
  std::vector<Rank> ranks_;
};

}  // namespace qinfer
