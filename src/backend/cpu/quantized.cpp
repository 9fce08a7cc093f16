// MLX-quantized weights on the cpu backend: each output row is dequantized once per call into a
// thread-local buffer and dotted with every token row (decode reads the packed bytes once).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantized_kernels.h"

namespace qinfer::cpu {

void check_quantized(std::string_view op, std::string_view arg, const Weight& w, int rank) {
  QINFER_CHECK(w.codes.device == Device::cpu && w.codes.dtype == DType::u32 && w.codes.rank() == rank,
               "cpu {}: {} must be host uint32 codes of rank {}", op, arg, rank);
  quant::validate(w.layout);
  std::vector<int64_t> grouped = w.shape();
  grouped.back() /= w.layout.group_size;
  QINFER_CHECK(w.scales.shape == grouped && (w.layout.mode != quant::Mode::affine || w.biases.shape == grouped),
               "cpu {}: {} scales/biases do not match its codes", op, arg);
}

namespace {

// Affine 4/8-bit rows have a direct AVX-512 or AVX2 dot (no dequantized row): the lanes of the
// widest one this CPU and shape allow, 0 for none. Other formats dequantize a row into a thread-local
// buffer and dot it with every token.
int direct_dot_lanes(const Weight& w, int64_t in) {
  if (w.layout.mode != quant::Mode::affine) return 0;
  static const bool avx512 = cpu_has_avx512(), avx2 = cpu_has_avx2();
  if (avx512 && affine_direct_supported(w.layout.bits, w.layout.group_size, in, 16)) return 16;
  if (avx2 && affine_direct_supported(w.layout.bits, w.layout.group_size, in, 8)) return 8;
  return 0;
}

}  // namespace

constexpr int64_t kPrefetchRows = 8;

void linear_quantized(const Context& ctx, const Tensor& x, const Weight& w, Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = y.dim(1);
  // Each row's codes stay in L1 while every token reads them; past a few dozen tokens a dequantized
  // f32 row is cheaper to share.
  const int lanes_per_vector = T <= 64 ? direct_dot_lanes(w, in) : 0;
  const bool direct = lanes_per_vector > 0;
  const int64_t groups = in / w.layout.group_size;
  std::vector<float> lanes, group_sums;
  if (direct) {
    lanes.resize(static_cast<size_t>(T * in));
    group_sums.resize(static_cast<size_t>(T * groups));
    for (int64_t t = 0; t < T; ++t)
      prepare_affine_input(x.ptr<float>() + t * in, in, w.layout.bits, w.layout.group_size, lanes_per_vector,
                           lanes.data() + t * in, group_sums.data() + t * groups);
  }
  ctx.parallel(out, 8, [&](int64_t o0, int64_t o1) {
    thread_local std::vector<float> row, scales, biases;
    if (direct) {
      scales.resize(static_cast<size_t>(groups) + 16);  // the AVX-512 kernel loads 16 scales at a time
      biases.resize(static_cast<size_t>(groups));
      const int64_t words = w.codes.shape.back();
      for (int64_t o = o0; o < o1; ++o) {
        const uint64_t at = static_cast<uint64_t>(o * groups);
        ctx.k.to_f32(w.scales.dtype, static_cast<const char*>(w.scales.data) + storage_bytes(w.scales.dtype, at),
                     scales.data(), groups);
        ctx.k.to_f32(w.biases.dtype, static_cast<const char*>(w.biases.data) + storage_bytes(w.biases.dtype, at),
                     biases.data(), groups);
        const uint32_t* codes = w.codes.ptr<uint32_t>() + o * words;
        // Codes of a row a few ahead, one prefetch per cache line: the dot is dense enough in compute
        // that the hardware prefetcher alone leaves the core waiting on memory between rows.
        if (o + kPrefetchRows < o1)
          for (int64_t i = 0; i < words; i += 16) __builtin_prefetch(codes + kPrefetchRows * words + i);
        const auto dot = lanes_per_vector == 16 ? affine_row_dot_avx512 : affine_row_dot_avx2;
        for (int64_t t = 0; t < T; ++t)
          y.ptr<float>()[t * out + o] = dot(lanes.data() + t * in, group_sums.data() + t * groups, codes,
                                            scales.data(), biases.data(), in, w.layout.group_size, w.layout.bits);
      }
      return;
    }
    row.resize(static_cast<size_t>(in));
    for (int64_t o = o0; o < o1; ++o) {
      w.row_f32(o, row.data());
      for (int64_t t = 0; t < T; ++t) y.ptr<float>()[t * out + o] = ctx.k.dot(x.ptr<float>() + t * in, row.data(), in);
    }
  });
}

void moe_experts_quantized(const Context& ctx, const Tensor& x, const Tensor& ids, const Tensor& weights,
                           const Weight& gate, const Weight& up, const Weight& down, Tensor& out) {
  const int64_t T = x.dim(0), H = x.dim(1), k = ids.dim(1);
  const std::vector<int64_t> gs = gate.shape();
  const int64_t E = gs[0], I = gs[1];
  QINFER_CHECK(up.shape() == gs && down.shape() == (std::vector<int64_t>{E, H, I}) && gs[2] == H,
               "cpu moe_experts: expert weights do not match x [{}, {}]", T, H);
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t i = 0; i < T * k; ++i)
    QINFER_CHECK(id[i] >= 0 && id[i] < E, "cpu moe_experts: ids[{}, {}] = {} is outside the {} experts", i / k, i % k,
                 id[i], E);
  ctx.parallel(T, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> row, act, acc;
    row.resize(static_cast<size_t>(std::max(H, I)));
    act.resize(static_cast<size_t>(I));
    acc.resize(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x.ptr<float>() + t * H;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = id[t * k + j];
        for (int64_t i = 0; i < I; ++i) {
          gate.row_f32(e * I + i, row.data());
          const float g = ctx.k.dot(xt, row.data(), H);
          up.row_f32(e * I + i, row.data());
          act[i] = g / (1.0f + std::exp(-g)) * ctx.k.dot(xt, row.data(), H);
        }
        const float weight = weights.ptr<float>()[t * k + j];
        for (int64_t o = 0; o < H; ++o) {
          down.row_f32(e * H + o, row.data());
          acc[o] += weight * ctx.k.dot(act.data(), row.data(), I);
        }
      }
      std::copy(acc.begin(), acc.end(), out.ptr<float>() + t * H);
    }
  });
}

}  // namespace qinfer::cpu
