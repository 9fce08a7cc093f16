// MLX-quantized weights on the cpu backend. Affine 4/8-bit rows are dotted straight from their
// codes (quantized_kernels.h); other formats, and prefill, dequantize each output row once per call
// into a thread-local buffer and dot it with every token row (the packed bytes are read once).
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

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) || defined(__i386__)
  return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// The direct affine kernel for this weight and row length: the widest one this CPU has whose
// block divides `in`; null for other formats and shapes (and on the portable kernel table, which
// must not run AVX code), which dequantize a row into a thread-local buffer instead.
const AffineKernel* direct_kernel(const Context& ctx, const Weight& w, int64_t in) {
  const quant::Layout& l = w.layout;
  if (l.mode != quant::Mode::affine || (l.bits != 4 && l.bits != 8) || in % l.group_size != 0 ||
      &ctx.k == &portable_kernels() || w.biases.dtype != w.scales.dtype ||
      (w.scales.dtype != DType::f32 && w.scales.dtype != DType::bf16 && w.scales.dtype != DType::f16))
    return nullptr;
  static const AffineKernel* const widest[] = {cpu_has_avx512_vnni() ? &affine_kernel_avx512_vnni() : nullptr,
                                               cpu_has_avx2() ? &affine_kernel_avx2() : nullptr};
  for (const AffineKernel* k : widest)
    if (k && in % (k->vector_lanes * 32 / l.bits) == 0) return k;
  return nullptr;
}

// Decode: every token row prepared once for the kernel, then each weight row dotted with all of
// them while its codes are in L1.
void linear_direct(const Context& ctx, const AffineKernel& kernel, const Tensor& x, const Weight& w, Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = y.dim(1);
  const AffineShape shape{in, w.layout.bits, w.layout.group_size, w.scales.dtype};
  // Token rows 64-byte aligned: the kernels read them in whole vectors. The buffer outlives the
  // call so that a decode step does not allocate once per layer.
  const int64_t stride = (affine_prepared_floats(in, shape.group_size) + 15) / 16 * 16;
  thread_local std::vector<float> buffer;
  buffer.resize(static_cast<size_t>(T * stride + 16));
  float* prepared = buffer.data() + (16 - reinterpret_cast<uintptr_t>(buffer.data()) / 4 % 16) % 16;
  ctx.parallel(T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) kernel.prepare(x.ptr<float>() + t * in, shape, prepared + t * stride);
  });
  const AffineRowsDot dot = kernel.rows_dot(shape);
  const int64_t words = w.codes.shape.back();
  const size_t scale_bytes = storage_bytes(w.scales.dtype, static_cast<uint64_t>(in / shape.group_size));
  const auto row_at = [&](int64_t o) {
    return AffineRow{w.codes.ptr<uint32_t>() + o * words, static_cast<const char*>(w.scales.data) + o * scale_bytes,
                     static_cast<const char*>(w.biases.data) + o * scale_bytes};
  };
  ctx.parallel(out, 8, [&](int64_t o0, int64_t o1) {
    // The thread's rows as kAffineRows runs read side by side (row i of every run per call), then
    // what is left one at a time.
    const int64_t run = (o1 - o0) / kAffineRows;
    AffineRow rows[kAffineRows];
    float dots[kAffineRows];
    for (int64_t i = 0; i < run; ++i) {
      for (int r = 0; r < kAffineRows; ++r) rows[r] = row_at(o0 + r * run + i);
      for (int64_t t = 0; t < T; ++t) {
        dot(prepared + t * stride, shape, rows, kAffineRows, dots);
        for (int r = 0; r < kAffineRows; ++r) y.ptr<float>()[t * out + o0 + r * run + i] = dots[r];
      }
    }
    for (int64_t o = o0 + kAffineRows * run; o < o1; ++o) {
      rows[0] = row_at(o);
      for (int64_t t = 0; t < T; ++t) {
        dot(prepared + t * stride, shape, rows, 1, dots);
        y.ptr<float>()[t * out + o] = dots[0];
      }
    }
  });
}

}  // namespace

void linear_quantized(const Context& ctx, const Tensor& x, const Weight& w, Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = y.dim(1);
  // Each row's codes stay in L1 while every token reads them; past a few dozen tokens a dequantized
  // f32 row is cheaper to share.
  if (const AffineKernel* kernel = T <= 64 ? direct_kernel(ctx, w, in) : nullptr)
    return linear_direct(ctx, *kernel, x, w, y);
  ctx.parallel(out, 8, [&](int64_t o0, int64_t o1) {
    thread_local std::vector<float> row;
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
