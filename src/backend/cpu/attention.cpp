// Paged causal GQA attention with an online softmax (flash-attention style). One work item is
// (sequence, block of query tokens, range of keys) over every head: a token's keys for all kv heads
// are one contiguous row of the pool, so an item streams its pages front to back, and each key and
// value is read from memory once for every query head and token of the block. Per tile of keys and
// kv head, a prefill block's query rows get their scores as one GEMM (Q·Kᵀ) and their outputs as
// another (P·V); a decode step's few rows use dot products and weighted sums straight from the
// pages. Long contexts with few items (decode) are split along the keys and merged afterwards. A
// bf16 pool's tile of keys and values is widened to f32 rows first, and the same code reads those.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace qinfer::cpu {
namespace {

constexpr int64_t kQueryBlock = 16;    // query tokens per item
constexpr int64_t kKeyTile = 64;       // keys per softmax update
constexpr int64_t kMinSplitKeys = 512;  // keys below which splitting a row's range does not pay
constexpr int64_t kGemmRows = 16;       // query rows per kv head above which a tile goes through GEMMs

struct Item {
  int64_t seq, t0, t1;  // tokens [t0, t1) of the sequence (indices within it)
  int64_t k0, k1;       // key positions [k0, k1)
  int64_t partial;      // first row of this item's partial results: rows are (kv head, token, head in group)
};

struct Geometry {
  int64_t heads, group, head_dim, kv_heads, block_size, max_blocks;
  const float* q;
  const void* k;  // pool rows of f32, or of bf16 when `bf16`
  const void* v;
  bool bf16;
  const int32_t* block_table;
};

// Asks for keys [from, to) of every head (whole pool rows) ahead of use: pages are scattered, so the
// hardware prefetcher loses the stream at every page boundary.
void prefetch_tile(const Geometry& g, const int32_t* table, int64_t from, int64_t to) {
  const int64_t row_bytes = g.kv_heads * g.head_dim * (g.bf16 ? 2 : 4);
  for (int64_t p = from; p < to;) {
    const int64_t off = p % g.block_size, n = std::min(g.block_size - off, to - p);
    const int64_t first = (table[p / g.block_size] * g.block_size + off) * row_bytes;
    for (const void* pool : {g.k, g.v}) {
      const char* base = reinterpret_cast<const char*>(pool) + first;
      for (int64_t b = 0; b < n * row_bytes; b += 64) __builtin_prefetch(base + b);
    }
    p += n;
  }
}

// Runs one item: for each row, m (running max), l (running sum) and acc[head_dim] (unnormalised
// output) over the item's keys, written to partial rows [m, l, acc...] in (kv head, token, head in
// group) order, so that each group's rows are one matrix.
void run_item(const Context& ctx, const Geometry& g, const Item& it, int64_t seq_start, int64_t cached, float scale,
              float* partial) {
  const int64_t hd = g.head_dim, G = g.group, tokens = it.t1 - it.t0, width = hd + 2;
  const int64_t row_stride = g.kv_heads * hd, group_rows = tokens * G;
  thread_local std::vector<float> qs, scores;
  qs.resize(g.kv_heads * group_rows * hd), scores.resize(group_rows * kKeyTile);
  for (int64_t ti = 0; ti < tokens; ++ti)
    for (int64_t kvh = 0; kvh < g.kv_heads; ++kvh)
      ctx.k.scale_mul(g.q + ((seq_start + it.t0 + ti) * g.heads + kvh * G) * hd, scale, nullptr,
                      qs.data() + (kvh * group_rows + ti * G) * hd, G * hd);
  for (int64_t r = 0; r < g.kv_heads * group_rows; ++r) {
    float* p = partial + r * width;
    p[0] = -std::numeric_limits<float>::infinity(), p[1] = 0.0f;
    std::fill_n(p + 2, hd, 0.0f);
  }
  const int32_t* table = g.block_table + it.seq * g.max_blocks;
  const int64_t key_end = std::min(it.k1, cached + it.t1);  // the last token of the block sees the most keys
  // A bf16 pool's current tile of keys (pool 0) and values (pool 1), widened: [n_tile, row_stride].
  thread_local std::vector<float> widened;
  if (g.bf16) widened.resize(2 * kKeyTile * row_stride);
  int64_t widened_from = 0;  // the tile's first key
  // Calls fn(f32 row pointer, count, offset within the range) for each run of keys [from, to) of the
  // current tile inside one page (a bf16 pool: of the widened tile).
  auto for_pages = [&](int pool, int64_t from, int64_t to, auto&& fn) {
    if (g.bf16) {
      fn(widened.data() + (pool * kKeyTile + from - widened_from) * row_stride, to - from, 0);
      return;
    }
    const float* rows = static_cast<const float*>(pool == 0 ? g.k : g.v);
    for (int64_t p = from; p < to;) {
      const int64_t off = p % g.block_size, n = std::min(g.block_size - off, to - p);
      fn(rows + (table[p / g.block_size] * g.block_size + off) * row_stride, n, p - from);
      p += n;
    }
  };
  auto widen_tile = [&](int64_t from, int64_t to) {
    widened_from = from;
    for (int pool = 0; pool < 2; ++pool) {
      const auto* rows = static_cast<const uint16_t*>(pool == 0 ? g.k : g.v);
      for (int64_t p = from; p < to;) {
        const int64_t off = p % g.block_size, n = std::min(g.block_size - off, to - p);
        ctx.k.to_f32(DType::bf16, rows + (table[p / g.block_size] * g.block_size + off) * row_stride,
                     widened.data() + (pool * kKeyTile + p - from) * row_stride, n * row_stride);
        p += n;
      }
    }
  };
  thread_local std::vector<float> kv_tile;
  kv_tile.resize(2 * kKeyTile * hd);
  float* Kt = kv_tile.data();      // [n_tile, hd]: this kv head's keys of the tile, contiguous
  float* Vt = Kt + kKeyTile * hd;  // [n_tile, hd]: its values
  float* S = scores.data();        // [active rows, kKeyTile]
  for (int64_t kt = it.k0; kt < key_end; kt += kKeyTile) {
    const int64_t tile_end = std::min(kt + kKeyTile, key_end), n_tile = tile_end - kt;
    prefetch_tile(g, table, tile_end, std::min(tile_end + kKeyTile, key_end));
    // Tokens see keys [0, cached + t + 1): those before `first` see none of this tile.
    const int64_t first = std::max<int64_t>(0, kt - cached - it.t0), rows = (tokens - first) * G;
    if (rows <= 0) continue;
    if (g.bf16) widen_tile(kt, tile_end);
    for (int64_t kvh = 0; kvh < g.kv_heads; ++kvh) {
      const int64_t row0 = kvh * group_rows + first * G;
      float* part = partial + row0 * width;
      const float* q = qs.data() + row0 * hd;
      // Few rows (decode): dot products and weighted sums straight from the pages. Many rows
      // (prefill): the tile's keys and values gathered into contiguous rows (pool rows are
      // kv_heads·hd apart, often 4 KiB, which would put a page's keys in one L1 set) for two GEMMs.
      const bool gemm = rows > kGemmRows;
      if (gemm) {
        for (const auto& pair : {std::pair{0, Kt}, std::pair{1, Vt}}) {
          // Named copies: clang 14 cannot capture structured bindings in the lambda below.
          const int pool = pair.first;
          float* const dst = pair.second;
          for_pages(pool, kt, tile_end, [&](const float* src, int64_t n, int64_t at) {
            for (int64_t j = 0; j < n; ++j) std::copy_n(src + j * row_stride + kvh * hd, hd, dst + (at + j) * hd);
          });
        }
        ctx.k.gemm_nt(rows, n_tile, hd, q, hd, Kt, DType::f32, hd, S, kKeyTile, 1.0f, false);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t visible = std::min(cached + it.t0 + first + r / G + 1, tile_end) - kt;
        float* s = S + r * kKeyTile;
        float* p = part + r * width;
        if (!gemm) {
          for_pages(0, kt, kt + visible, [&](const float* k, int64_t n, int64_t at) {
            ctx.k.dots_strided(q + r * hd, k + kvh * hd, n, row_stride, hd, s + at);
          });
        }
        const float tile_max = ctx.k.max(s, visible);
        if (tile_max > p[0]) {
          const float correction = std::exp(p[0] - tile_max);  // 0 on the first tile (m = −inf)
          p[1] *= correction;
          ctx.k.scale(correction, p + 2, hd);
          p[0] = tile_max;
        }
        p[1] += ctx.k.exp_sub_sum(s, p[0], visible);
        if (gemm) {
          std::fill(s + visible, s + n_tile, 0.0f);  // causally hidden
        } else {
          for_pages(1, kt, kt + visible, [&](const float* v, int64_t n, int64_t at) {
            ctx.k.axpys_strided(s + at, v + kvh * hd, n, row_stride, hd, p + 2);
          });
        }
      }
      if (gemm) ctx.k.gemm_nn(rows, hd, n_tile, S, kKeyTile, Vt, hd, part + 2, width, 1.0f, true);
    }
  }
}

}  // namespace

void attention(const Context& ctx, const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
               Tensor& out) {
  check_f32("attention", "q", q, 3);
  const int64_t T = q.dim(0), heads = q.dim(1), hd = q.dim(2);
  check_f32("attention", "out", out, 3);
  check_shape("attention", "out", out, q.shape);
  QINFER_CHECK(out.data != q.data || out.numel() == 0, "cpu attention: out must not alias q");
  check_kv_pool("attention", pool);
  const int64_t num_blocks = pool.k.dim(0), kv_heads = pool.k.dim(2);
  check_shape("attention", "pool.k", pool.k, {num_blocks, layout.block_size, kv_heads, hd});
  check_shape("attention", "pool.v", pool.v, pool.k.shape);
  QINFER_CHECK(kv_heads > 0 && heads % kv_heads == 0, "cpu attention: {} query heads are not a multiple of {} kv heads",
               heads, kv_heads);
  check_layout("attention", layout.seqs, T, -1);
  const int64_t S = layout.seqs.num_seqs();
  QINFER_CHECK(layout.block_size > 0 && layout.max_blocks >= 0, "cpu attention: block_size {} / max_blocks {} are invalid",
               layout.block_size, layout.max_blocks);
  QINFER_CHECK(static_cast<int64_t>(layout.block_table.size()) == S * layout.max_blocks &&
                   static_cast<int64_t>(layout.cached.size()) == S,
               "cpu attention: block_table has {} entries and cached {} for {} sequences of {} blocks",
               layout.block_table.size(), layout.cached.size(), S, layout.max_blocks);
  const auto& cu = layout.seqs.cu_seqlens;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t len = cu[s + 1] - cu[s], n_keys = layout.cached[s] + len;
    QINFER_CHECK(layout.cached[s] >= 0, "cpu attention: cached[{}] = {} is negative", s, layout.cached[s]);
    if (len == 0) continue;
    const int64_t blocks = (n_keys + layout.block_size - 1) / layout.block_size;
    QINFER_CHECK(blocks <= layout.max_blocks,
                 "cpu attention: sequence {} reaches position {}, beyond its block table of {} blocks of {}", s,
                 n_keys - 1, layout.max_blocks, layout.block_size);
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t block = layout.block_table[s * layout.max_blocks + b];
      QINFER_CHECK(block >= 0 && block < num_blocks, "cpu attention: block_table[{}, {}] = {} is outside the {} blocks",
                   s, b, block, num_blocks);
    }
  }
  if (T == 0) return;

  const int64_t group = heads / kv_heads;
  int64_t base_items = 0;
  for (int64_t s = 0; s < S; ++s) base_items += (cu[s + 1] - cu[s] + kQueryBlock - 1) / kQueryBlock;
  // Split keys only while there are fewer items than threads to keep busy.
  const int64_t want_splits = std::max<int64_t>(1, (2 * static_cast<int64_t>(ctx.pool.size()) + base_items - 1) / base_items);

  std::vector<Item> items;
  std::vector<std::pair<int64_t, int64_t>> groups;  // items [first, last) that share (seq, token block)
  int64_t partial_rows = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t len = cu[s + 1] - cu[s], cached = layout.cached[s];
    for (int64_t t0 = 0; t0 < len; t0 += kQueryBlock) {
      const int64_t t1 = std::min(len, t0 + kQueryBlock), n_keys = cached + t1;
      const int64_t tiles = (n_keys + kKeyTile - 1) / kKeyTile;
      const int64_t splits = std::clamp<int64_t>(n_keys / kMinSplitKeys, 1, want_splits);
      const int64_t first = static_cast<int64_t>(items.size());
      for (int64_t p = 0; p < splits; ++p) {
        const int64_t k0 = tiles * p / splits * kKeyTile, k1 = std::min(n_keys, tiles * (p + 1) / splits * kKeyTile);
        items.push_back({s, t0, t1, k0, k1, partial_rows});
        partial_rows += (t1 - t0) * heads;
      }
      groups.push_back({first, static_cast<int64_t>(items.size())});
    }
  }

  const Geometry geo{heads, group, hd, kv_heads, layout.block_size, layout.max_blocks, q.ptr<float>(), pool.k.data,
                     pool.v.data, pool.k.dtype == DType::bf16, layout.block_table.data()};
  const int64_t width = hd + 2;
  std::vector<float> partial(partial_rows * width);
  // Causal prefill makes later token blocks dearer: visiting items first, last, second, second to
  // last, ... gives every contiguous share of the pool a similar mix.
  const int64_t n_items = static_cast<int64_t>(items.size());
  ctx.parallel(n_items, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const Item& it = items[i % 2 == 0 ? i / 2 : n_items - 1 - i / 2];
      run_item(ctx, geo, it, cu[it.seq], layout.cached[it.seq], scale, partial.data() + it.partial * width);
    }
  });

  // Merge each group's key ranges: out = Σ acc_i e^{m_i − M} / Σ l_i e^{m_i − M}.
  ctx.parallel(static_cast<int64_t>(groups.size()), 4, [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      const auto [first, last] = groups[gi];
      const Item& it0 = items[first];
      const int64_t tokens = it0.t1 - it0.t0;
      for (int64_t r = 0; r < tokens * heads; ++r) {
        // Partial row r is (kv head, token, head in group).
        const int64_t kvh = r / (tokens * group), ti = r / group % tokens, h = kvh * group + r % group;
        float* o = out.ptr<float>() + ((cu[it0.seq] + it0.t0 + ti) * heads + h) * hd;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t i = first; i < last; ++i) m = std::max(m, partial[(items[i].partial + r) * width]);
        float l = 0.0f;
        std::fill_n(o, hd, 0.0f);
        for (int64_t i = first; i < last; ++i) {
          const float* p = partial.data() + (items[i].partial + r) * width;
          if (p[1] == 0.0f) continue;  // no visible key in this range
          const float w = std::exp(p[0] - m);
          l += w * p[1];
          ctx.k.axpy(w, p + 2, o, hd);
        }
        ctx.k.scale(1.0f / l, o, hd);
      }
    }
  });
}

}  // namespace qinfer::cpu
