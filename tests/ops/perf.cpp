// op_harness --perf: the backend under test on realistic shapes (Qwen3.5-0.8B / Qwen3-8B / Qwen3-30B-A3B
// layers), each reported as GB/s = bytes the op must read (and write) ÷ median time, next to the
// memory bandwidth the same process measures, and their ratio (STYLE.md 8). Memory-bound cases cycle
// through enough copies of their weights / caches / states to miss the last-level cache.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/thread_pool.h"
#include "ops/harness.h"

namespace qinfer::harness {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median seconds of fn(i) over at least `min_iters` calls and 0.5 s, after one warm-up call.
double median_seconds(const std::function<void(int)>& fn, int min_iters = 5) {
  fn(0);
  std::vector<double> times;
  const auto begin = Clock::now();
  for (int i = 1; static_cast<int>(times.size()) < min_iters || (seconds_since(begin) < 0.5 && times.size() < 1000); ++i) {
    const auto start = Clock::now();
    fn(i);
    times.push_back(seconds_since(start));
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

size_t llc_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) : size_t{32} << 20;
}

// The last cache level of the backend under test: the host's LLC, or the device's L2.
size_t g_cache_bytes = 0;

// Copies of a `bytes`-sized operand that together take three times the last-level cache (at most 2 GiB).
int copies_for(double bytes) {
  const double want = 3.0 * static_cast<double>(g_cache_bytes);
  const double cap = 2.0 * (1 << 30);
  return static_cast<int>(std::clamp(std::ceil(want / bytes), 1.0, std::max(1.0, std::floor(cap / bytes))));
}

// Four interleaved read streams: a single stream leaves this much of a server core's bandwidth
// unused, and the GEMV reads four weight rows at once.
uint32_t sum_four_streams(const uint32_t* p, size_t n) {
  const size_t len = n / 4;
  const uint32_t *a = p, *b = p + len, *c = p + 2 * len, *d = p + 3 * len;
  uint32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i < len; ++i) s0 += a[i], s1 += b[i], s2 += c[i], s3 += d[i];
  return s0 ^ s1 ^ s2 ^ s3;
}

// Bytes/s of reading a buffer three times the LLC across the pool, and of a parallel memcpy
// (counting read + write), so an op's GB/s has the machine's own limit next to it.
std::pair<double, double> bandwidth_probe(ThreadPool& pool) {
  const size_t n = std::max<size_t>(3 * llc_bytes(), size_t{256} << 20) / 4;
  std::vector<uint32_t> src(n, 1), dst(n);
  std::atomic<uint32_t> sink{0};
  double read = INFINITY;  // best of three: the limit, not a sample of a shared machine's noise
  for (int i = 0; i < 3; ++i) {
    read = std::min(read, median_seconds([&](int) {
      pool.parallel_for(n, [&](size_t b, size_t e) { sink += sum_four_streams(&src[b], e - b); });
    }));
  }
  const double copy = median_seconds([&](int) {
    pool.parallel_for(n, [&](size_t b, size_t e) { std::memcpy(&dst[b], &src[b], (e - b) * 4); });
  });
  return {n * 4.0 / read, 2.0 * n * 4.0 / copy};
}

// Puts a host tensor into the memory of the backend under test.
using Put = std::function<Tensor(const Tensor&)>;

// A tensor filled with a constant ≈0.01 (values do not change the timing; a random fill of
// gigabytes would dominate the run).
Tensor pattern_tensor(const Put& put, DType dtype, std::vector<int64_t> shape) {
  Tensor host = host_tensor(dtype, std::move(shape));
  if (dtype == DType::f32) {
    std::fill_n(host.ptr<float>(), host.numel(), 0.01f);
  } else {
    std::fill_n(host.ptr<uint16_t>(), host.numel(), dtype == DType::bf16 ? uint16_t{0x3C24} : uint16_t{0x2000});
  }
  return put(host);
}

struct Bench {
  std::function<void(int)> run;  // one op call on copy i % copies
  double bytes = 0, flops = 0;
};

struct PerfCase {
  std::string name;
  std::function<Bench(Ops&, const Put&)> setup;
};

PerfCase linear_case(int64_t T, int64_t in, int64_t out, DType dt) {
  return {fmt::format("linear {} {}x{}->{}", name(dt), T, in, out), [=](Ops& ops, const Put& put) {
            const double weight_bytes = storage_bytes(dt, in * out);
            const int copies = T == 1 ? copies_for(weight_bytes) : 1;
            auto w = std::make_shared<std::vector<Tensor>>();
            for (int c = 0; c < copies; ++c) w->push_back(pattern_tensor(put, dt, {out, in}));
            auto x = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {T, in}));
            auto y = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, out}));
            return Bench{[=, &ops](int i) { ops.linear(*x, (*w)[i % copies], *y); },
                         weight_bytes + 4.0 * T * (in + out), 2.0 * T * in * out};
          }};
}

// One decoder layer's linears as the model runs them (q/k/v reading one x, o, gate/up with SiLU,
// down), T tokens: at decode batch sizes what a step's GEMMs read of the weights, against the probe.
PerfCase layer_linears_case(int64_t T, int64_t hidden, int64_t q_out, int64_t kv_out, int64_t inter, DType dt) {
  return {fmt::format("layer linears {} T={} {}: q {} kv {} mlp {}", name(dt), T, hidden, q_out, kv_out, inter),
          [=](Ops& ops, const Put& put) {
            auto w = std::make_shared<std::vector<Weight>>();
            for (const auto& [out, in] : std::vector<std::pair<int64_t, int64_t>>{
                     {q_out, hidden}, {kv_out, hidden}, {kv_out, hidden}, {hidden, q_out}, {inter, hidden},
                     {inter, hidden}, {hidden, inter}})
              w->push_back(Weight(pattern_tensor(put, dt, {out, in})));
            auto x = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {T, hidden}));
            auto q = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, q_out}));
            auto k = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, kv_out}));
            auto v = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, kv_out}));
            auto o = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, hidden}));
            auto act = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, inter}));
            auto y = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, hidden}));
            const double weight_bytes = storage_bytes(dt, (q_out + 2 * kv_out) * hidden + hidden * q_out + 3 * inter * hidden);
            return Bench{[=, &ops](int) {
                           const std::vector<Weight>& m = *w;
                           ops.linear_many(*x, {&m[0], &m[1], &m[2]}, {q.get(), k.get(), v.get()});
                           ops.linear(*q, m[3], *o);
                           ops.linear_swiglu(*o, m[4], m[5], *act);
                           ops.linear(*act, m[6], *y);
                         },
                         weight_bytes, 2.0 * T * weight_bytes / storage_bytes(dt, 1)};
          }};
}

// An MLX-quantized [out, in] weight: codes a fixed bit pattern, scales and biases ≈0.01.
PerfCase linear_quantized_case(int64_t T, int64_t in, int64_t out, quant::Layout layout) {
  return {fmt::format("linear {} {}-bit g{} {}x{}->{}", quant::traits(layout.mode).name, layout.bits,
                      layout.group_size, T, in, out),
          [=](Ops& ops, const Put& put) {
            const bool affine = layout.mode == quant::Mode::affine;
            const DType scale_type = affine ? DType::bf16 : DType::u8;
            Weight host;
            host.layout = layout;
            host.codes = host_tensor(DType::u32, {out, quant::packed_words(in, layout.bits)});
            std::fill_n(host.codes.ptr<uint32_t>(), host.codes.numel(), 0x9E3779B9u);
            const double weight_bytes = static_cast<double>(host.codes.nbytes()) +
                                        (affine ? 2.0 : 1.0) * storage_bytes(scale_type, out * (in / layout.group_size));
            const int copies = T == 1 ? copies_for(weight_bytes) : 1;
            auto w = std::make_shared<std::vector<Weight>>();
            for (int c = 0; c < copies; ++c) {
              Weight wc = host;
              wc.codes = put(host.codes);
              if (affine) {
                wc.scales = pattern_tensor(put, DType::bf16, {out, in / layout.group_size});
                wc.biases = pattern_tensor(put, DType::bf16, {out, in / layout.group_size});
              } else {
                Tensor s = host_tensor(DType::u8, {out, in / layout.group_size});
                std::fill_n(s.ptr<uint8_t>(), s.numel(), uint8_t{120});
                wc.scales = put(s);
              }
              w->push_back(wc);
            }
            auto x = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {T, in}));
            auto y = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, out}));
            return Bench{[=, &ops](int i) { ops.linear(*x, (*w)[i % copies], *y); },
                         weight_bytes + 4.0 * T * (in + out), 2.0 * T * in * out};
          }};
}

// T new tokens after `cached` ones in each of `seqs` sequences: T = 1 is a decode step; T > 1 a
// prefill chunk. The pool holds `kv` elements (f32 or bf16).
PerfCase attention_case(int64_t T, int64_t cached, int64_t heads, int64_t kv_heads, int64_t hd, int64_t seqs = 1,
                        DType kv = DType::f32) {
  const std::string batch = seqs == 1 ? "" : fmt::format("{}x", seqs);
  const std::string kind = T == 1 ? fmt::format("decode {}{} cached", batch, cached)
                                  : fmt::format("prefill {}{}+{}", batch, cached, T);
  return {fmt::format("attention {} h={} kv={} hd={} {} pool", kind, heads, kv_heads, hd, name(kv)),
          [=](Ops& ops, const Put& put) {
            const int64_t n_keys = cached + T;
            const int32_t bs = 16, blocks = static_cast<int32_t>((n_keys + bs - 1) / bs);
            const double kv_bytes = 2.0 * static_cast<double>(storage_bytes(kv, static_cast<uint64_t>(seqs * n_keys * kv_heads * hd)));
            const int copies = T == 1 ? copies_for(kv_bytes) : 1;
            const int64_t pool_blocks = copies * seqs * blocks;
            auto pool = std::make_shared<KvPool>(KvPool{pattern_tensor(put, kv, {pool_blocks, bs, kv_heads, hd}),
                                                        pattern_tensor(put, kv, {pool_blocks, bs, kv_heads, hd})});
            auto layouts = std::make_shared<std::vector<AttentionLayout>>(copies);
            for (int c = 0; c < copies; ++c) {
              AttentionLayout& l = (*layouts)[c];
              l.seqs.cu_seqlens = {0};
              for (int64_t s = 0; s < seqs; ++s) {
                l.seqs.cu_seqlens.push_back(static_cast<int32_t>((s + 1) * T));
                l.seqs.state_slot.push_back(static_cast<int32_t>(s));
                l.cached.push_back(static_cast<int32_t>(cached));
              }
              l.block_size = bs, l.max_blocks = blocks;
              for (int32_t b = 0; b < seqs * blocks; ++b) l.block_table.push_back(static_cast<int32_t>(c * seqs * blocks + b));
            }
            auto q = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {seqs * T, heads, hd}));
            auto out = std::make_shared<Tensor>(ops.alloc(DType::f32, {seqs * T, heads, hd}));
            const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
            // Keys seen, summed over the causal rows: q·k and p·v are 2 flops per feature each.
            const double pairs = seqs * (T * cached + T * (T + 1) / 2.0);
            return Bench{[=, &ops](int i) { ops.attention(*q, *pool, (*layouts)[i % copies], scale, *out); },
                         kv_bytes + 8.0 * seqs * T * heads * hd, 4.0 * heads * hd * pairs};
          }};
}

PerfCase gdn_case(int64_t T, GdnAlgorithm algorithm, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv) {
  const char* label = algorithm == GdnAlgorithm::chunked ? "chunked" : "recurrent";
  return {fmt::format("gated_delta_rule {} T={} Hk={} Hv={} Dk={} Dv={}", label, T, Hk, Hv, Dk, Dv), [=](Ops& ops, const Put& put) {
            const double state_bytes = 4.0 * Hv * Dv * Dk;
            const int copies = T == 1 ? copies_for(2 * state_bytes) : 1;
            Rng rng(1);
            auto q = std::make_shared<Tensor>(put(random_tensor(rng, DType::f32, {T, Hk, Dk}, 0.05f)));
            auto k = std::make_shared<Tensor>(put(random_tensor(rng, DType::f32, {T, Hk, Dk}, 0.05f)));
            auto v = std::make_shared<Tensor>(put(random_tensor(rng, DType::f32, {T, Hv, Dv})));
            Tensor g_host = host_tensor(DType::f32, {T, Hv}), beta_host = host_tensor(DType::f32, {T, Hv});
            std::fill_n(g_host.ptr<float>(), T * Hv, -0.1f);
            std::fill_n(beta_host.ptr<float>(), T * Hv, 0.5f);
            auto g = std::make_shared<Tensor>(put(g_host));
            auto beta = std::make_shared<Tensor>(put(beta_host));
            auto state = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {copies, Hv, Dv, Dk}));
            auto out = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, Hv, Dv}));
            auto layouts = std::make_shared<std::vector<SeqLayout>>(copies);
            for (int c = 0; c < copies; ++c) (*layouts)[c] = SeqLayout{{0, static_cast<int32_t>(T)}, {c}};
            // Recurrent: ~6 flops per state element per token; chunked: about the same count in matrix form.
            return Bench{[=, &ops](int i) {
                           ops.gated_delta_rule(*q, *k, *v, *g, *beta, (*layouts)[i % copies], *state, *out, algorithm);
                         },
                         2 * state_bytes + 4.0 * T * (2 * Hk * Dk + 2 * Hv * Dv), 6.0 * T * Hv * Dv * Dk};
          }};
}

PerfCase moe_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, DType dt) {
  return {fmt::format("moe_experts {} T={} H={} I={} E={} k={}", name(dt), T, H, I, E, k), [=](Ops& ops, const Put& put) {
            auto gate = std::make_shared<Tensor>(pattern_tensor(put, dt, {E, I, H}));
            auto up = std::make_shared<Tensor>(pattern_tensor(put, dt, {E, I, H}));
            auto down = std::make_shared<Tensor>(pattern_tensor(put, dt, {E, H, I}));
            auto x = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {T, H}));
            auto out = std::make_shared<Tensor>(ops.alloc(DType::f32, {T, H}));
            auto weights = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {T, k}));
            // Each call routes to a different set of experts, as decode does, so weights come from memory;
            // a prefill's tokens spread evenly over the experts (token t takes block t + r of k experts).
            const int routings = static_cast<int>(E / k);
            auto ids = std::make_shared<std::vector<Tensor>>();
            for (int r = 0; r < routings; ++r) {
              std::vector<int32_t> v(T * k);
              for (int64_t i = 0; i < T * k; ++i) v[i] = static_cast<int32_t>(((i / k + r) * k + i % k) % E);
              ids->push_back(put(i32_tensor({T, k}, v)));
            }
            const double touched = std::min<double>(E, T * k);
            return Bench{[=, &ops](int i) { ops.moe_experts(*x, (*ids)[i % routings], *weights, *gate, *up, *down, *out); },
                         touched * 3.0 * storage_bytes(dt, H * I), 6.0 * T * k * H * I};
          }};
}

// A hidden-state norm over N rows of D: rms_norm, or add_rms_norm (the residual add fused in).
PerfCase norm_case(const std::string& op, int64_t N, int64_t D) {
  return {fmt::format("{} {}x{}", op, N, D), [=](Ops& ops, const Put& put) {
            auto x = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {N, D}));
            auto delta = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {N, D}));
            auto w = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {D}));
            auto y = std::make_shared<Tensor>(ops.alloc(DType::f32, {N, D}));
            if (op == "add_rms_norm")
              return Bench{[=, &ops](int) { ops.add_rms_norm(*x, *delta, *w, 1e-6f, *y); }, 16.0 * N * D};
            return Bench{[=, &ops](int) { ops.rms_norm(*x, *w, 1e-6f, *y); }, 8.0 * N * D};
          }};
}

// rope, or rms_norm_rope (the per-head q/k norm fused in), on T tokens of `heads` heads.
PerfCase rope_case(int64_t T, int64_t heads, int64_t hd, bool norm) {
  return {fmt::format("{} T={} h={} hd={}", norm ? "rms_norm_rope" : "rope", T, heads, hd),
          [=](Ops& ops, const Put& put) {
            std::vector<int32_t> pos(3 * T);
            for (int64_t i = 0; i < 3 * T; ++i) pos[i] = static_cast<int32_t>(1000 + i % T);
            auto positions = std::make_shared<Tensor>(put(i32_tensor({3, T}, pos)));
            auto x = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {T, heads, hd}));
            auto w = std::make_shared<Tensor>(pattern_tensor(put, DType::f32, {hd}));
            const RopeParams params{hd, 1e6, {}};
            return Bench{[=, &ops](int) {
                           if (norm) ops.rms_norm_rope(*x, *w, 1e-6f, *positions, params);
                           else ops.rope(*x, *positions, params);
                         },
                         8.0 * T * heads * hd};
          }};
}

}  // namespace

int run_perf(const Backend& backend, Ops& ops, const std::string& filter) {
  std::vector<PerfCase> cases;
  double ceiling = 0;  // GB/s the ÷probe column divides by
  std::function<double(const std::function<void(int)>&)> timer = [](const std::function<void(int)>& fn) {
    return median_seconds(fn);
  };
  if (backend.device) {
    g_cache_bytes = backend.device->cache_bytes();
    ceiling = backend.device->probe_gbs() * 1e9;
    timer = backend.device->median_seconds;
    fmt::print("backend {}; copy probe {:.1f} GB/s (read + write); last cache {} MiB\n", ops.name(), ceiling / 1e9,
               g_cache_bytes >> 20);
    // Qwen3-8B's decode matrices (q/k/v/o, gate/up, down, the head), at batch 1 / 8 / 32, prefill
    // GEMMs at 8192 tokens, the attention and recurrent layers of Qwen3-8B / Qwen3.5-9B, the expert
    // layers of Qwen3-30B-A3B (1 / 128 / 8192 tokens) and Qwen3.5-35B-A3B (8192), and the per-layer
    // norms and rotations (one token: latency-bound; 8192: bandwidth-bound).
    cases = {
        linear_case(1, 4096, 4096, DType::bf16),
        linear_case(1, 4096, 12288, DType::bf16),
        linear_case(1, 12288, 4096, DType::bf16),
        linear_case(1, 4096, 151936, DType::bf16),
        linear_case(4, 4096, 12288, DType::bf16),
        linear_case(8, 4096, 12288, DType::bf16),
        linear_case(32, 4096, 12288, DType::bf16),
        linear_case(8192, 4096, 12288, DType::bf16),
        linear_case(8192, 12288, 4096, DType::bf16),
        // Qwen3-8B's layer at serving decode batch sizes: what a step's GEMMs read of the weights.
        layer_linears_case(1, 4096, 4096, 1024, 12288, DType::bf16),
        layer_linears_case(16, 4096, 4096, 1024, 12288, DType::bf16),
        layer_linears_case(64, 4096, 4096, 1024, 12288, DType::bf16),
        layer_linears_case(256, 4096, 4096, 1024, 12288, DType::bf16),
        linear_quantized_case(1, 4096, 4096, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 4096, 12288, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 12288, 4096, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(8, 4096, 12288, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 4096, 1024, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 4096, 151936, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 4096, 12288, {quant::Mode::affine, 8, 64}),
        linear_quantized_case(1, 12288, 4096, {quant::Mode::affine, 8, 64}),
        linear_quantized_case(1, 4096, 4096, {quant::Mode::affine, 8, 64}),
        linear_quantized_case(1, 4096, 1024, {quant::Mode::affine, 8, 64}),
        linear_quantized_case(1, 4096, 151936, {quant::Mode::affine, 8, 64}),
        linear_quantized_case(8192, 4096, 12288, {quant::Mode::affine, 4, 64}),
        attention_case(1, 512, 32, 8, 128),
        attention_case(1, 4096, 32, 8, 128),
        attention_case(1, 512, 32, 8, 128, 8),
        attention_case(1, 4096, 32, 8, 128, 8),
        // Serving: 64 / 256 streams of Qwen3-8B 640 tokens in, over either pool.
        attention_case(1, 640, 32, 8, 128, 64),
        attention_case(1, 640, 32, 8, 128, 256),
        attention_case(1, 640, 32, 8, 128, 64, DType::bf16),
        attention_case(1, 640, 32, 8, 128, 256, DType::bf16),
        attention_case(1, 640, 16, 4, 256, 256, DType::bf16),
        attention_case(1, 4096, 32, 8, 128, 8, DType::bf16),
        attention_case(1, 512, 16, 4, 256),
        attention_case(1, 4096, 16, 4, 256),
        attention_case(1, 512, 16, 4, 256, 8),
        attention_case(1, 4096, 16, 4, 256, 8),
        attention_case(8192, 0, 32, 8, 128),
        attention_case(8192, 0, 16, 4, 256),
        gdn_case(1, GdnAlgorithm::recurrent, 16, 32, 128, 128),
        gdn_case(8192, GdnAlgorithm::chunked, 16, 32, 128, 128),
        moe_case(1, 2048, 768, 128, 8, DType::bf16),
        moe_case(8, 2048, 768, 128, 8, DType::bf16),
        moe_case(64, 2048, 768, 128, 8, DType::bf16),
        moe_case(128, 2048, 768, 128, 8, DType::bf16),
        moe_case(8192, 2048, 768, 128, 8, DType::bf16),
        moe_case(8192, 2048, 512, 256, 8, DType::bf16),
        norm_case("rms_norm", 1, 4096),
        norm_case("rms_norm", 32, 128),
        norm_case("add_rms_norm", 1, 4096),
        norm_case("add_rms_norm", 8192, 4096),
        rope_case(1, 32, 128, false),
        rope_case(1, 32, 128, true),
        rope_case(1, 8, 128, true),
        rope_case(8192, 32, 128, true),
    };
  } else {
    g_cache_bytes = llc_bytes();
    ThreadPool& pool = global_thread_pool();
    const auto [read_bw, copy_bw] = bandwidth_probe(pool);
    ceiling = read_bw;
    fmt::print("backend {} ({} threads); memory probe: read {:.1f} GB/s, memcpy {:.1f} GB/s (read+write); LLC {} MiB\n",
               ops.name(), pool.size(), read_bw / 1e9, copy_bw / 1e9, g_cache_bytes >> 20);
    cases = {
        linear_case(1, 4096, 4096, DType::bf16),
        linear_case(1, 1024, 3584, DType::bf16),
        linear_case(1, 3584, 1024, DType::bf16),
        linear_case(1, 4096, 4096, DType::f16),
        linear_case(1, 4096, 4096, DType::f32),
        linear_case(8, 4096, 4096, DType::bf16),
        linear_case(512, 1024, 3584, DType::bf16),
        linear_quantized_case(1, 4096, 4096, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 4096, 4096, {quant::Mode::affine, 8, 64}),
        linear_quantized_case(1, 4096, 12288, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 12288, 4096, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(8, 4096, 4096, {quant::Mode::affine, 4, 64}),
        linear_quantized_case(1, 4096, 4096, {quant::Mode::mxfp4, 4, 32}),
        attention_case(1, 4096, 8, 2, 256),
        attention_case(1, 4096, 32, 8, 128),
        attention_case(512, 0, 8, 2, 256),
        gdn_case(1, GdnAlgorithm::recurrent, 16, 16, 128, 128),
        gdn_case(1024, GdnAlgorithm::chunked, 16, 16, 128, 128),
        gdn_case(1024, GdnAlgorithm::recurrent, 16, 16, 128, 128),
        moe_case(1, 2048, 768, 128, 8, DType::bf16),
        norm_case("add_rms_norm", 1, 4096),
        rope_case(1, 32, 128, true),
    };
  }
  fmt::print("{:<52} {:>10} {:>9} {:>8} {:>9}\n", "case", "median ms", "GB/s", "÷probe", "GFLOP/s");
  for (const PerfCase& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    Bench bench = c.setup(ops, [&](const Tensor& host) { return backend.upload(ops, host); });
    const double s = timer(bench.run);
    const double gbs = bench.bytes / s / 1e9;
    fmt::print("{:<52} {:>10.3f} {:>9.1f} {:>7.0f}% {:>9.1f}\n", c.name, s * 1e3, gbs, 100.0 * gbs * 1e9 / ceiling,
               bench.flops / s / 1e9);
  }
  return 0;
}

}  // namespace qinfer::harness
