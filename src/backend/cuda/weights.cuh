#pragma once
// How kernels read weight rows, per stored format: one struct per format (dense f32 / bf16 / f16,
// MLX affine 2-8 bits, mxfp4, nvfp4, mxfp8) with
//   element(w, row, j)   one value, bit-exact with Weight::row_f32 (embedding, dequantize-to-GEMM);
//   row_dot<kMaxT, kVec, kStagedX>  a warp's partial dot products of one row with up to kMaxT
//                         activation rows (each lane sums a strided share; the caller reduces across
//                         the warp), the rows in global memory or (kStagedX) staged in shared memory;
//   vectorizable(w)       whether the row reads may use 16-byte loads (alignment checked on the host).
// and, for the formats the decode GEMV reads in tiles (kTile: dense, whole-word MLX codes),
//   unit: kUnitWords words of one row that one lane loads at once, kUnit (a multiple of 4) elements
//         inside one scale group; tileable(w) says whether the view's rows hold whole aligned units;
//   decode4(raw, c, v)    elements 4c..4c+3 of a unit: dense values, affine codes as exact integers q,
//                         fp codes decoded without their scale (kCombine says what the caller adds);
//   unit_scale(w, row, j) the group scale (and affine bias) of element j.
// dispatch(w, f) calls f(Format{}) for the view's format: the one switch over formats.
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/formats.cuh"

namespace qinfer::cuda {

// One f32 from a float array stored as f32 | bf16 | f16 (affine scales and biases).
__device__ __forceinline__ float load_float(const void* p, int64_t i, DType dtype) {
  if (dtype == DType::bf16) return format::Bf16::decode(__ldg(static_cast<const unsigned short*>(p) + i));
  if (dtype == DType::f16) return format::F16::decode(__ldg(static_cast<const unsigned short*>(p) + i));
  return __ldg(static_cast<const float*>(p) + i);
}

// x[0] (x[0..3] as one float4): kStagedX, x is in shared memory, staged by the block behind a
// barrier, so plain loads (generic addressing) read it; otherwise x is global memory a previous
// kernel wrote, read after the wait.
template <bool kStagedX>
__device__ __forceinline__ float load_x(const float* x) {
  if constexpr (kStagedX) return *x;
  else return load_after_wait(x);
}
template <bool kStagedX>
__device__ __forceinline__ float4 load_x4(const float* x) {
  if constexpr (kStagedX) return *reinterpret_cast<const float4*>(x);
  else return load_after_wait(reinterpret_cast<const float4*>(x));
}

// acc[t] += w0·x[t][j] + … + w3·x[t][j+3] for t < T; kVec reads the four as one float4 (the host
// checked that x and its row stride are 16-byte aligned, and j is a multiple of 4).
template <int kMaxT, bool kVec, bool kStagedX = false>
__device__ __forceinline__ void fma4(float (&acc)[kMaxT], float w0, float w1, float w2, float w3,
                                     const float* __restrict__ x, int64_t ldx, int T, int64_t j) {
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    if (t < T) {
      const float* xt = x + t * ldx + j;
      if constexpr (kVec) {
        const float4 v = load_x4<kStagedX>(xt);
        acc[t] = fmaf(w0, v.x, fmaf(w1, v.y, fmaf(w2, v.z, fmaf(w3, v.w, acc[t]))));
      } else {
        acc[t] = fmaf(w0, load_x<kStagedX>(xt), fmaf(w1, load_x<kStagedX>(xt + 1), fmaf(w2, load_x<kStagedX>(xt + 2), fmaf(w3, load_x<kStagedX>(xt + 3), acc[t]))));
      }
    }
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// How a tile's per-unit partial dot Σ v·x becomes the output: dense values are the weights; fp
// codes are scaled by their group (s·Σe·x); affine codes q give s·Σq·x + b·Σx, so the inner loop is
// one FMA per element and the scale and bias are applied once per unit.
enum class Combine { plain, scaled, affine };
struct GroupScale {
  float scale, bias;
};

// One unit of kWords words (4, 8 or 16 bytes, aligned to its size) in one load.
template <int kWords>
__device__ __forceinline__ void load_unit(const uint32_t* p, uint32_t (&raw)[kWords]) {
  if constexpr (kWords == 4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    raw[0] = v.x, raw[1] = v.y, raw[2] = v.z, raw[3] = v.w;
  } else if constexpr (kWords == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    raw[0] = v.x, raw[1] = v.y;
  } else {
    static_assert(kWords == 1);
    raw[0] = __ldg(p);
  }
}

// The kBits-bit code at `bit` of `word` as an exact float. The code is OR-ed into the mantissa of
// 2^(23−b) (b its offset in its 16-bit half), where one mantissa step is 1, and 2^(23−b) is
// subtracted: a mask and an add, where shift + mask + int-to-float would take a slow conversion.
template <int kBits>
__device__ __forceinline__ float code_as_float(uint32_t word, int bit) {
  const uint32_t half = bit >= 16 ? word >> 16 : word;
  const int b = bit & 15;
  static_assert(kBits <= 8, "b + kBits stays below 23 mantissa bits");
  const uint32_t magic = static_cast<uint32_t>(150 - b) << 23;  // 2^(23−b)
  return __uint_as_float(magic | (half & (((1u << kBits) - 1u) << b))) - __uint_as_float(magic);
}

// --- dense ---------------------------------------------------------------------------------------

struct F32Elem {
  using Storage = float;
  __device__ static float decode(float v) { return v; }
};
struct Bf16Elem {
  using Storage = unsigned short;
  __device__ static float decode(unsigned short v) { return format::Bf16::decode(v); }
};
struct F16Elem {
  using Storage = unsigned short;
  __device__ static float decode(unsigned short v) { return format::F16::decode(v); }
};

template <class Elem>
struct Dense {
  using Storage = typename Elem::Storage;
  static constexpr int kPerUnit = 16 / static_cast<int>(sizeof(Storage));  // elements per 16-byte load

  static bool vectorizable(const WeightView& w) { return aligned16(w.data) && w.in % kPerUnit == 0; }

  // Tiles: four elements per unit (one float4 of x per token, so a warp's x reads are contiguous).
  static constexpr bool kTile = true;
  static constexpr int kUnit = 4;
  static constexpr int kUnitWords = kUnit * static_cast<int>(sizeof(Storage)) / 4;
  static constexpr Combine kCombine = Combine::plain;
  static bool tileable(const WeightView& w) {
    return reinterpret_cast<uintptr_t>(w.data) % (kUnitWords * 4) == 0 && w.in % kUnit == 0;
  }
  __device__ static const uint32_t* row_words(const WeightView& w, int64_t row) {
    return reinterpret_cast<const uint32_t*>(static_cast<const Storage*>(w.data) + row * w.in);
  }
  __device__ static void decode4(const uint32_t (&raw)[kUnitWords], int, float (&v)[4]) {
    if constexpr (sizeof(Storage) == 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __uint_as_float(raw[k]);
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if constexpr (std::is_same_v<Elem, Bf16Elem>) {
          v[2 * i] = __uint_as_float(raw[i] << 16);
          v[2 * i + 1] = __uint_as_float(raw[i] & 0xFFFF0000u);
        } else {
          // The hardware conversion: f16 → f32 is exact, so it agrees with F16::decode but for NaN payloads.
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&raw[i]));
          v[2 * i] = f.x;
          v[2 * i + 1] = f.y;
        }
      }
    }
  }

  __device__ static float element(const WeightView& w, int64_t row, int64_t j) {
    return Elem::decode(__ldg(static_cast<const Storage*>(w.data) + row * w.in + j));
  }

  __device__ static void unpack(const uint4& raw, float (&v)[kPerUnit]) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (sizeof(Storage) == 4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(words[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = Elem::decode(static_cast<unsigned short>(words[i] & 0xFFFFu));
        v[2 * i + 1] = Elem::decode(static_cast<unsigned short>(words[i] >> 16));
      }
    }
  }

  template <int kMaxT, bool kVec, bool kStagedX = false>
  __device__ static void row_dot(const WeightView& w, int64_t row, const float* __restrict__ x, int64_t ldx, int T,
                                 int lane, float (&acc)[kMaxT]) {
    const Storage* r = static_cast<const Storage*>(w.data) + row * w.in;
    if constexpr (kVec && kStagedX) {
      // x comes from shared memory at little cost, so the weight loads are what the warp waits on:
      // each lane has kAhead of them in flight before it uses the first. Units are taken in the same
      // order as below, so the sums agree to the bit with the global-x path.
      constexpr int kAhead = 4;
      const uint4* units = reinterpret_cast<const uint4*>(r);
      const int64_t n = w.in / kPerUnit;
      for (int64_t u0 = lane; u0 < n; u0 += kAhead * kWarp) {
        uint4 raw[kAhead];
#pragma unroll
        for (int a = 0; a < kAhead; ++a) {
          const int64_t u = u0 + a * kWarp;
          raw[a] = u < n ? __ldg(units + u) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int a = 0; a < kAhead; ++a) {
          const int64_t u = u0 + a * kWarp;
          if (u >= n) break;
          float v[kPerUnit];
          unpack(raw[a], v);
#pragma unroll
          for (int k = 0; k < kPerUnit; k += 4)
            fma4<kMaxT, true, true>(acc, v[k], v[k + 1], v[k + 2], v[k + 3], x, ldx, T, u * kPerUnit + k);
        }
      }
    } else if constexpr (kVec) {
      const uint4* units = reinterpret_cast<const uint4*>(r);
      const int64_t n = w.in / kPerUnit;
#pragma unroll(kMaxT == 1 ? 4 : 1)
      for (int64_t u = lane; u < n; u += kWarp) {
        float v[kPerUnit];
        unpack(__ldg(units + u), v);
#pragma unroll
        for (int k = 0; k < kPerUnit; k += 4) fma4<kMaxT, true>(acc, v[k], v[k + 1], v[k + 2], v[k + 3], x, ldx, T, u * kPerUnit + k);
      }
    } else {
      for (int64_t j = lane; j < w.in; j += kWarp) {
        const float v = Elem::decode(__ldg(r + j));
#pragma unroll
        for (int t = 0; t < kMaxT; ++t)
          if (t < T) acc[t] = fmaf(v, load_x<kStagedX>(x + t * ldx + j), acc[t]);
      }
    }
  }
};

// --- MLX quantized -------------------------------------------------------------------------------

// Code k of a run of kBits words holding 32 codes (3/5/6-bit codes straddle words).
template <int kBits>
__device__ __forceinline__ uint32_t extract(const uint32_t (&words)[kBits], int k) {
  const int bit = k * kBits, word = bit >> 5, shift = bit & 31;
  uint32_t v = words[word] >> shift;
  if (shift + kBits > 32) v |= words[word + 1] << (32 - shift);
  return v & ((1u << kBits) - 1u);
}

template <quant::Mode kMode, int kBits>
struct Quant {
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
  static constexpr bool kWholeWords = 32 % kBits == 0;  // codes never straddle words

  using Group = GroupScale;

  static bool vectorizable(const WeightView& w) { return !kWholeWords || (aligned16(w.data) && w.row_words % 4 == 0); }

  // Tiles: one code word per unit; a unit is inside one group when groups hold whole words.
  static constexpr bool kTile = kWholeWords;
  static constexpr int kUnitWords = 1;
  static constexpr int kUnit = 32 / kBits;
  static constexpr Combine kCombine = kMode == quant::Mode::affine ? Combine::affine : Combine::scaled;
  static bool tileable(const WeightView& w) { return w.group_size >= kUnit && w.in % kUnit == 0; }
  __device__ static const uint32_t* row_words(const WeightView& w, int64_t row) {
    return static_cast<const uint32_t*>(w.data) + row * w.row_words;
  }
  __device__ static void decode4(const uint32_t (&raw)[1], int c, float (&v)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int bit = (4 * c + k) * kBits;
      if constexpr (kMode == quant::Mode::affine) {
        v[k] = code_as_float<kBits>(raw[0], bit);
      } else if constexpr (kMode == quant::Mode::mxfp8) {
        v[k] = format::E4M3::decode((raw[0] >> bit) & kMask);
      } else {
        v[k] = format::E2M1::decode((raw[0] >> bit) & kMask);
      }
    }
  }

  // Group g (a flat index into [rows, groups]) as quant::decode_scale decodes it.
  __device__ static Group group(const WeightView& w, int64_t g) {
    if constexpr (kMode == quant::Mode::affine) {
      return {load_float(w.scales, g, w.scale_dtype), load_float(w.biases, g, w.scale_dtype)};
    } else if constexpr (kMode == quant::Mode::nvfp4) {
      const uint32_t code = __ldg(static_cast<const unsigned char*>(w.scales) + g);
      return {__fmul_rn(format::E4M3::decode(code), w.scale_factor), 0.0f};
    } else {
      return {format::E8M0::decode(__ldg(static_cast<const unsigned char*>(w.scales) + g)), 0.0f};
    }
  }

  __device__ static Group unit_scale(const WeightView& w, int64_t row, int64_t j) {
    return group(w, row * (w.in >> w.group_shift) + (j >> w.group_shift));
  }

  // scale·q + bias (affine) or element·scale, rounded as the host rounds (no fused multiply-add).
  __device__ static float value(uint32_t q, const Group& g) {
    if constexpr (kMode == quant::Mode::affine) return __fadd_rn(__fmul_rn(g.scale, static_cast<float>(q)), g.bias);
    if constexpr (kMode == quant::Mode::mxfp8) return __fmul_rn(format::E4M3::decode(q), g.scale);
    return __fmul_rn(format::E2M1::decode(q), g.scale);
  }

  __device__ static float element(const WeightView& w, int64_t row, int64_t j) {
    const uint32_t* codes = static_cast<const uint32_t*>(w.data) + row * w.row_words;
    const uint64_t bit = static_cast<uint64_t>(j) * kBits;
    const uint64_t word = bit >> 5;
    const uint32_t shift = static_cast<uint32_t>(bit & 31);
    uint64_t v = __ldg(codes + word) >> shift;
    if (shift + kBits > 32) v |= static_cast<uint64_t>(__ldg(codes + word + 1)) << (32 - shift);
    const int64_t groups = w.in >> w.group_shift;
    return value(static_cast<uint32_t>(v) & kMask, group(w, row * groups + (j >> w.group_shift)));
  }

  template <int kMaxT, bool kVec, bool kStagedX = false>
  __device__ static void row_dot(const WeightView& w, int64_t row, const float* __restrict__ x, int64_t ldx, int T,
                                 int lane, float (&acc)[kMaxT]) {
    const uint32_t* r = static_cast<const uint32_t*>(w.data) + row * w.row_words;
    const int64_t g0 = row * (w.in >> w.group_shift);
    // x reads are vectorised when x allows it; the weight reads when the codes do as well.
    constexpr bool kVecX = kVec;
    if constexpr (kWholeWords) {
      constexpr int kPerWord = 32 / kBits;  // 4, 8 or 16: a word never spans two groups (groups ≥ 16)
      auto word = [&](uint32_t bits, int64_t e0) {
        const Group g = group(w, g0 + (e0 >> w.group_shift));
#pragma unroll
        for (int k = 0; k < kPerWord; k += 4)
          fma4<kMaxT, kVecX, kStagedX>(acc, value((bits >> (k * kBits)) & kMask, g), value((bits >> ((k + 1) * kBits)) & kMask, g),
                             value((bits >> ((k + 2) * kBits)) & kMask, g),
                             value((bits >> ((k + 3) * kBits)) & kMask, g), x, ldx, T, e0 + k);
      };
      if constexpr (kVec) {
        const uint4* units = reinterpret_cast<const uint4*>(r);
        const int64_t n = w.row_words / 4;
#pragma unroll(kMaxT == 1 ? 2 : 1)
        for (int64_t u = lane; u < n; u += kWarp) {
          const uint4 raw = __ldg(units + u);
          const int64_t e0 = u * 4 * kPerWord;
          word(raw.x, e0);
          word(raw.y, e0 + kPerWord);
          word(raw.z, e0 + 2 * kPerWord);
          word(raw.w, e0 + 3 * kPerWord);
        }
      } else {
        for (int64_t i = lane; i < w.row_words; i += kWarp) word(__ldg(r + i), i * kPerWord);
      }
    } else {
      // 32 codes fill exactly kBits words; affine groups (≥ 32) hold whole runs.
      const int64_t runs = w.in / 32;
      for (int64_t c = lane; c < runs; c += kWarp) {
        uint32_t words[kBits];
#pragma unroll
        for (int i = 0; i < kBits; ++i) words[i] = __ldg(r + c * kBits + i);
        const Group g = group(w, g0 + ((c * 32) >> w.group_shift));
#pragma unroll
        for (int k = 0; k < 32; k += 4)
          fma4<kMaxT, kVecX, kStagedX>(acc, value(extract<kBits>(words, k), g), value(extract<kBits>(words, k + 1), g),
                             value(extract<kBits>(words, k + 2), g), value(extract<kBits>(words, k + 3), g), x, ldx,
                             T, c * 32 + k);
      }
    }
  }
};

// f(Format{}) for the view's format; throws for one no kernel reads.
template <class F>
void dispatch(const WeightView& w, F&& f) {
  using quant::Mode;
  if (!w.quantized) {
    switch (w.dtype) {
      case DType::f32: return f(Dense<F32Elem>{});
      case DType::bf16: return f(Dense<Bf16Elem>{});
      case DType::f16: return f(Dense<F16Elem>{});
      default: throw_error("cuda: dense weights must be f32, bf16 or f16");
    }
  }
  switch (w.mode) {
    case Mode::affine:
      switch (w.bits) {
        case 2: return f(Quant<Mode::affine, 2>{});
        case 3: return f(Quant<Mode::affine, 3>{});
        case 4: return f(Quant<Mode::affine, 4>{});
        case 5: return f(Quant<Mode::affine, 5>{});
        case 6: return f(Quant<Mode::affine, 6>{});
        case 8: return f(Quant<Mode::affine, 8>{});
        default: break;
      }
      break;
    case Mode::mxfp4: return f(Quant<Mode::mxfp4, 4>{});
    case Mode::nvfp4: return f(Quant<Mode::nvfp4, 4>{});
    case Mode::mxfp8: return f(Quant<Mode::mxfp8, 8>{});
  }
  throw_error("cuda: no kernel reads this quantized layout");
}

}  // namespace qinfer::cuda
