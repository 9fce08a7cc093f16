#include "cache/host_tier.h"

#include "core/error.h"

namespace qinfer {
namespace {

std::vector<int64_t> with_rows(std::vector<int64_t> shape, int64_t rows) {
  shape.at(0) = rows;
  return shape;
}

}  // namespace

HostTier::HostTier(ModelCache& cache, int64_t blocks, int64_t checkpoints) : blocks_(blocks), checkpoints_(checkpoints) {
  QINFER_CHECK(blocks >= 0 && checkpoints >= 0, "host tier: {} blocks and {} checkpoints", blocks, checkpoints);
  QINFER_CHECK(!cache.mirrored(),
               "the prefix cache's host tier is not available to a tensor-parallel group over processes (its other "
               "processes' cache rows are not reachable from here); leave --host-cache-gb at 0");
  const CacheShape& shape = cache.shape();
  for (int r = 0; r < cache.ranks(); ++r) {
    Rank rank;
    rank.cache = &cache.rank(r);
    Ops& ops = rank.cache->ops();
    if (blocks > 0)
      for (int64_t l = 0; l < shape.attention_layers; ++l) {
        const KvPool& pool = rank.cache->kv(l);
        rank.kv.push_back({ops.alloc_pinned(pool.k.dtype, with_rows(pool.k.shape, blocks)),
                           ops.alloc_pinned(pool.v.dtype, with_rows(pool.v.shape, blocks))});
      }
    if (checkpoints > 0)
      for (int64_t l = 0; l < shape.linear_layers; ++l) {
        const Tensor& conv = rank.cache->conv_state(l);
        const Tensor& delta = rank.cache->delta_state(l);
        rank.conv.push_back(ops.alloc_pinned(conv.dtype, with_rows(conv.shape, checkpoints)));
        rank.delta.push_back(ops.alloc_pinned(delta.dtype, with_rows(delta.shape, checkpoints)));
      }
    ranks_.push_back(std::move(rank));
  }
}

void HostTier::queue_block(int32_t device, int32_t host, bool to_host) {
  QINFER_CHECK(host >= 0 && host < blocks_, "host tier: host block {} is outside its {} blocks", host, blocks_);
  for (Rank& r : ranks_) {
    QINFER_CHECK(device >= 0 && device < r.cache->num_blocks(), "host tier: block {} is outside the cache's {}", device,
                 r.cache->num_blocks());
    for (size_t l = 0; l < r.kv.size(); ++l) {
      const KvPool& pool = r.cache->kv(static_cast<int64_t>(l));
      const Tensor k = pool.k.rows(device, device + 1), v = pool.v.rows(device, device + 1);
      const Tensor hk = r.kv[l].k.rows(host, host + 1), hv = r.kv[l].v.rows(host, host + 1);
      r.queue.emplace_back(to_host ? k : hk, to_host ? hk : k);
      r.queue.emplace_back(to_host ? v : hv, to_host ? hv : v);
    }
  }
}

void HostTier::queue_state(int32_t slot, int32_t host, bool to_host) {
  QINFER_CHECK(host >= 0 && host < checkpoints_, "host tier: host checkpoint {} is outside its {}", host, checkpoints_);
  for (Rank& r : ranks_)
    for (size_t l = 0; l < r.conv.size(); ++l)
      for (const auto& [state, copy] : {std::pair(r.cache->conv_state(static_cast<int64_t>(l)), r.conv[l]),
                                        std::pair(r.cache->delta_state(static_cast<int64_t>(l)), r.delta[l])}) {
        QINFER_CHECK(slot >= 0 && slot < state.dim(0), "host tier: slot {} is outside the cache's {}", slot, state.dim(0));
        const Tensor device = state.rows(slot, slot + 1), host_rows = copy.rows(host, host + 1);
        r.queue.emplace_back(to_host ? device : host_rows, to_host ? host_rows : device);
      }
}

void HostTier::save_block(int32_t block, int32_t host) { queue_block(block, host, true); }
void HostTier::load_block(int32_t host, int32_t block) { queue_block(block, host, false); }
void HostTier::save_state(int32_t slot, int32_t host) { queue_state(slot, host, true); }
void HostTier::load_state(int32_t host, int32_t slot) { queue_state(slot, host, false); }

void HostTier::run() {
  for (Rank& r : ranks_) {
    if (r.queue.empty()) continue;
    r.cache->ops().copy_many(r.queue);
    r.queue.clear();
  }
}

}  // namespace qinfer
