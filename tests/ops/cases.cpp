// The table of op cases: odd sizes (1, 3, 17, 63, 65, 127, tails past every vector width and block),
// every weight dtype, GQA and GDN head ratios, varlen batches with cache offsets and initial states,
// both GDN algorithms. Each case builds host inputs, runs ref on them and the backend under test
// on uploaded copies, and compares every output.
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/harness.h"

namespace qinfer::harness {
namespace {

// fp32 reassociation only: the backends differ from ref in summation order and exp/sqrt rounding.
constexpr double kTol = 1e-5;
constexpr DType kWeightTypes[] = {DType::f32, DType::bf16, DType::f16};

std::string seqs_str(const std::vector<int32_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); }

SeqLayout make_layout(const std::vector<int32_t>& lens, int64_t slots, Rng& rng) {
  SeqLayout layout;
  layout.cu_seqlens.push_back(0);
  for (int32_t len : lens) layout.cu_seqlens.push_back(layout.cu_seqlens.back() + len);
  std::vector<int32_t> slot(slots);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng.engine());
  layout.state_slot.assign(slot.begin(), slot.begin() + lens.size());
  return layout;
}

// Gives most sequences of `layout` a target slot of their own among the slots it leaves unused (every
// one but each third stays in place), as a step that leaves checkpoints behind does.
void move_targets(SeqLayout& layout, int64_t slots) {
  std::vector<int32_t> unused;
  for (int32_t slot = 0; slot < slots; ++slot)
    if (std::find(layout.state_slot.begin(), layout.state_slot.end(), slot) == layout.state_slot.end())
      unused.push_back(slot);
  layout.state_to = layout.state_slot;
  for (int64_t s = 0; s < layout.num_seqs(); ++s)
    if (s % 3 != 1) {
      QINFER_CHECK(!unused.empty(), "move_targets: too few slots");
      layout.state_to[static_cast<size_t>(s)] = unused.back();
      unused.pop_back();
    }
}

// `launch` as one step the dut records under `key` (a backend that records runs it once, records
// it the second time and replays it from the third): `out` as the step hands it back.
template <class Launch>
Tensor recorded_step(Ops& dut, const std::string& key, const Tensor& out, Launch&& launch) {
  dut.begin_step(key);
  try {
    launch();
  } catch (...) {
    dut.abort_step();
    throw;
  }
  return dut.end_step(out);
}

// Gives every other sequence with tokens (the first, the third, ...) a snapshot in a slot no one uses:
// alternately inside its tokens and after all of them.
void add_snapshots(SeqLayout& layout, int64_t slots) {
  std::vector<int32_t> unused;
  for (int32_t slot = 0; slot < slots; ++slot)
    if (std::find(layout.state_slot.begin(), layout.state_slot.end(), slot) == layout.state_slot.end() &&
        std::find(layout.state_to.begin(), layout.state_to.end(), slot) == layout.state_to.end())
      unused.push_back(slot);
  layout.snapshot_at.assign(static_cast<size_t>(layout.num_seqs()), 0);
  layout.snapshot_to.assign(static_cast<size_t>(layout.num_seqs()), -1);
  int64_t given = 0;
  for (int64_t s = 0; s < layout.num_seqs(); ++s) {
    const int32_t len = layout.cu_seqlens[static_cast<size_t>(s) + 1] - layout.cu_seqlens[static_cast<size_t>(s)];
    if (len == 0 || s % 2 == 1) continue;
    QINFER_CHECK(!unused.empty(), "add_snapshots: too few slots");
    layout.snapshot_at[static_cast<size_t>(s)] = given++ % 2 == 0 ? std::max(1, len / 2 + 3) : len;
    layout.snapshot_at[static_cast<size_t>(s)] = std::min(layout.snapshot_at[static_cast<size_t>(s)], len);
    layout.snapshot_to[static_cast<size_t>(s)] = unused.back();
    unused.pop_back();
  }
}

// How a case's sequences use their slots: in place, written elsewhere, and with snapshots as well.
enum class Slots { in_place, moved, snapshots };
std::string slots_str(Slots v) { return v == Slots::moved ? " moved" : v == Slots::snapshots ? " snapshots" : ""; }
void arrange_slots(SeqLayout& layout, int64_t slots, Slots v) {
  if (v != Slots::in_place) move_targets(layout, slots);
  if (v == Slots::snapshots) add_snapshots(layout, slots);
}

void add_linear(std::vector<Case>& cases) {
  struct Shape { int64_t T, in, out; };
  const Shape shapes[] = {{1, 1, 1},   {1, 63, 65},   {1, 127, 17},  {3, 17, 63},  {17, 65, 127},
                          {5, 1100, 19}, {1, 2055, 7}, {64, 96, 80}, {65, 127, 33}, {100, 300, 70},
                          {1, 4096, 515}, {31, 257, 200}, {32, 129, 47}, {17, 5000, 13},
                          // The GEMV tiles: every token count they are built for (1, 2, 4, 8 and less),
                          // rows past a tile's end, rows of several double-buffered batches.
                          {2, 2304, 33}, {3, 2304, 9}, {4, 132, 31}, {7, 64, 5}, {8, 516, 70}, {1, 1024, 3}};
  for (DType dt : kWeightTypes) {
    for (const Shape s : shapes) {
      cases.push_back({"linear", fmt::format("{} T={} in={} out={}", name(dt), s.T, s.in, s.out), [=](Run& r) {
                         Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.in});
                         Tensor w = random_tensor(r.rng, dt, {s.out, s.in}, 0.5f);
                         Tensor y_ref = host_tensor(DType::f32, {s.T, s.out});
                         r.ref.linear(x, w, y_ref);
                         Tensor y = r.dut.alloc(DType::f32, {s.T, s.out});
                         r.dut.linear(r.put(x), r.put(w), y);
                         r.compare("y", y, y_ref, kTol);
                       }});
    }
  }
}

// An MLX-quantized [rows..., in] weight, quantized from normal(0, 0.5) values by the reference quantizer.
Weight random_quantized(Rng& rng, const quant::Layout& layout, std::vector<int64_t> shape) {
  const int64_t in = shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  std::vector<int64_t> packed = shape, grouped = shape;
  packed.back() = quant::packed_words(in, layout.bits);
  grouped.back() = in / layout.group_size;
  const bool affine = layout.mode == quant::Mode::affine;
  Weight w;
  w.layout = layout;
  w.codes = host_tensor(DType::u32, packed);
  w.scales = host_tensor(affine ? DType::bf16 : DType::u8, grouped);
  if (affine) w.biases = host_tensor(DType::bf16, grouped);
  const int64_t groups = grouped.back();
  std::vector<float> row(in), scales(groups), biases(groups);
  std::vector<uint8_t> codes(groups);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = rng.normal(0.5f);
    quant::quantize_row(layout, row.data(), in, w.codes.ptr<uint32_t>() + r * packed.back(), scales.data(),
                        biases.data(), codes.data());
    for (int64_t g = 0; g < groups; ++g) {
      if (affine) {
        w.scales.ptr<uint16_t>()[r * groups + g] = f32_to_bf16(scales[g]);
        w.biases.ptr<uint16_t>()[r * groups + g] = f32_to_bf16(biases[g]);
      } else {
        w.scales.ptr<uint8_t>()[r * groups + g] = codes[g];
      }
    }
  }
  return w;
}

// Quantized weights reach the device through the same transfers as any tensor.
Weight put_weight(Run& r, const Weight& w) {
  Weight out = w;
  out.codes = r.put(w.codes);
  out.scales = r.put(w.scales);
  if (w.biases.data) out.biases = r.put(w.biases);
  return out;
}

// Every MLX format and affine width: decode (T=1, the direct dot), small and prefill token counts.
void add_linear_quantized(std::vector<Case>& cases) {
  std::vector<quant::Layout> layouts;
  for (int bits : {2, 3, 4, 5, 6, 8}) layouts.push_back({quant::Mode::affine, bits, bits == 3 ? 32 : 64});
  // Every group size of the direct 4/8-bit dots (groups narrower than, equal to and wider than a block).
  for (int group : {32, 128}) layouts.push_back({quant::Mode::affine, 4, group});
  for (int group : {32, 128}) layouts.push_back({quant::Mode::affine, 8, group});
  layouts.push_back({quant::Mode::mxfp4, 4, 32});
  layouts.push_back({quant::Mode::nvfp4, 4, 16});
  layouts.push_back({quant::Mode::mxfp8, 8, 32});
  for (const quant::Layout& layout : layouts) {
    // in = 192: a whole number of AVX2 blocks but not of AVX-512 ones (4-bit), so both kernels run.
    // in = 2304 with T = 1, 2, 8: rows of several (and a partial) double-buffered batches of the GEMV tiles.
    for (const std::pair<int64_t, int64_t>& shape : {std::pair<int64_t, int64_t>{1, 256}, {5, 256}, {70, 256}, {3, 192},
                                                      {1, 2304}, {2, 2304}, {8, 2304}}) {
      const int64_t T = shape.first, in = shape.second;  // plain names: clang 14 cannot capture bindings
      if (in % layout.group_size != 0) continue;
      const int64_t out = 67;
      cases.push_back({"linear", fmt::format("{} {}-bit g{} T={} in={} out={}", quant::traits(layout.mode).name,
                                             layout.bits, layout.group_size, T, in, out),
                       [=](Run& r) {
                         Tensor x = random_tensor(r.rng, DType::f32, {T, in});
                         Weight w = random_quantized(r.rng, layout, {out, in});
                         Tensor y_ref = host_tensor(DType::f32, {T, out});
                         r.ref.linear(x, w, y_ref);
                         Tensor y = r.dut.alloc(DType::f32, {T, out});
                         r.dut.linear(r.put(x), put_weight(r, w), y);
                         r.compare("y", y, y_ref, kTol);
                         Tensor ids = i32_tensor({3}, {0, out - 1, 7});
                         Tensor e_ref = host_tensor(DType::f32, {3, in});
                         r.ref.embedding(ids, w, e_ref);
                         Tensor e = r.dut.alloc(DType::f32, {3, in});
                         r.dut.embedding(r.put(ids), put_weight(r, w), e);
                         r.compare("embedding", e, e_ref, 0.0);
                       }});
    }
  }
}

// The tensor-core GEMV (dense bf16, affine 4/8-bit, in a multiple of 64): one-mma token counts
// (1, 2: token × piece columns) and one mma per piece (3, 5, 8); rows past its 16- and 32-row tiles;
// rows of one group up to many groups split across warps (in = 4096 + 64 and more); f16 and f32
// scales. "wide x" rows mix magnitudes from 1e-3 to 1e4, which only an exact split of the
// activations into bf16 pieces keeps within tolerance (one bf16 rounding would cost ~1e-3).
Tensor wide_range_x(Rng& rng, int64_t T, int64_t in) {
  Tensor x = host_tensor(DType::f32, {T, in});
  for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = rng.normal() * std::pow(10.0f, rng.uniform(-3.0f, 4.0f));
  return x;
}

// w with its affine scales and biases stored as `dtype` (the values of the bf16 ones, which f16 and f32 hold).
Weight with_scale_dtype(const Weight& w, DType dtype) {
  if (dtype == DType::bf16) return w;
  Weight out = w;
  auto convert = [&](const Tensor& bf16) {
    Tensor t = host_tensor(dtype, bf16.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = bf16_to_f32(bf16.ptr<uint16_t>()[i]);
      if (dtype == DType::f32) t.ptr<float>()[i] = v;
      else t.ptr<uint16_t>()[i] = f32_to_f16(v);
    }
    return t;
  };
  out.scales = convert(w.scales);
  out.biases = convert(w.biases);
  return out;
}

// `linear` over MLX affine weights of every width and group size, for each shape the group divides
// (scale dtypes bf16, f16, f32 in turn), against the reference. `kernel` names the path in the case
// names: "mma" (tensor-core tiles) or "gemv" (one token, which also names x's scale).
struct AffineShape {
  int64_t T, in, out;
  bool wide;
  float x_scale = 1.0f;
};
void add_affine_linear(std::vector<Case>& cases, const std::string& kernel, std::span<const AffineShape> shapes) {
  constexpr DType kScaleTypes[] = {DType::bf16, DType::f16, DType::f32};
  for (int bits : {4, 8}) {
    for (int group : {32, 64, 128}) {
      const quant::Layout layout{quant::Mode::affine, bits, group};
      int n = 0;
      for (const AffineShape& s : shapes) {
        if (s.in % group != 0) continue;
        const DType scale_type = kScaleTypes[n++ % 3];
        std::string label = fmt::format("{} affine {}-bit g{} {} scales T={} in={} out={}{}", kernel, bits, group,
                                        name(scale_type), s.T, s.in, s.out, s.wide ? " wide x" : "");
        if (kernel == "gemv") label += fmt::format(" x·{:g}", s.x_scale);
        cases.push_back({"linear", label, [=](Run& r) {
                           Tensor x = s.wide ? wide_range_x(r.rng, s.T, s.in)
                                             : random_tensor(r.rng, DType::f32, {s.T, s.in});
                           for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] *= s.x_scale;
                           Weight w = with_scale_dtype(random_quantized(r.rng, layout, {s.out, s.in}), scale_type);
                           Tensor y_ref = host_tensor(DType::f32, {s.T, s.out});
                           r.ref.linear(x, w, y_ref);
                           Tensor y = r.dut.alloc(DType::f32, {s.T, s.out});
                           r.dut.linear(r.put(x), put_weight(r, w), y);
                           r.compare("y", y, y_ref, kTol);
                         }});
      }
    }
  }
}

void add_linear_mma(std::vector<Case>& cases) {
  const AffineShape shapes[] = {{1, 64, 7, false},     {2, 128, 33, false},  {3, 640, 45, true},    {5, 256, 16, false},
                          {8, 4160, 50, true},   {1, 4224, 97, true},  {2, 1024, 31, true},   {8, 128, 1, false},
                          {5, 4160, 64, false},  {3, 4224, 19, false}};
  for (const AffineShape& s : shapes) {
    cases.push_back({"linear", fmt::format("mma bf16 T={} in={} out={}{}", s.T, s.in, s.out, s.wide ? " wide x" : ""),
                     [=](Run& r) {
                       Tensor x = s.wide ? wide_range_x(r.rng, s.T, s.in) : random_tensor(r.rng, DType::f32, {s.T, s.in});
                       Tensor w = random_tensor(r.rng, DType::bf16, {s.out, s.in}, 0.5f);
                       Tensor y_ref = host_tensor(DType::f32, {s.T, s.out});
                       r.ref.linear(x, w, y_ref);
                       Tensor y = r.dut.alloc(DType::f32, {s.T, s.out});
                       r.dut.linear(r.put(x), r.put(w), y);
                       r.compare("y", y, y_ref, kTol);
                     }});
  }
  add_affine_linear(cases, "mma", shapes);
}

// The one-token affine 4/8-bit GEMV (gemv_affine.cu): rows of one chunk to tens of thousands, row
// lengths from one chunk to many per lane (in = 60032: past what the kernel takes, so the tiles run),
// short row tiles, x magnitudes from 1e-23 to 1e24 (each x chunk gets its own exponent).
// Through linear_many: matrices of one layout in one launch (rows of each past a tile's end), and
// mixed group sizes (matrix by matrix).
void add_linear_gemv_affine(std::vector<Case>& cases) {
  const AffineShape shapes[] = {{1, 64, 7, false},          {1, 128, 4501, false},  {1, 3136, 4300, true},
                                {1, 256, 2500, true},        {1, 4608, 2200, false}, {1, 4160, 1000, false},
                                {1, 4224, 97, true},         {1, 12288, 33, false},  {1, 1024, 3, true, 1e20f},
                                {1, 2048, 5, true, 1e-20f},  {1, 60032, 3, false},   {1, 16640, 45, true},
                                {1, 1536, 30011, false},     {1, 256, 8500, false}};
  add_affine_linear(cases, "gemv", shapes);
  struct Many {
    int bits;
    std::vector<int> groups;  // one per matrix
    DType scale_type;
    int64_t in;
    std::vector<int64_t> outs;
  };
  const Many batches[] = {{4, {64, 64, 64}, DType::bf16, 4096, {1025, 7, 1026}},
                          {4, {32, 32, 32, 32}, DType::f32, 16640, {9, 1, 300, 2}},
                          {8, {64, 64}, DType::f16, 3136, {50, 3}},
                          {8, {128, 128, 128}, DType::bf16, 1024, {4, 4096, 13}},
                          {4, {64, 32}, DType::bf16, 256, {33, 40}}};
  for (const Many& m : batches) {
    cases.push_back({"linear_many", fmt::format("gemv affine {}-bit g{} {} scales T=1 in={} outs=[{}]", m.bits,
                                                fmt::join(m.groups, "/"), name(m.scale_type), m.in, fmt::join(m.outs, ",")),
                     [=](Run& r) {
                       Tensor x = wide_range_x(r.rng, 1, m.in);
                       std::vector<Weight> host, device;
                       std::vector<Tensor> want, got;
                       for (size_t i = 0; i < m.outs.size(); ++i) {
                         const quant::Layout layout{quant::Mode::affine, m.bits, m.groups[i]};
                         host.push_back(with_scale_dtype(random_quantized(r.rng, layout, {m.outs[i], m.in}), m.scale_type));
                         device.push_back(put_weight(r, host.back()));
                         want.push_back(host_tensor(DType::f32, {1, m.outs[i]}));
                         r.ref.linear(x, host.back(), want.back());
                         got.push_back(r.dut.alloc(DType::f32, {1, m.outs[i]}));
                       }
                       std::vector<const Weight*> ws;
                       std::vector<Tensor*> ys;
                       for (size_t i = 0; i < m.outs.size(); ++i) ws.push_back(&device[i]), ys.push_back(&got[i]);
                       r.dut.linear_many(r.put(x), ws, ys);
                       for (size_t i = 0; i < m.outs.size(); ++i) r.compare(fmt::format("y{}", i), got[i], want[i], kTol);
                     }});
  }
}

void add_embedding(std::vector<Case>& cases) {
  struct Shape { int64_t V, H, T; };
  for (DType dt : kWeightTypes) {
    for (const Shape s : {Shape{1, 1, 1}, Shape{50, 63, 7}, Shape{1000, 65, 33}, Shape{300, 1024, 40}, Shape{20, 4100, 2}}) {
      cases.push_back({"embedding", fmt::format("{} V={} H={} T={}", name(dt), s.V, s.H, s.T), [=](Run& r) {
                         std::vector<int32_t> ids(s.T);
                         for (auto& id : ids) id = static_cast<int32_t>(r.rng.integer(0, s.V - 1));
                         Tensor table = random_tensor(r.rng, dt, {s.V, s.H});
                         Tensor idt = i32_tensor({s.T}, ids);
                         Tensor out_ref = host_tensor(DType::f32, {s.T, s.H});
                         r.ref.embedding(idt, table, out_ref);
                         Tensor out = r.dut.alloc(DType::f32, {s.T, s.H});
                         r.dut.embedding(r.put(idt), r.put(table), out);
                         r.compare("out", out, out_ref, 0.0);
                       }});
    }
  }
}

void add_norms(std::vector<Case>& cases) {
  struct Shape { int64_t N, D; };
  // Multiples of 4 up to 512 take a warp per row, longer ones up to 8192 a block, both from
  // registers (every count of float4s per thread); the rest a general loop.
  const Shape shapes[] = {{1, 1},     {3, 17},   {17, 63},  {5, 64},   {33, 128}, {9, 256},  {4, 384}, {7, 1024},
                          {40, 1000}, {1, 2048}, {1, 4096}, {3, 5120}, {2, 8192}, {2, 8196}, {3, 2050}};
  for (const Shape s : shapes) {
    const std::string p = fmt::format("N={} D={}", s.N, s.D);
    cases.push_back({"rms_norm", p, [=](Run& r) {
                       Tensor x = random_tensor(r.rng, DType::f32, {s.N, s.D}, 3.0f);
                       Tensor w = random_tensor(r.rng, DType::f32, {s.D});
                       Tensor y_ref = host_tensor(DType::f32, {s.N, s.D});
                       r.ref.rms_norm(x, w, 1e-6f, y_ref);
                       Tensor y = r.dut.alloc(DType::f32, {s.N, s.D});
                       r.dut.rms_norm(r.put(x), r.put(w), 1e-6f, y);
                       r.compare("y", y, y_ref, kTol);
                       Tensor xy = r.put(x);  // in place: y aliases x
                       r.dut.rms_norm(xy, r.put(w), 1e-6f, xy);
                       r.compare("y=x", xy, y_ref, kTol);
                     }});
    cases.push_back({"add_rms_norm", p, [=](Run& r) {
                       Tensor x = random_tensor(r.rng, DType::f32, {s.N, s.D}, 3.0f);
                       Tensor delta = random_tensor(r.rng, DType::f32, {s.N, s.D});
                       Tensor w = random_tensor(r.rng, DType::f32, {s.D});
                       Tensor y_ref = host_tensor(DType::f32, {s.N, s.D});
                       Tensor x_dut = r.put(x);
                       r.ref.add_rms_norm(x, delta, w, 1e-6f, y_ref);
                       Tensor y = r.dut.alloc(DType::f32, {s.N, s.D});
                       r.dut.add_rms_norm(x_dut, r.put(delta), r.put(w), 1e-6f, y);
                       r.compare("x", x_dut, x, 0.0);
                       r.compare("y", y, y_ref, kTol);
                     }});
    cases.push_back({"rms_norm_gated", p, [=](Run& r) {
                       Tensor x = random_tensor(r.rng, DType::f32, {s.N, s.D});
                       Tensor z = random_tensor(r.rng, DType::f32, {s.N, s.D}, 3.0f);
                       Tensor w = random_tensor(r.rng, DType::f32, {s.D});
                       Tensor y_ref = host_tensor(DType::f32, {s.N, s.D});
                       r.ref.rms_norm_gated(x, z, w, 1e-6f, y_ref);
                       Tensor y = r.dut.alloc(DType::f32, {s.N, s.D});
                       r.dut.rms_norm_gated(r.put(x), r.put(z), r.put(w), 1e-6f, y);
                       r.compare("y", y, y_ref, kTol);
                     }});
    cases.push_back({"l2_norm", p, [=](Run& r) {
                       Tensor x = random_tensor(r.rng, DType::f32, {s.N, s.D}, 0.5f);
                       const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
                       Tensor y_ref = host_tensor(DType::f32, {s.N, s.D});
                       r.ref.l2_norm(x, 1e-6f, scale, y_ref);
                       Tensor xy = r.put(x);
                       r.dut.l2_norm(xy, 1e-6f, scale, xy);
                       r.compare("y=x", xy, y_ref, kTol);
                     }});
  }
}

void add_rope(std::vector<Case>& cases) {
  struct Shape {
    int64_t T, heads, head_dim, rotary;
    double theta;
    std::vector<int64_t> section;
    int32_t max_pos;
    std::optional<YarnParams> yarn = {};
  };
  // Rotary halves of 1-32, 33-64, 65-128 and 129-256 frequencies; for rms_norm_rope also features
  // past rotary_dim: none, up to 64, up to 256 and more (Qwen3-Next / Qwen3.5 rotate 64 of 256).
  // YaRN as Qwen3's model card sets it, and over partial rotary dims with MRoPE (Qwen3.5).
  const YarnParams qwen3_yarn{.factor = 4.0, .original_max_positions = 32768};
  const YarnParams qwen3_5_yarn{.factor = 4.0, .original_max_positions = 262144};
  const YarnParams short_yarn{.factor = 4.0, .original_max_positions = 32};  // the golden qwen3_yarn's
  const std::vector<Shape> shapes = {{1, 1, 2, 2, 1e4, {}, 10},
                                     {3, 4, 64, 64, 1e6, {}, 5000},
                                     {17, 3, 256, 64, 1e7, {11, 11, 10}, 100000},
                                     {5, 2, 128, 128, 5e6, {24, 20, 20}, 3000},
                                     {7, 2, 18, 10, 1e4, {}, 100},
                                     {65, 8, 128, 128, 1e6, {}, 40000},
                                     {1, 32, 128, 128, 1e6, {}, 40000},
                                     {1, 8, 128, 128, 1e6, {}, 40000},
                                     {9, 3, 256, 256, 1e7, {}, 100000},
                                     {2, 3, 600, 512, 1e4, {}, 1000},
                                     {3, 2, 800, 200, 1e4, {}, 1000},
                                     {1, 5, 256, 64, 1e7, {11, 11, 10}, 100000},
                                     {65, 8, 128, 128, 1e6, {}, 131072, qwen3_yarn},
                                     {17, 3, 256, 64, 1e7, {11, 11, 10}, 1000000, qwen3_5_yarn},
                                     {5, 2, 32, 8, 1e7, {2, 1, 1}, 128, short_yarn}};
  for (const Shape& s : shapes) {
    const std::string p = fmt::format("T={} heads={} hd={} rot={} mrope={}{}", s.T, s.heads, s.head_dim, s.rotary,
                                      s.section.empty() ? "no" : "yes", s.yarn ? " yarn" : "");
    const RopeParams params{s.rotary, s.theta, s.section, s.yarn};
    auto positions_for = [s](Rng& rng) {
      std::vector<int32_t> pos(3 * s.T);
      for (int64_t t = 0; t < s.T; ++t) {
        pos[t] = static_cast<int32_t>(rng.integer(0, s.max_pos));
        for (int axis = 1; axis < 3; ++axis)
          pos[axis * s.T + t] = s.section.empty() ? pos[t] : static_cast<int32_t>(rng.integer(0, s.max_pos));
      }
      return i32_tensor({3, s.T}, pos);
    };
    cases.push_back({"rope", p, [=](Run& r) {
                       Tensor positions = positions_for(r.rng);
                       Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.heads, s.head_dim});
                       Tensor x_dut = r.put(x);
                       r.ref.rope(x, positions, params);
                       r.dut.rope(x_dut, r.put(positions), params);
                       r.compare("x", x_dut, x, kTol);
                     }});
    cases.push_back({"rms_norm_rope", p, [=](Run& r) {
                       Tensor positions = positions_for(r.rng);
                       Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.heads, s.head_dim}, 3.0f);
                       Tensor w = random_tensor(r.rng, DType::f32, {s.head_dim});
                       Tensor x_dut = r.put(x);
                       r.ref.rms_norm_rope(x, w, 1e-6f, positions, params);
                       r.dut.rms_norm_rope(x_dut, r.put(w), 1e-6f, r.put(positions), params);
                       r.compare("x", x_dut, x, kTol);
                     }});
  }
}

void add_elementwise(std::vector<Case>& cases) {
  const std::vector<std::vector<int64_t>> shapes = {{1}, {17}, {3, 333}, {70001}};
  for (const auto& shape : shapes) {
    const std::string p = fmt::format("[{}]", fmt::join(shape, ", "));
    cases.push_back({"silu_mul", p, [=](Run& r) {
                       Tensor gate = random_tensor(r.rng, DType::f32, shape, 4.0f);
                       Tensor up = random_tensor(r.rng, DType::f32, shape);
                       Tensor out_ref = host_tensor(DType::f32, shape);
                       r.ref.silu_mul(gate, up, out_ref);
                       Tensor out = r.dut.alloc(DType::f32, shape);
                       r.dut.silu_mul(r.put(gate), r.put(up), out);
                       r.compare("out", out, out_ref, kTol);
                       Tensor up_dut = r.put(up);  // out aliases up
                       r.dut.silu_mul(r.put(gate), up_dut, up_dut);
                       r.compare("out=up", up_dut, out_ref, kTol);
                     }});
    cases.push_back({"sigmoid_mul", p, [=](Run& r) {
                       Tensor x = random_tensor(r.rng, DType::f32, shape);
                       Tensor gate = random_tensor(r.rng, DType::f32, shape, 4.0f);
                       Tensor x_dut = r.put(x);
                       r.ref.sigmoid_mul(x, gate);
                       r.dut.sigmoid_mul(x_dut, r.put(gate));
                       r.compare("x", x_dut, x, kTol);
                     }});
    cases.push_back({"add", p, [=](Run& r) {
                       Tensor x = random_tensor(r.rng, DType::f32, shape);
                       Tensor y = random_tensor(r.rng, DType::f32, shape);
                       Tensor x_dut = r.put(x);
                       r.ref.add(x, y);
                       r.dut.add(x_dut, r.put(y));
                       r.compare("x", x_dut, x, 0.0);
                     }});
  }
  cases.push_back({"sigmoid_mul", "per-row gate [65, 1] on [65, 300]", [](Run& r) {
                     Tensor x = random_tensor(r.rng, DType::f32, {65, 300});
                     Tensor gate = random_tensor(r.rng, DType::f32, {65, 1}, 3.0f);
                     Tensor x_dut = r.put(x);
                     r.ref.sigmoid_mul(x, gate);
                     r.dut.sigmoid_mul(x_dut, r.put(gate));
                     r.compare("x", x_dut, x, kTol);
                   }});
}

// Prefill batches may run on TF32 tensor cores (11-bit operands, f32 accumulation): with unit-normal
// q, k, v the output's relative RMS error is 3-4e-4 (a host emulation of the kernel), so 2e-3.
constexpr double kTf32Tol = 2e-3;

// kv_store then attention over a shuffled paged pool whose other slots hold random data.
void add_attention(std::vector<Case>& cases) {
  struct Shape {
    int64_t heads, kv_heads, head_dim;
    int32_t block_size;
    std::vector<int32_t> lens, cached;
    double tol = kTol;
  };
  const std::vector<Shape> shapes = {
      {8, 8, 64, 16, {1}, {0}},                                    // first token
      {4, 2, 64, 16, {1}, {37}},                                   // decode, GQA 2
      {8, 2, 128, 16, {1}, {700}},                                 // decode, GQA 4, key-split path
      {6, 3, 32, 4, {3}, {1100}},                                  // several splits, small pages
      {2, 1, 20, 7, {5, 1, 9}, {3, 0, 30}},                        // odd head_dim and page size, varlen
      {8, 2, 64, 16, {33, 17, 1, 64}, {0, 40, 100, 3}, kTf32Tol},  // prefill blocks + decode in one batch
      {4, 4, 16, 5, {0, 6}, {5, 2}},                               // an empty sequence
      {4, 1, 256, 32, {2, 1}, {1000, 1500}},                       // head_dim 256, GQA 4
      {8, 8, 32, 16, {40, 3}, {0, 9}},                             // prefill of a head_dim without MMA kernel
      // Prefill (tensor-core path where the backend has one): partial last tiles, cached prefixes,
      // page-spanning key tiles with odd page sizes, decode rows in the same batch.
      {32, 8, 128, 16, {300}, {0}, kTf32Tol},                      // GQA 4, T not a tile multiple
      {16, 2, 128, 16, {77, 130, 1}, {50, 0, 400}, kTf32Tol},      // GQA 8, cached prefixes
      {8, 2, 128, 5, {70, 20, 3}, {13, 0, 200}, kTf32Tol},         // 5-token pages
      {16, 4, 256, 16, {100, 37}, {20, 300}, kTf32Tol},            // head_dim 256, GQA 4
      {8, 1, 256, 7, {50, 9}, {33, 0}, kTf32Tol},                  // head_dim 256, GQA 8, 7-token pages
      {4, 4, 64, 16, {129}, {0}, kTf32Tol},                        // no GQA
      {32, 8, 128, 7, {1, 17, 100, 300}, {0, 5, 64, 130}, kTf32Tol},  // varlen, lengths off the tile
      {4, 4, 128, 5, {100, 17}, {0, 200}, kTf32Tol},               // head_dim 128 without GQA
      {16, 2, 64, 5, {17, 100}, {0, 77}, kTf32Tol},                // head_dim 64, GQA 8, 5-token pages
      {8, 8, 256, 16, {300, 1}, {40, 0}, kTf32Tol},                // head_dim 256 without GQA
      // A short chunk after a long cached prefix (a prefix-cache hit): few query tiles, whose keys
      // the backend may split among blocks.
      {32, 8, 128, 16, {80}, {3000}, kTf32Tol},                    // GQA 4: 3 tiles of 8 kv heads
      {16, 4, 256, 16, {40, 20}, {2500, 700}, kTf32Tol},           // head_dim 256, two lengths of prefix
      {8, 2, 64, 7, {50, 40}, {1800, 0}, kTf32Tol},                // head_dim 64, 7-token pages, a cold one
      // Decode (one token per sequence; sequences of few keys leave key splits empty) and
      // speculative verification (2-8 tokens per sequence): the flash-decoding kernel where the
      // backend has one, its tiles of 1-8 rows, GQA 1 / 4 / 8.
      {32, 8, 128, 16, {1, 1, 1, 1, 1, 1, 1}, {0, 1, 31, 32, 33, 200, 1000}},  // GQA 4
      {16, 2, 64, 5, {1, 1, 1, 1, 1, 1, 1}, {1000, 0, 33, 1, 200, 31, 32}},    // head_dim 64, GQA 8
      {8, 8, 256, 7, {1, 1, 1, 1, 1, 1, 1}, {31, 1000, 0, 200, 33, 1, 32}},    // head_dim 256, no GQA
      {16, 4, 256, 16, {1, 1}, {1000, 33}},                                    // head_dim 256, GQA 4
      {8, 1, 256, 5, {1, 1}, {200, 31}},                    // head_dim 256, GQA 8: two tiles of 4 rows
      {4, 4, 128, 7, {1, 1, 1}, {32, 1000, 0}},             // head_dim 128, one row per tile
      {8, 4, 64, 16, {1, 1}, {1, 200}},                     // head_dim 64, two rows per tile
      {32, 8, 128, 7, {2, 8, 5, 3}, {0, 33, 1000, 31}},     // verification, GQA 4: four tiles of 8
      {16, 2, 128, 16, {7, 2}, {40, 300}},                  // verification, GQA 8
      {8, 8, 64, 5, {8, 4, 1}, {200, 0, 32}},               // verification, no GQA
      {16, 4, 256, 7, {4, 8, 2}, {1, 200, 1000}},           // verification, head_dim 256
  };
  // Every shape over an f32 pool and over a bf16 one (the cuda backend's fast precision): kv_store
  // rounds to nearest even exactly as ref, and the kernels widen what they read.
  for (const Shape& s : shapes) {
   for (const DType kv : {DType::f32, DType::bf16}) {
    cases.push_back({"attention",
                     fmt::format("{} pool h={} kv={} hd={} bs={} lens={} cached={}", name(kv), s.heads, s.kv_heads,
                                 s.head_dim, s.block_size, seqs_str(s.lens), seqs_str(s.cached)),
                     [=](Run& r) {
                       AttentionLayout layout;
                       layout.seqs = make_layout(s.lens, static_cast<int64_t>(s.lens.size()), r.rng);
                       layout.cached = s.cached;
                       layout.block_size = s.block_size;
                       int32_t total_blocks = 0;
                       for (size_t i = 0; i < s.lens.size(); ++i) {
                         const int32_t blocks = (s.cached[i] + s.lens[i] + s.block_size - 1) / s.block_size;
                         layout.max_blocks = std::max(layout.max_blocks, blocks + 1);
                         total_blocks += blocks;
                       }
                       const int64_t num_blocks = total_blocks + 3;
                       std::vector<int32_t> physical(num_blocks);
                       std::iota(physical.begin(), physical.end(), 0);
                       std::shuffle(physical.begin(), physical.end(), r.rng.engine());
                       layout.block_table.assign(s.lens.size() * layout.max_blocks, -1);
                       int32_t next = 0;
                       for (size_t i = 0; i < s.lens.size(); ++i)
                         for (int32_t b = 0; b < (s.cached[i] + s.lens[i] + s.block_size - 1) / s.block_size; ++b)
                           layout.block_table[i * layout.max_blocks + b] = physical[next++];

                       const int64_t T = layout.seqs.num_tokens();
                       const std::vector<int64_t> pool_shape = {num_blocks, s.block_size, s.kv_heads, s.head_dim};
                       KvPool pool{random_tensor(r.rng, kv, pool_shape), random_tensor(r.rng, kv, pool_shape)};
                       KvPool pool_dut{r.put(pool.k), r.put(pool.v)};
                       Tensor k = random_tensor(r.rng, DType::f32, {T, s.kv_heads, s.head_dim});
                       Tensor v = random_tensor(r.rng, DType::f32, {T, s.kv_heads, s.head_dim});
                       Tensor q = random_tensor(r.rng, DType::f32, {T, s.heads, s.head_dim});
                       r.ref.kv_store(k, v, layout, pool);
                       r.dut.kv_store(r.put(k), r.put(v), layout, pool_dut);
                       r.compare("pool.k", pool_dut.k, pool.k, 0.0);
                       r.compare("pool.v", pool_dut.v, pool.v, 0.0);
                       const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
                       Tensor out_ref = host_tensor(DType::f32, {T, s.heads, s.head_dim});
                       r.ref.attention(q, pool, layout, scale, out_ref);
                       Tensor out = r.dut.alloc(DType::f32, {T, s.heads, s.head_dim});
                       r.dut.attention(r.put(q), pool_dut, layout, scale, out);
                       r.compare("out", out, out_ref, s.tol);
                     }});
   }
  }
  // Recorded decode steps (CUDA graphs: the first runs as is, the second is recorded, the third
  // replayed) plan their key splits for the block table's capacity, here far above most keys.
  for (const DType kv : {DType::f32, DType::bf16})
  cases.push_back({"attention", fmt::format("recorded decode {} pool h=32 kv=8 hd=128 bs=16, 64 blocks per sequence",
                                            name(kv)), [kv](Run& r) {
                     const int64_t S = 3, heads = 32, kv_heads = 8, head_dim = 128;
                     AttentionLayout layout;
                     layout.seqs = make_layout({1, 1, 1}, S, r.rng);
                     layout.block_size = 16, layout.max_blocks = 64;
                     layout.block_table.resize(S * layout.max_blocks);
                     std::iota(layout.block_table.begin(), layout.block_table.end(), 0);
                     std::shuffle(layout.block_table.begin(), layout.block_table.end(), r.rng.engine());
                     const std::vector<int64_t> pool_shape = {S * layout.max_blocks, layout.block_size, kv_heads,
                                                              head_dim};
                     KvPool pool{random_tensor(r.rng, kv, pool_shape), random_tensor(r.rng, kv, pool_shape)};
                     KvPool pool_dut{r.put(pool.k), r.put(pool.v)};
                     Tensor q = random_tensor(r.rng, DType::f32, {S, heads, head_dim});
                     Tensor q_dut = r.put(q);
                     Tensor out = r.dut.alloc(DType::f32, {S, heads, head_dim});
                     const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
                     const std::vector<std::vector<int32_t>> steps = {{0, 31, 200}, {33, 1000, 1}, {1023, 5, 64}};
                     for (size_t i = 0; i < steps.size(); ++i) {
                       layout.cached = steps[i];
                       Tensor out_ref = host_tensor(DType::f32, {S, heads, head_dim});
                       r.ref.attention(q, pool, layout, scale, out_ref);
                       // The key names what shapes the launches: the pool's dtype among them.
                       const Tensor got =
                           recorded_step(r.dut, fmt::format("op_harness recorded attention decode {}", name(kv)), out,
                                         [&] { r.dut.attention(q_dut, pool_dut, layout, scale, out); });
                       r.compare(fmt::format("out step {} cached={}", i, seqs_str(steps[i])), got, out_ref, kTol);
                     }
                   }});
}

void add_moe(std::vector<Case>& cases) {
  struct Route { int64_t T, E, k; bool renormalize; };
  for (const Route s : {Route{1, 8, 2, true}, Route{17, 64, 8, true}, Route{5, 128, 8, false}, Route{3, 7, 7, false}}) {
    cases.push_back({"moe_route", fmt::format("T={} E={} k={} renorm={}", s.T, s.E, s.k, s.renormalize), [=](Run& r) {
                       Tensor logits = random_tensor(r.rng, DType::f32, {s.T, s.E}, 2.0f);
                       Tensor ids_ref = host_tensor(DType::i32, {s.T, s.k});
                       Tensor w_ref = host_tensor(DType::f32, {s.T, s.k});
                       r.ref.moe_route(logits, s.renormalize, ids_ref, w_ref);
                       Tensor ids = r.dut.alloc(DType::i32, {s.T, s.k});
                       Tensor w = r.dut.alloc(DType::f32, {s.T, s.k});
                       r.dut.moe_route(r.put(logits), s.renormalize, ids, w);
                       Tensor ids_host = r.get(ids);
                       r.compare_ids("ids", {ids_host.ptr<int32_t>(), ids_host.ptr<int32_t>() + s.T * s.k},
                                     {ids_ref.ptr<int32_t>(), ids_ref.ptr<int32_t>() + s.T * s.k});
                       r.compare("weights", w, w_ref, kTol);
                     }});
  }
  // Each token picks k distinct experts among the first `used`: fewer than E leaves experts without
  // tokens, used = k sends every token to the same k. The cuda backend runs one token, and batches
  // whose slots are fewer than half the experts, per slot; larger batches grouped by expert on the
  // device (more than 8 slots of an expert take further passes over its rows); from T = 128 GEMMs
  // per expert, where odd H pads the expert blocks and bf16 experts then take the dequantizing path.
  struct Experts { int64_t T, H, I, E, k, used; };
  const auto label = [](const Experts& s) {
    return fmt::format("T={} H={} I={} E={} k={}{}", s.T, s.H, s.I, s.E, s.k,
                       s.used < s.E ? fmt::format(" used={}", s.used) : "");
  };
  const auto check = [](Run& r, const Experts& s, const Weight& gate, const Weight& up, const Weight& down) {
    std::vector<int32_t> ids(s.T * s.k), experts(s.used);
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t t = 0; t < s.T; ++t) {
      std::shuffle(experts.begin(), experts.end(), r.rng.engine());
      std::copy_n(experts.begin(), s.k, ids.begin() + t * s.k);
    }
    Tensor idt = i32_tensor({s.T, s.k}, ids);
    Tensor weights = host_tensor(DType::f32, {s.T, s.k});
    for (int64_t i = 0; i < s.T * s.k; ++i) weights.ptr<float>()[i] = r.rng.uniform(0.05f, 1.0f);
    Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.H});
    Tensor out_ref = host_tensor(DType::f32, {s.T, s.H});
    r.ref.moe_experts(x, idt, weights, gate, up, down, out_ref);
    const auto put = [&](const Weight& w) { return w.quantized() ? put_weight(r, w) : Weight(r.put(w.dense)); };
    Tensor out = r.dut.alloc(DType::f32, {s.T, s.H});
    r.dut.moe_experts(r.put(x), r.put(idt), r.put(weights), put(gate), put(up), put(down), out);
    r.compare("out", out, out_ref, kTol);
  };
  const Experts shapes[] = {{1, 64, 32, 8, 2, 8},     {5, 63, 17, 4, 2, 4},      {33, 64, 48, 16, 4, 16},
                            {70, 33, 20, 3, 3, 3},    {300, 256, 96, 16, 4, 16}, {300, 256, 96, 16, 4, 8},
                            {200, 256, 96, 16, 1, 1}, {130, 65, 40, 8, 3, 8},  {3, 64, 32, 64, 2, 64},
                            {64, 128, 64, 8, 2, 2},   {24, 128, 40, 32, 4, 12}};
  for (DType dt : kWeightTypes) {
    for (const Experts s : shapes) {
      cases.push_back({"moe_experts", fmt::format("{} {}", name(dt), label(s)), [=](Run& r) {
                         Tensor gate = random_tensor(r.rng, dt, {s.E, s.I, s.H}, 0.3f);
                         Tensor up = random_tensor(r.rng, dt, {s.E, s.I, s.H}, 0.3f);
                         Tensor down = random_tensor(r.rng, dt, {s.E, s.H, s.I}, 0.3f);
                         check(r, s, gate, up, down);
                       }});
    }
  }
  // A recorded decode step (the first runs as is, the second is recorded, the third replayed) holds
  // the grouped experts: their sort, counts and passes stay on the device.
  cases.push_back({"moe_experts", "recorded decode bf16 T=48 H=128 I=64 E=16 k=4", [](Run& r) {
                     const Experts s{48, 128, 64, 16, 4, 16};
                     Tensor gate = random_tensor(r.rng, DType::bf16, {s.E, s.I, s.H}, 0.3f);
                     Tensor up = random_tensor(r.rng, DType::bf16, {s.E, s.I, s.H}, 0.3f);
                     Tensor down = random_tensor(r.rng, DType::bf16, {s.E, s.H, s.I}, 0.3f);
                     const Weight gate_dut(r.put(gate)), up_dut(r.put(up)), down_dut(r.put(down));
                     Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.H});
                     Tensor weights = host_tensor(DType::f32, {s.T, s.k});
                     for (int64_t i = 0; i < s.T * s.k; ++i) weights.ptr<float>()[i] = r.rng.uniform(0.05f, 1.0f);
                     Tensor x_dut = r.put(x), weights_dut = r.put(weights);
                     Tensor out = r.dut.alloc(DType::f32, {s.T, s.H});
                     Tensor ids_dut = r.dut.alloc(DType::i32, {s.T, s.k});
                     std::vector<int32_t> experts(s.E);
                     std::iota(experts.begin(), experts.end(), 0);
                     for (int step = 0; step < 3; ++step) {
                       // Each step routes anew, and its ids reach the device at the address recorded.
                       std::vector<int32_t> ids(s.T * s.k);
                       for (int64_t t = 0; t < s.T; ++t) {
                         std::shuffle(experts.begin(), experts.end(), r.rng.engine());
                         std::copy_n(experts.begin(), s.k, ids.begin() + t * s.k);
                       }
                       Tensor idt = i32_tensor({s.T, s.k}, ids);
                       Tensor out_ref = host_tensor(DType::f32, {s.T, s.H});
                       r.ref.moe_experts(x, idt, weights, gate, up, down, out_ref);
                       r.dut.copy(idt, ids_dut);
                       const Tensor got = recorded_step(r.dut, "op_harness recorded moe_experts", out, [&] {
                         r.dut.moe_experts(x_dut, ids_dut, weights_dut, gate_dut, up_dut, down_dut, out);
                       });
                       r.compare(fmt::format("out step {}", step), got, out_ref, kTol);
                     }
                   }});
  // MLX affine experts: decode-sized batches go through the cuda backend's affine GEMV (one launch
  // for every slot's gate and up, one for the down rows; the last case's 64 activation rows of 1024
  // are too big for its shared memory as f32, so the exact precision takes the per-row kernels
  // there), T = 300 through the grouped GEMMs.
  struct Affine { int bits, group; Experts s; };
  for (const Affine a : {Affine{4, 32, {5, 256, 96, 16, 4, 16}}, Affine{4, 32, {300, 256, 96, 16, 4, 8}},
                         Affine{4, 64, {1, 256, 128, 16, 4, 16}}, Affine{4, 64, {8, 512, 192, 32, 8, 32}},
                         Affine{8, 64, {1, 128, 64, 8, 2, 8}}, Affine{8, 128, {3, 256, 128, 4, 4, 4}},
                         Affine{8, 64, {8, 256, 1024, 8, 8, 8}}}) {
    const quant::Layout q{quant::Mode::affine, a.bits, a.group};
    cases.push_back({"moe_experts", fmt::format("affine {}-bit g{} {}", a.bits, a.group, label(a.s)), [=](Run& r) {
                       Weight gate = random_quantized(r.rng, q, {a.s.E, a.s.I, a.s.H});
                       Weight up = random_quantized(r.rng, q, {a.s.E, a.s.I, a.s.H});
                       Weight down = random_quantized(r.rng, q, {a.s.E, a.s.H, a.s.I});
                       check(r, a.s, gate, up, down);
                     }});
  }
}

void add_gdn(std::vector<Case>& cases) {
  struct Gates { int64_t T, Hv; };
  for (const Gates s : {Gates{1, 1}, Gates{17, 16}, Gates{64, 48}}) {
    cases.push_back({"gdn_gates", fmt::format("T={} Hv={}", s.T, s.Hv), [=](Run& r) {
                       Tensor a = random_tensor(r.rng, DType::f32, {s.T, s.Hv}, 8.0f);  // some past softplus' 20 cut
                       Tensor b = random_tensor(r.rng, DType::f32, {s.T, s.Hv}, 3.0f);
                       Tensor A_log = random_tensor(r.rng, DType::f32, {s.Hv});
                       Tensor dt_bias = random_tensor(r.rng, DType::f32, {s.Hv});
                       Tensor g_ref = host_tensor(DType::f32, {s.T, s.Hv}), beta_ref = host_tensor(DType::f32, {s.T, s.Hv});
                       r.ref.gdn_gates(a, b, A_log, dt_bias, g_ref, beta_ref);
                       Tensor g = r.dut.alloc(DType::f32, {s.T, s.Hv}), beta = r.dut.alloc(DType::f32, {s.T, s.Hv});
                       r.dut.gdn_gates(r.put(a), r.put(b), r.put(A_log), r.put(dt_bias), g, beta);
                       r.compare("g", g, g_ref, kTol);
                       r.compare("beta", beta, beta_ref, kTol);
                     }});
  }

  // Slots::moved: sequences write their windows to other slots, and the ones they read stay as they
  // were; snapshots: the windows before a snapshot token in other slots as well.
  struct Conv { int64_t C, K; std::vector<int32_t> lens; Slots slots = Slots::in_place; };
  const std::vector<Conv> convs = {{1, 1, {1}},
                                   {17, 4, {1}},
                                   {64, 4, {1, 2, 5, 0, 3}},
                                   {33, 3, {40, 1}},
                                   {130, 4, {70}},
                                   {2048, 4, {1, 1, 1}},
                                   {64, 4, {1, 2, 5, 0, 3}, Slots::moved},
                                   {130, 4, {70}, Slots::moved},
                                   {2048, 4, {1, 1, 1}, Slots::moved},
                                   {33, 3, {0, 40}, Slots::moved},
                                   {64, 4, {1, 2, 5, 0, 3, 9}, Slots::snapshots},
                                   {130, 4, {70, 2, 33}, Slots::snapshots},
                                   {2048, 4, {2, 1, 1}, Slots::snapshots}};
  for (const Conv& s : convs) {
    cases.push_back({"conv1d_causal", fmt::format("C={} K={} lens={}{}", s.C, s.K, seqs_str(s.lens), slots_str(s.slots)),
                     [=](Run& r) {
                       const int64_t slots = 3 * static_cast<int64_t>(s.lens.size()) + 2;
                       SeqLayout layout = make_layout(s.lens, slots, r.rng);
                       arrange_slots(layout, slots, s.slots);
                       const int64_t T = layout.num_tokens();
                       Tensor x = random_tensor(r.rng, DType::f32, {T, s.C});
                       Tensor w = random_tensor(r.rng, DType::f32, {s.C, s.K}, 0.5f);
                       Tensor state = random_tensor(r.rng, DType::f32, {slots, s.K - 1, s.C});
                       Tensor state_dut = r.put(state);
                       Tensor out_ref = host_tensor(DType::f32, {T, s.C});
                       r.ref.conv1d_causal(x, w, layout, state, out_ref);
                       Tensor out = r.dut.alloc(DType::f32, {T, s.C});
                       r.dut.conv1d_causal(r.put(x), r.put(w), layout, state_dut, out);
                       r.compare("out", out, out_ref, kTol);
                       r.compare("conv_state", state_dut, state, 0.0);
                     }});
  }

  struct Rule { int64_t Hk, Hv, Dk, Dv; std::vector<int32_t> lens; Slots slots = Slots::in_place; };
  // Chunked coverage: partial last chunks, several sequences, Dv past the 32-row tiles and past the
  // padded key width (17 → 32), and key dims the 16-byte copies cannot take. Slots::moved: states
  // written to other slots (one of no tokens too: its target gets the state as it was); snapshots:
  // states inside and at the end of sequences as well (chunked: some inside a chunk, some across).
  const std::vector<Rule> rules = {{1, 1, 16, 16, {1}},        {2, 4, 32, 16, {3, 65}},   {4, 4, 128, 128, {1, 1}},
                                   {2, 2, 17, 9, {130, 5, 64}}, {1, 2, 64, 32, {200, 0}}, {2, 4, 128, 128, {70}},
                                   {2, 4, 128, 128, {1, 63, 65, 200}}, {1, 2, 17, 40, {150, 64}},
                                   {2, 4, 128, 128, {1, 63, 65, 200}, Slots::moved},
                                   {1, 2, 64, 32, {0, 200, 70}, Slots::moved},
                                   {4, 4, 128, 128, {1, 1, 1, 1}, Slots::moved},
                                   {2, 4, 128, 128, {130, 63, 65, 200, 1}, Slots::snapshots},
                                   {2, 2, 17, 9, {150, 5, 64, 70}, Slots::snapshots},
                                   {4, 4, 128, 128, {1, 1, 1, 1}, Slots::snapshots}};
  const std::pair<GdnAlgorithm, const char*> algorithms[] = {
      {GdnAlgorithm::recurrent, "recurrent"}, {GdnAlgorithm::chunked, "chunked"}, {GdnAlgorithm::automatic, "auto"}};
  for (const auto& [algorithm, algorithm_name] : algorithms) {
    for (const Rule& s : rules) {
      cases.push_back({"gated_delta_rule",
                       fmt::format("{} Hk={} Hv={} Dk={} Dv={} lens={}{}", algorithm_name, s.Hk, s.Hv, s.Dk, s.Dv,
                                   seqs_str(s.lens), slots_str(s.slots)),
                       [=, algorithm = algorithm](Run& r) {
                         const int64_t slots = 3 * static_cast<int64_t>(s.lens.size()) + 1;
                         SeqLayout layout = make_layout(s.lens, slots, r.rng);
                         arrange_slots(layout, slots, s.slots);
                         const int64_t T = layout.num_tokens();
                         Tensor q = random_tensor(r.rng, DType::f32, {T, s.Hk, s.Dk});
                         Tensor k = random_tensor(r.rng, DType::f32, {T, s.Hk, s.Dk});
                         // q and k as the model feeds them: unit rows, q scaled by Dk^-1/2.
                         for (int64_t row = 0; row < T * s.Hk; ++row) {
                           for (auto [t, scale] : {std::pair{&q, 1.0 / std::sqrt(s.Dk)}, std::pair{&k, 1.0}}) {
                             float* p = t->ptr<float>() + row * s.Dk;
                             double norm = 0.0;
                             for (int64_t i = 0; i < s.Dk; ++i) norm += double(p[i]) * p[i];
                             for (int64_t i = 0; i < s.Dk; ++i) p[i] = static_cast<float>(p[i] * scale / std::sqrt(norm));
                           }
                         }
                         Tensor v = random_tensor(r.rng, DType::f32, {T, s.Hv, s.Dv});
                         Tensor g = host_tensor(DType::f32, {T, s.Hv}), beta = host_tensor(DType::f32, {T, s.Hv});
                         for (int64_t i = 0; i < T * s.Hv; ++i) {
                           g.ptr<float>()[i] = -r.rng.uniform(0.0f, 1.0f) * r.rng.uniform(0.0f, 1.0f) * 3.0f;
                           beta.ptr<float>()[i] = r.rng.uniform(0.0f, 1.0f);
                         }
                         Tensor state = random_tensor(r.rng, DType::f32, {slots, s.Hv, s.Dv, s.Dk}, 0.2f);
                         Tensor state_dut = r.put(state);
                         Tensor out_ref = host_tensor(DType::f32, {T, s.Hv, s.Dv});
                         r.ref.gated_delta_rule(q, k, v, g, beta, layout, state, out_ref, algorithm);
                         Tensor out = r.dut.alloc(DType::f32, {T, s.Hv, s.Dv});
                         r.dut.gated_delta_rule(r.put(q), r.put(k), r.put(v), r.put(g), r.put(beta), layout, state_dut,
                                                out, algorithm);
                         r.compare("out", out, out_ref, kTol);
                         r.compare("state", state_dut, state, kTol);
                       }});
    }
  }
}

void add_sample(std::vector<Case>& cases) {
  struct Setting { const char* label; SamplingParams params; };
  const Setting settings[] = {
      {"greedy", {}},
      {"t=0.8 top_k=20", {.temperature = 0.8f, .top_k = 20, .seed = 7}},
      {"t=1 top_p=0.9 min_p=0.05", {.temperature = 1.0f, .top_p = 0.9f, .min_p = 0.05f, .seed = 11}},
      {"t=0.7 penalties", {.temperature = 0.7f, .repetition_penalty = 1.3f, .presence_penalty = 0.5f,
                           .frequency_penalty = 0.2f, .seed = 3}},
  };
  for (const Setting& setting : settings) {
    cases.push_back({"sample", fmt::format("S=5 V=1000 {}", setting.label), [=](Run& r) {
                       const int64_t S = 5, V = 1000;
                       Tensor logits = random_tensor(r.rng, DType::f32, {S, V}, 3.0f);
                       std::vector<SamplingParams> params(S, setting.params);
                       std::vector<std::vector<int32_t>> history(S);
                       for (auto& h : history)
                         for (int i = 0; i < 30; ++i) h.push_back(static_cast<int32_t>(r.rng.integer(0, V - 1)));
                       std::vector<uint64_t> step = {0, 1, 2, 100, 12345};
                       std::vector<int32_t> want, got;
                       r.ref.sample(logits, params, history, step, want);
                       r.dut.sample(r.put(logits), params, history, step, got);
                       r.compare_ids("tokens", got, want);
                     }});
  }
}

// Constrained decoding's mask on some rows of a batch (others untouched), vocabularies that end on,
// past and before a 32-bit word, and Qwen3's; the masked rows then sampled greedily as decode does.
void add_mask_logits(std::vector<Case>& cases) {
  struct Shape { int64_t S, V; std::vector<int32_t> rows; };
  const Shape shapes[] = {{1, 1, {0}}, {3, 31, {2, 0}}, {4, 32, {1}}, {2, 33, {0, 1}}, {5, 1000, {4, 1, 2}},
                          {2, 151669, {1}}, {3, 5, {}}};
  for (const Shape& s : shapes) {
    cases.push_back({"mask_logits", fmt::format("S={} V={} rows=[{}]", s.S, s.V, fmt::join(s.rows, ",")), [=](Run& r) {
                       const int64_t R = static_cast<int64_t>(s.rows.size()), words = (s.V + 31) / 32;
                       Tensor logits = random_tensor(r.rng, DType::f32, {s.S, s.V}, 3.0f);
                       Tensor allowed = host_tensor(DType::u32, {R, words});
                       for (int64_t i = 0; i < R * words; ++i)
                         allowed.ptr<uint32_t>()[i] = static_cast<uint32_t>(r.rng.engine()());
                       if (R > 0) allowed.ptr<uint32_t>()[0] |= 1u;  // a row keeps at least one id
                       Tensor rows = i32_tensor({R}, s.rows);
                       Tensor want = clone(logits);
                       r.ref.mask_logits(want, rows, allowed);
                       Tensor got = r.put(logits);
                       r.dut.mask_logits(got, r.put(rows), r.put(allowed));
                       // −inf compared as a finite stand-in, so that relative RMS stays defined.
                       Tensor got_host = clone(r.get(got));
                       for (Tensor* t : {&want, &got_host})
                         for (int64_t i = 0; i < t->numel(); ++i)
                           if (std::isinf(t->ptr<float>()[i])) t->ptr<float>()[i] = -1e30f;
                       r.compare("logits", r.put(got_host), want, 0.0);
                       std::vector<int32_t> want_ids, got_ids;
                       const std::vector<SamplingParams> greedy(s.S);
                       const std::vector<std::vector<int32_t>> history(s.S);
                       const std::vector<uint64_t> step(s.S, 0);
                       Tensor masked = clone(logits);
                       r.ref.mask_logits(masked, rows, allowed);
                       r.ref.sample(masked, greedy, history, step, want_ids);
                       r.dut.sample(got, greedy, history, step, got_ids);
                       r.compare_ids("greedy", got_ids, want_ids);
                     }});
  }
}

}  // namespace

// Several matrices on one x: one launch on a device backend when all take the one-token kernels
// (same dtype and width; rows of each past a block's end), matrix by matrix otherwise (mixed
// formats, several tokens, prefill-sized batches).
void add_linear_many(std::vector<Case>& cases) {
  struct Shape { int64_t T, in; std::vector<int64_t> outs; bool mixed; };
  const Shape shapes[] = {{1, 256, {96, 33, 33}, false},  {1, 4096, {4, 1}, false},    {1, 136, {7, 5, 9, 1}, false},
                          {1, 256, {64, 67}, true},       {3, 256, {96, 32, 32}, false}, {20, 128, {40, 8}, false},
                          {1, 4104, {130, 2}, false},
                          // GEMMs sharing x's 16-bit conversion, one matrix quantized
                          {33, 256, {96, 64, 40}, true}};
  for (DType dt : kWeightTypes) {
    for (const Shape& s : shapes) {
      cases.push_back({"linear_many", fmt::format("{}{} T={} in={} outs=[{}]", name(dt), s.mixed ? "+affine 4-bit" : "",
                                                  s.T, s.in, fmt::join(s.outs, ",")),
                       [=](Run& r) {
                         Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.in});
                         std::vector<Weight> host, device;
                         for (size_t i = 0; i < s.outs.size(); ++i) {
                           if (s.mixed && i == 1) {
                             host.push_back(random_quantized(r.rng, {quant::Mode::affine, 4, 64}, {s.outs[i], s.in}));
                             device.push_back(put_weight(r, host.back()));
                           } else {
                             host.push_back(random_tensor(r.rng, dt, {s.outs[i], s.in}, 0.5f));
                             device.push_back(r.put(host.back().dense));
                           }
                         }
                         std::vector<Tensor> want, got;
                         std::vector<const Weight*> ws;
                         std::vector<Tensor*> ys;
                         for (size_t i = 0; i < s.outs.size(); ++i) {
                           want.push_back(host_tensor(DType::f32, {s.T, s.outs[i]}));
                           r.ref.linear(x, host[i], want.back());
                           got.push_back(r.dut.alloc(DType::f32, {s.T, s.outs[i]}));
                         }
                         for (size_t i = 0; i < s.outs.size(); ++i) ws.push_back(&device[i]), ys.push_back(&got[i]);
                         r.dut.linear_many(r.put(x), ws, ys);
                         for (size_t i = 0; i < s.outs.size(); ++i)
                           r.compare(fmt::format("y{}", i), got[i], want[i], kTol);
                       }});
    }
  }
}

// The SwiGLU MLP's gate and up halves as one op: one launch per decode token on a device backend
// (dense, and the affine layouts of the one-token GEMV; odd row counts leave a block or a row group
// part full), linear_many + silu_mul otherwise (several tokens, other quantized layouts).
void add_linear_swiglu(std::vector<Case>& cases) {
  struct Shape { int64_t T, in, I; bool quantized; };
  const Shape shapes[] = {{1, 256, 96, false}, {1, 4096, 33, false}, {1, 136, 7, false},
                          {1, 1024, 9, false}, {3, 256, 40, false},  {1, 256, 65, true},
                          {1, 4096, 1000, true}, {1, 2048, 4500, true}, {2, 512, 33, true}};
  for (DType dt : kWeightTypes) {
    for (const Shape& s : shapes) {
      cases.push_back({"linear_swiglu", fmt::format("{} T={} in={} I={}", s.quantized ? "affine 4-bit" : name(dt), s.T,
                                                    s.in, s.I),
                       [=](Run& r) {
                         Tensor x = random_tensor(r.rng, DType::f32, {s.T, s.in});
                         auto make = [&] {
                           return s.quantized ? random_quantized(r.rng, {quant::Mode::affine, 4, 64}, {s.I, s.in})
                                              : Weight(random_tensor(r.rng, dt, {s.I, s.in}, 0.5f));
                         };
                         const Weight gate = make(), up = make();
                         Tensor want = host_tensor(DType::f32, {s.T, s.I});
                         r.ref.linear_swiglu(x, gate, up, want);
                         Tensor got = r.dut.alloc(DType::f32, {s.T, s.I});
                         auto on_device = [&](const Weight& w) {
                           return w.quantized() ? put_weight(r, w) : Weight(r.put(w.dense));
                         };
                         r.dut.linear_swiglu(r.put(x), on_device(gate), on_device(up), got);
                         r.compare("out", got, want, kTol);
                       }});
    }
  }
}

// A layer's residual add and pre-norm with its first projections (q/k/v, or the MLP's gate/up):
// one and several tokens, 4-bit rows of 512 to 4224 and dense ones, against the two ops.
void add_norm_then_linear(std::vector<Case>& cases) {
  struct Shape { int64_t T, in; bool quantized; };
  const Shape shapes[] = {{1, 4096, true}, {1, 512, true}, {1, 4224, true}, {2, 512, true}, {1, 256, false}};
  for (const Shape& s : shapes) {
    for (const bool swiglu : {false, true}) {
      cases.push_back({swiglu ? "add_rms_norm_linear_swiglu" : "add_rms_norm_linear_many",
                       fmt::format("{} T={} in={}", s.quantized ? "affine 4-bit" : "f32", s.T, s.in), [=](Run& r) {
                         const int64_t rows[2] = {swiglu ? 200 : 96, swiglu ? 200 : 33};
                         auto make = [&](int64_t n) {
                           return s.quantized ? random_quantized(r.rng, {quant::Mode::affine, 4, 64}, {n, s.in})
                                              : Weight(random_tensor(r.rng, DType::f32, {n, s.in}, 0.5f));
                         };
                         const Weight w0 = make(rows[0]), w1 = make(rows[1]);
                         auto on_device = [&](const Weight& w) {
                           return w.quantized() ? put_weight(r, w) : Weight(r.put(w.dense));
                         };
                         const Weight d0 = on_device(w0), d1 = on_device(w1);
                         Tensor h = random_tensor(r.rng, DType::f32, {s.T, s.in}, 3.0f);
                         Tensor delta = random_tensor(r.rng, DType::f32, {s.T, s.in});
                         Tensor norm_w = random_tensor(r.rng, DType::f32, {s.in});
                         Tensor h_dut = r.put(h);
                         Tensor normed_ref = host_tensor(DType::f32, {s.T, s.in});
                         Tensor normed = r.dut.alloc(DType::f32, {s.T, s.in});
                         Tensor want[2] = {host_tensor(DType::f32, {s.T, rows[0]}), host_tensor(DType::f32, {s.T, rows[1]})};
                         Tensor got[2] = {r.dut.alloc(DType::f32, {s.T, rows[0]}), r.dut.alloc(DType::f32, {s.T, rows[1]})};
                         if (swiglu) {
                           r.ref.add_rms_norm_linear_swiglu(h, delta, norm_w, 1e-6f, normed_ref, w0, w1, want[0]);
                           r.dut.add_rms_norm_linear_swiglu(h_dut, r.put(delta), r.put(norm_w), 1e-6f, normed, d0, d1,
                                                            got[0]);
                         } else {
                           r.ref.add_rms_norm_linear_many(h, delta, norm_w, 1e-6f, normed_ref, {&w0, &w1},
                                                          {&want[0], &want[1]});
                           r.dut.add_rms_norm_linear_many(h_dut, r.put(delta), r.put(norm_w), 1e-6f, normed, {&d0, &d1},
                                                          {&got[0], &got[1]});
                         }
                         r.compare("residual", h_dut, h, 0.0);
                         r.compare("normed", normed, normed_ref, kTol);
                         for (int i = 0; i < (swiglu ? 1 : 2); ++i) r.compare(fmt::format("y{}", i), got[i], want[i], kTol);
                       }});
    }
  }
}

// q/k norms, rotation and the KV write of one attention layer as one op: partial rotary_dim (Qwen3-
// Next / 3.5), MRoPE sections, YaRN, GQA, decode and prefill batches over shuffled pages.
void add_rms_norm_rope_store(std::vector<Case>& cases) {
  struct Shape {
    int64_t heads, kv_heads, head_dim, rotary;
    std::vector<int64_t> section;
    std::vector<int32_t> lens, cached;
    std::optional<YarnParams> yarn = {};
  };
  const YarnParams yarn{.factor = 4.0, .original_max_positions = 32};  // positions past 32 stretch
  const Shape shapes[] = {{32, 8, 128, 128, {}, {1}, {511}},
                          {16, 2, 256, 64, {11, 11, 10}, {1, 1, 1}, {0, 40, 7}},
                          {8, 8, 64, 64, {}, {17, 3}, {0, 9}},
                          {4, 2, 128, 128, {}, {300}, {0}},
                          {6, 3, 20, 10, {}, {5, 1}, {3, 30}},
                          {32, 8, 128, 128, {}, {1, 20}, {150, 90}, yarn},
                          {16, 2, 256, 64, {11, 11, 10}, {1, 1, 1}, {0, 40, 70}, yarn}};
  // A bf16 pool holds k's and v's rounding: ref's and the backend's rotations may differ in the last
  // f32 bit, which flips the odd bf16 rounding by one ulp (2^-8 relative). Rounding every element the
  // wrong way (truncation) would cost ~1e-3.
  constexpr double kBf16Tol = 2e-4;
  for (const Shape& s : shapes)
   for (const DType kv : {DType::f32, DType::bf16}) {
    cases.push_back(
        {"rms_norm_rope_store",
         fmt::format("{} pool h={} kv={} hd={} rotary={}{}{} lens={} cached={}", name(kv), s.heads, s.kv_heads,
                     s.head_dim, s.rotary, s.section.empty() ? "" : " mrope", s.yarn ? " yarn" : "", seqs_str(s.lens),
                     seqs_str(s.cached)),
         [=](Run& r) {
           constexpr int32_t kBlock = 16;
           AttentionLayout layout;
           layout.seqs = make_layout(s.lens, static_cast<int64_t>(s.lens.size()), r.rng);
           layout.cached = s.cached;
           layout.block_size = kBlock;
           for (size_t i = 0; i < s.lens.size(); ++i)
             layout.max_blocks = std::max(layout.max_blocks, (s.cached[i] + s.lens[i] + kBlock - 1) / kBlock);
           const int64_t num_blocks = static_cast<int64_t>(s.lens.size()) * layout.max_blocks + 2;
           layout.block_table.resize(s.lens.size() * layout.max_blocks);
           std::iota(layout.block_table.begin(), layout.block_table.end(), 2);
           std::shuffle(layout.block_table.begin(), layout.block_table.end(), r.rng.engine());
           const int64_t T = layout.seqs.num_tokens();
           Tensor positions = host_tensor(DType::i32, {3, T});
           for (size_t i = 0; i < s.lens.size(); ++i)
             for (int32_t j = layout.seqs.cu_seqlens[i]; j < layout.seqs.cu_seqlens[i + 1]; ++j)
               for (int axis = 0; axis < 3; ++axis)
                 positions.ptr<int32_t>()[axis * T + j] =
                     s.cached[i] + (j - layout.seqs.cu_seqlens[i]) + static_cast<int32_t>(r.rng.integer(0, 2)) * axis;
           const RopeParams params{s.rotary, 1e6, s.section, s.yarn};
           const std::vector<int64_t> pool_shape = {num_blocks, kBlock, s.kv_heads, s.head_dim};
           KvPool pool{random_tensor(r.rng, kv, pool_shape), random_tensor(r.rng, kv, pool_shape)};
           KvPool pool_dut{r.put(pool.k), r.put(pool.v)};
           Tensor q = random_tensor(r.rng, DType::f32, {T, s.heads, s.head_dim});
           Tensor k = random_tensor(r.rng, DType::f32, {T, s.kv_heads, s.head_dim});
           Tensor v = random_tensor(r.rng, DType::f32, {T, s.kv_heads, s.head_dim});
           Tensor q_w = random_tensor(r.rng, DType::f32, {s.head_dim}), k_w = random_tensor(r.rng, DType::f32, {s.head_dim});
           Tensor q_dut = r.put(q), k_dut = r.put(k);
           r.ref.rms_norm_rope_store(q, k, v, q_w, k_w, 1e-6f, positions, params, layout, pool);
           r.dut.rms_norm_rope_store(q_dut, k_dut, r.put(v), r.put(q_w), r.put(k_w), 1e-6f, r.put(positions), params,
                                     layout, pool_dut);
           r.compare("q", q_dut, q, kTol);
           r.compare("k", k_dut, k, kTol);
           r.compare("pool.k", pool_dut.k, pool.k, kv == DType::bf16 ? kBf16Tol : kTol);
           r.compare("pool.v", pool_dut.v, pool.v, 0.0);
         }});
   }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  add_linear(cases);
  add_linear_many(cases);
  add_linear_swiglu(cases);
  add_norm_then_linear(cases);
  add_linear_quantized(cases);
  add_linear_mma(cases);
  add_linear_gemv_affine(cases);
  add_embedding(cases);
  add_norms(cases);
  add_rope(cases);
  add_elementwise(cases);
  add_attention(cases);
  add_rms_norm_rope_store(cases);
  add_moe(cases);
  add_gdn(cases);
  add_sample(cases);
  add_mask_logits(cases);
  return cases;
}

}  // namespace qinfer::harness
