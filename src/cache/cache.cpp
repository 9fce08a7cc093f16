#include "cache/cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "core/error.h"

namespace qinfer {

namespace {
std::atomic<uint64_t> next_cache_id{1};
}  // namespace

ModelCache::ModelCache(Ops& ops, const CacheShape& shape, int64_t num_blocks, int32_t block_size, int64_t num_slots)
    : ops_(&ops), id_(next_cache_id++), shape_(shape), block_size_(block_size), num_blocks_(num_blocks),
      num_slots_(num_slots) {
  QINFER_CHECK(block_size > 0 && num_blocks > 0 && num_slots > 0, "cache: blocks, block size and slots must be > 0");
  for (int64_t i = 0; i < shape.attention_layers; ++i)
    kv_.push_back(KvPool{ops.alloc(shape.kv_dtype, {num_blocks, block_size, shape.kv_heads, shape.head_dim}),
                         ops.alloc(shape.kv_dtype, {num_blocks, block_size, shape.kv_heads, shape.head_dim})});
  for (int64_t i = 0; i < shape.linear_layers; ++i) {
    conv_.push_back(ops.alloc(DType::f32, {num_slots, shape.conv_window, shape.conv_channels}));
    delta_.push_back(ops.alloc(DType::f32, {num_slots, shape.value_heads, shape.value_head_dim, shape.key_head_dim}));
  }
}

ModelCache::ModelCache(std::span<Ops* const> ranks, const CacheShape& shape, int64_t num_blocks, int32_t block_size,
                       int64_t num_slots)
    : ModelCache(*ranks[0], shape, num_blocks, block_size, num_slots) {
  for (size_t r = 1; r < ranks.size(); ++r)
    shards_.push_back(std::make_unique<ModelCache>(*ranks[r], shape, num_blocks, block_size, num_slots));
}

SequenceCache ModelCache::sequence(int64_t index) const {
  QINFER_CHECK(index >= 0 && index < num_slots_, "cache: sequence {} of a cache for {}", index, num_slots_);
  const int64_t share = num_blocks_ / num_slots_;
  SequenceCache s;
  for (int64_t b = index * share; b < (index + 1) * share; ++b) s.blocks.push_back(static_cast<int32_t>(b));
  s.slot = static_cast<int32_t>(index);
  return s;
}

void check_room(const ModelCache& cache, const SequenceCache& s, int64_t new_tokens, int32_t state_to,
                int32_t snapshot_to) {
  const int64_t tokens = s.cached + new_tokens;
  QINFER_CHECK(static_cast<int64_t>(s.blocks.size()) * cache.block_size() >= tokens,
               "forward: a sequence holds {} blocks of {} tokens, too few for its {} cached + {} new tokens",
               s.blocks.size(), cache.block_size(), s.cached, new_tokens);
  for (int32_t b : s.blocks)
    QINFER_CHECK(b >= 0 && b < cache.num_blocks(), "forward: block {} is outside the cache's {} blocks", b,
                 cache.num_blocks());
  QINFER_CHECK(cache.shape().linear_layers == 0 || (s.slot >= 0 && s.slot < cache.num_slots()),
               "forward: state slot {} is outside the cache's {} slots", s.slot, cache.num_slots());
  for (const int32_t slot : {state_to, snapshot_to})
    QINFER_CHECK(slot < 0 || (cache.shape().linear_layers > 0 && slot < cache.num_slots()),
                 "forward: target or snapshot state slot {} is outside the cache's {} slots", slot, cache.num_slots());
}

namespace {
// One slot's rows of a [slots, ...] state tensor (a view, in the backend's memory).
Tensor slot_rows(const Tensor& t, int32_t slot) {
  QINFER_CHECK(slot >= 0 && slot < t.dim(0), "state slot {} is outside the cache's {} slots", slot, t.dim(0));
  return t.rows(slot, slot + 1);
}

std::vector<float> read_slot(Ops& ops, const Tensor& t, int32_t slot) {
  const Tensor host = to_host(ops, slot_rows(t, slot));
  return {host.ptr<float>(), host.ptr<float>() + host.numel()};
}

void write_slot(Ops& ops, Tensor& t, int32_t slot, const std::vector<float>& values) {
  Tensor rows = slot_rows(t, slot);
  QINFER_CHECK(static_cast<int64_t>(values.size()) == rows.numel(), "state snapshot holds {} values for a slot of {}",
               values.size(), rows.numel());
  Tensor host = host_tensor(DType::f32, rows.shape);
  std::copy(values.begin(), values.end(), host.ptr<float>());
  ops.copy(host, rows);
}

// Zeros from the backend's own (zero-filled) allocation: no host round trip for device states.
void zero_rows(Ops& ops, Tensor& t, int32_t slot) {
  Tensor rows = slot_rows(t, slot);
  ops.copy(ops.alloc(DType::f32, rows.shape), rows);
}
}  // namespace

void ModelCache::zero_slot(int32_t slot) {
  for (int r = 0; r < ranks(); ++r) {
    ModelCache& c = rank(r);
    for (Tensor& t : c.conv_) zero_rows(*c.ops_, t, slot);
    for (Tensor& t : c.delta_) zero_rows(*c.ops_, t, slot);
  }
  if (mirror_) mirror_->zero_slot(slot);
}

void ModelCache::copy_slot(int32_t from, int32_t to) {
  for (int r = 0; r < ranks(); ++r) {
    ModelCache& c = rank(r);
    for (auto* states : {&c.conv_, &c.delta_})
      for (Tensor& t : *states) {
        Tensor dst = slot_rows(t, to);
        c.ops_->copy(slot_rows(t, from), dst);
      }
  }
  if (mirror_) {
    StateSnapshot theirs;  // only the other processes' layers: restored from its rank 0 on
    mirror_->snapshot(from, theirs);
    mirror_->restore(to, theirs, 0);
  }
}

// Rank after rank: rank 0's layers, then rank 1's, ...
ModelCache::StateSnapshot ModelCache::snapshot(int32_t slot) const {
  StateSnapshot s;
  for (int r = 0; r < ranks(); ++r) {
    const ModelCache& c = r == 0 ? *this : *shards_[static_cast<size_t>(r - 1)];
    for (const Tensor& t : c.conv_) s.conv.push_back(read_slot(*c.ops_, t, slot));
    for (const Tensor& t : c.delta_) s.delta.push_back(read_slot(*c.ops_, t, slot));
  }
  if (mirror_) mirror_->snapshot(slot, s);
  return s;
}

void ModelCache::restore(int32_t slot, const StateSnapshot& snapshot) {
  const size_t n = static_cast<size_t>(ranks());
  const size_t all = n + static_cast<size_t>(mirror_ ? mirror_->ranks() : 0);
  QINFER_CHECK(snapshot.conv.size() == all * conv_.size() && snapshot.delta.size() == all * delta_.size(),
               "state snapshot does not match this cache's layers");
  for (size_t r = 0; r < n; ++r) {
    ModelCache& c = rank(static_cast<int>(r));
    for (size_t i = 0; i < conv_.size(); ++i)
      write_slot(*c.ops_, c.conv_[i], slot, snapshot.conv[r * conv_.size() + i]);
    for (size_t i = 0; i < delta_.size(); ++i)
      write_slot(*c.ops_, c.delta_[i], slot, snapshot.delta[r * delta_.size() + i]);
  }
  if (mirror_) mirror_->restore(slot, snapshot, static_cast<int>(n));
}

}  // namespace qinfer
