// One-token GEMV for MLX affine 4/8-bit weights: y[row] = Σ_groups s·Σq·x + b·Σx, read at HBM speed;
// several matrices reading the same x (q/k/v, gate/up) share one launch. The routed experts of a
// decode batch run on it too: every (token, expert) slot's gate and up in one launch, every slot's
// down rows in another, each task picking its expert's rows from the routing ids on the device.
//
// A code masked in place at bit p (< 16) of a 16-bit half of its word is, as f32 bits, the denormal
// q·2^(p−149): exact, one AND per element and no offset to subtract. x is read with each element
// multiplied by 2^(S−p) for the bit position p its code sits at, so one FMA per element adds the
// exact product q·x·2^(S−149) and only the f32 sum rounds (as in a plain dot). S is chosen per
// 16-byte chunk of codes from its x's largest magnitude, which keeps those products normal (≈ 2^-24
// for the largest) and x·2^S finite; the chunk's 2^(149−S) is folded into the group scale. Limits:
// |x| or |s·x| beyond ~2^100 overflows, and a chunk whose largest |x| is below ~2^-80 keeps less than
// f32 precision in its own (negligible) share of the sum; no activation comes near either.
//
// The kernel is a persistent grid (a few blocks per SM), each block owning a contiguous run of row
// groups (kRows rows each). Work is split into tasks, a row group × a slice of the row length, and
// the block's warps take tasks in turn; a lane reads one 16-byte chunk of each of the kRows rows per
// step. Per lane two steps are in flight at once (double buffering across task boundaries), so HBM
// keeps streaming while a warp decodes: the decode costs about as many instructions as the bytes
// take to arrive, and without overlap the two add up. Each block first issues its first two steps'
// code loads, then (once the previous kernel is done) writes the pre-scaled x with each chunk's
// 2^(149−S) and Σx to shared memory: no separate kernel and no dependent launch in between. Warps'
// per-task sums meet in shared memory and are added in a fixed order: results depend on neither
// grid nor scheduling.
//
// The fast precision reads x as a 16-bit integer per element instead (x ≈ sx·n, |n| ≤ 32639, sx =
// the chunk's largest |x| / 32639), stored as two signed 8-bit digits n = 256·h + l, and takes
// the dot products of codes and digits four at a time with dp4a: a 4-bit code byte's low nibble
// masked in place is its even element's code, the high nibble masked in place 16× its odd element's,
// so a 32-bit word of codes is two masks and four dp4a (h and l of even and odd elements) instead of
// eight masks and eight FMAs (8-bit: the code bytes as they are, two dp4a a word). A chunk's integer
// sum is exact (below 2^28) and rounds once, to f32; x's rounding to 16 bits (≤ sx/2 per element,
// ~1.5e-5 of the chunk's largest) is the difference that counts against the exact form, well below
// the bf16 operands of the fast precision's GEMMs.
//
// The SwiGLU MLP's gate and up share x and a shape: as one launch their row groups interleave (gate's
// group i, then up's), so a block holds both halves of its rows and its epilogue writes silu(g)·u;
// no separate SiLU·mul launch and no gate/up round trip through memory.
#include <cuda_fp16.h>

#include <array>
#include <atomic>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;         // rows per task: a lane has kRows 16-byte loads per step
constexpr int kBlocksPerSm = 2;  // within 128 registers a thread, no spills
// A slice gives each lane at least this many steps where the row allows. Measured on an H200 (8B
// decode), 2 is slower: 3% for the exact kernel, 3% for the fast one (368 tok/s against 357), though
// alone the fast kernel's one-matrix cases read faster with it (4096 -> 12288: 59% of the copy probe
// against 53%).
constexpr int kMinSteps = 4;

// How affine scales and biases are stored: Raw is loaded, decode gives the f32 value.
struct ScaleF32 {
  using Raw = float;
  __device__ static float decode(Raw v) { return v; }
};
struct ScaleBf16 {
  using Raw = unsigned short;
  __device__ static float decode(Raw v) { return format::Bf16::decode(v); }
};
struct ScaleF16 {
  using Raw = unsigned short;
  // The hardware conversion is exact (it differs from F16::decode only in NaN payloads).
  __device__ static float decode(Raw v) { return __half2float(__ushort_as_half(v)); }
};

// Unit i of chunk c among kUnits 16-byte units a chunk: the 8 lanes of one 16-byte shared load read
// consecutive chunks, which the swizzle spreads over all 32 banks.
template <int kUnits>
__device__ int64_t swizzled_unit(int64_t c, int i) {
  return c * kUnits + (i ^ static_cast<int>((c * kUnits / 8) % kUnits));
}

template <int kBits>
struct Layout {
  static constexpr int kChunk = 128 / kBits;  // elements per 16-byte chunk of codes
  static constexpr int kUnits = kChunk / 4;   // float4s of x per chunk
  static constexpr int kWordCodes = 32 / kBits;
  static constexpr int kHalfCodes = 16 / kBits;  // codes per 16-bit half: bit position p = kBits·(k % this)
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
  // Where float4 i of chunk c's x sits in shared memory.
  __device__ static int64_t unit(int64_t c, int i) { return swizzled_unit<kUnits>(c, i); }
};

// x as digits (the fast precision): per 16-byte chunk of codes, kUnits int4s of packed int8 digits,
// swizzled as Layout's float4s. 4-bit: unit k serves code word k as (h of its even elements, h of its
// odd, l of its even, l of its odd), element 8k + 2b (+ 1) in byte b. 8-bit: unit k serves words 2k
// and 2k + 1 as (h, l, h, l), element 4w + b in byte b.
template <int kBits>
struct Digits {
  static constexpr int kChunk = 128 / kBits;
  static constexpr int kUnits = kChunk / 8;
  static constexpr int kLimit = 127 * 256 + 127;  // the largest |n| whose h = round(n / 256) fits int8
  __device__ static int64_t unit(int64_t c, int i) { return swizzled_unit<kUnits>(c, i); }
};

// d + Σ a.byte[i]·b.byte[i], a's bytes unsigned (a masked high nibble is up to 240), b's signed.
__device__ __forceinline__ int dot4(uint32_t a, int b, int d) {
  int r;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(d));
  return r;
}

// The matrices of one launch, sharing x and its quantization layout: matrix i owns row groups
// [first_group[i], first_group[i + 1]); each row is cut into 2^split_shift slices of `steps` steps or fewer.
struct AffineBatch {
  int count, split_shift, group_shift;  // split = 2^split_shift
  // (gate, up) of one shape, row group i of the launch being group i / 2 of matrix i % 2: y[0] gets
  // silu(x·gate)·(x·up).
  bool swiglu;
  // Per row; chunks: 16-byte code chunks. 32-bit (plan_affine checks): the per-step index
  // arithmetic is a fair share of a step's instructions.
  int chunks, row_bytes, groups, steps;
  const char* codes[kMaxGemvMatrices];
  const void* scales[kMaxGemvMatrices];
  const void* biases[kMaxGemvMatrices];
  float* y[kMaxGemvMatrices];
  int rows[kMaxGemvMatrices];
  int first_group[kMaxGemvMatrices + 1];
  int block_units, extra_units;  // units (groups, or swiglu pairs) a block: block_units, +1 in the first extra_units
  NormFold fold;  // residual null: x as given
  // Routed experts (moe_experts): each matrix (gate and up under swiglu, else down) is a stack of
  // `experts` blocks of rows[m] rows, and the launch runs `slots` of them, slot s taking block
  // expert_ids[s] (a bad id is reported and reads block 0). A matrix's row groups are slot-major,
  // expert_groups a slot; slot s's rows go to y[m] + s·rows[m]. x holds a row of `chunks` chunks
  // per x_slot_div slots (gate / up: a token's k slots share its x; down: a row per slot).
  const int32_t* expert_ids;  // null: plain matrices
  int experts, slots, x_slot_div;
  int expert_groups;  // set by plan_affine
  DeviceStatus* status;
  int x_chunks;  // set by plan_affine: `chunks`, or a row per x_slot_div slots
};

// Row group `group` of a launch: its matrix, routed slot (0 without experts) and row group within
// the matrix (with experts: within the slot's expert).
struct GroupAt {
  int m, slot, group;
};
__device__ __forceinline__ GroupAt locate(const AffineBatch& b, int group) {
  GroupAt at{0, 0, group};
  if (b.swiglu) {
    at.m = group & 1, at.group = group >> 1;
  } else if (!b.expert_ids) {
    while (at.m + 1 < b.count && group >= b.first_group[at.m + 1]) ++at.m;
    at.group = group - b.first_group[at.m];
  }
  if (b.expert_ids) at.slot = at.group / b.expert_groups, at.group -= at.slot * b.expert_groups;
  return at;
}

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }

// Streamed code bytes skip L1, which keeps the scales (shared by neighbouring lanes) cached there.
__device__ __forceinline__ void load_chunk(const char* p, uint32_t (&dst)[4]) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
               : "l"(p));
}

// One step of one lane: chunk c (−1: none) of the task's kRows rows.
template <class Raw>
struct Step {
  int task, index, c;
  uint32_t raw[kRows][4];
  Raw scale[kRows], bias[kRows];
};

// Bytes of shared memory x takes per element: f32 pre-scaled, or two int8 digits.
__host__ __device__ constexpr int x_bytes(bool digits) { return digits ? 2 : 4; }

template <int kBits, class Scale, bool kDigits>
__global__ void __launch_bounds__(kWarps* kWarp, kBlocksPerSm)
    gemv_affine_kernel(const float* __restrict__ x, const __grid_constant__ AffineBatch b) {
  using L = Layout<kBits>;
  using D = Digits<kBits>;
  using Raw = typename Scale::Raw;
  extern __shared__ float4 shared[];
  float4* xs = shared;                              // exact: chunks × L::kUnits pre-scaled x, swizzled
  int4* xd = reinterpret_cast<int4*>(shared);       // fast: chunks × D::kUnits digits, swizzled
  // Per chunk: exact (2^(149−S), Σx); fast (sx, Σx), sx / 16 for 4-bit (its odd codes count 16×).
  float2* meta = reinterpret_cast<float2*>(reinterpret_cast<char*>(shared) + b.x_chunks * L::kChunk * x_bytes(kDigits));
  float* partial = reinterpret_cast<float*>(meta + b.x_chunks);     // tasks × kRows
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  // The block's row groups: the host split the launch's units (row groups, or (gate, up) pairs of
  // them under swiglu) evenly, the first `extra_units` blocks taking one more, so no 64-bit division
  // comes before the first loads.
  const int block = static_cast<int>(blockIdx.x), pair = b.swiglu ? 2 : 1;
  const int64_t group0 = pair * (block * b.block_units + min(block, b.extra_units));
  const int64_t group_end = group0 + pair * (b.block_units + (block < b.extra_units ? 1 : 0));
  const int tasks = static_cast<int>((group_end - group0) << b.split_shift);

  // The task whose steps are being loaded: its first row's codes, scales and biases, its rows in
  // the matrix from there (kRows or fewer), its chunks [begin, end) and its x row's first chunk.
  // Set at each task's first step, so the later steps' loads are a few adds (worked out at every
  // step, this arithmetic is about a third of the kernel's instructions).
  struct Span {
    const char* codes;
    const Raw* scales;
    const Raw* biases;
    int valid, begin, end, x0;
  } span{};
  // Loads step `index` of `task` (a warp's tasks are warp, warp + kWarps, ...); false past the last.
  auto load = [&](int task, int index, Step<Raw>& s) {
    s.task = task, s.index = index, s.c = -1;
    if (task >= tasks) return false;
    if (index == 0) {
      // split is a power of two: shifts, not 64-bit divisions.
      const GroupAt at = locate(b, static_cast<int>(group0) + (task >> b.split_shift));
      const int slice = task & ((1 << b.split_shift) - 1);
      const int row0 = at.group * kRows;
      int64_t first_row = row0;
      int x0 = 0;
      if (b.expert_ids) {
        int expert = load_after_wait(b.expert_ids + at.slot);
        if (expert < 0 || expert >= b.experts) {
          if (lane == 0) report(b.status, kStatusExpertId, at.slot, expert, b.experts);
          expert = 0;
        }
        first_row += static_cast<int64_t>(expert) * b.rows[at.m];
        x0 = at.slot / b.x_slot_div * b.chunks;
      }
      span = {b.codes[at.m] + first_row * b.row_bytes, static_cast<const Raw*>(b.scales[at.m]) + first_row * b.groups,
              static_cast<const Raw*>(b.biases[at.m]) + first_row * b.groups, min(b.rows[at.m] - row0, kRows),
              (b.chunks * slice) >> b.split_shift, (b.chunks * (slice + 1)) >> b.split_shift, x0};
    }
    const int c = span.begin + lane + kWarp * index;
    if (c >= span.end) return true;
    s.c = span.x0 + c;  // consume reads x's chunk
    const char* codes = span.codes + c * 16;
    const int scale_at = (c * L::kChunk) >> b.group_shift;
    const Raw* scales = span.scales + scale_at;
    const Raw* biases = span.biases + scale_at;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // Rows past the matrix's end (a short last group) load nothing and add zeros.
      if (r == 0 || r < span.valid) {
        load_chunk(codes + static_cast<int64_t>(r) * b.row_bytes, s.raw[r]);
        s.scale[r] = __ldg(scales + static_cast<int64_t>(r) * b.groups);
        s.bias[r] = __ldg(biases + static_cast<int64_t>(r) * b.groups);
      } else {
        s.raw[r][0] = s.raw[r][1] = s.raw[r][2] = s.raw[r][3] = 0u;
        s.scale[r] = s.bias[r] = Raw{};
      }
    }
    return true;
  };
  auto advance = [&](const Step<Raw>& s, int& task, int& index) {
    task = s.task, index = s.index + 1;
    if (index == b.steps) task += kWarps, index = 0;
  };

  float acc[kRows] = {};
  // Adds step s to acc; after a task's last step, its sums go to shared memory.
  auto consume = [&](const Step<Raw>& s) {
    if (s.c >= 0) {
      const float2 chunk = meta[s.c];
      if constexpr (kDigits) {
        int n[kRows];
        if constexpr (kBits == 4) {
          // d0..d3: Σ over the chunk of (even code · h, 16·odd code · h, even code · l, 16·odd code · l).
          int d[kRows][4] = {};
#pragma unroll
          for (int word = 0; word < 4; ++word) {
            const int4 u = xd[D::unit(s.c, word)];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              const uint32_t even = s.raw[r][word] & 0x0F0F0F0Fu, odd = s.raw[r][word] & 0xF0F0F0F0u;
              d[r][0] = dot4(even, u.x, d[r][0]), d[r][1] = dot4(odd, u.y, d[r][1]);
              d[r][2] = dot4(even, u.z, d[r][2]), d[r][3] = dot4(odd, u.w, d[r][3]);
            }
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) n[r] = ((d[r][0] * 16 + d[r][1]) * 16 + d[r][2]) * 16 + d[r][3];
        } else {
          int h[kRows] = {}, l[kRows] = {};
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const int4 u = xd[D::unit(s.c, k)];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              h[r] = dot4(s.raw[r][2 * k], u.x, h[r]), l[r] = dot4(s.raw[r][2 * k], u.y, l[r]);
              h[r] = dot4(s.raw[r][2 * k + 1], u.z, h[r]), l[r] = dot4(s.raw[r][2 * k + 1], u.w, l[r]);
            }
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) n[r] = h[r] * 256 + l[r];
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          acc[r] = __fmaf_rn(Scale::decode(s.scale[r]), static_cast<float>(n[r]) * chunk.x,
                             __fmaf_rn(Scale::decode(s.bias[r]), chunk.y, acc[r]));
      } else {
        float dot[kRows] = {};
#pragma unroll
        for (int word = 0; word < 4; ++word) {
          float xv[L::kWordCodes];
#pragma unroll
          for (int i = 0; i < L::kWordCodes / 4; ++i) {
            const float4 f = xs[L::unit(s.c, word * (L::kWordCodes / 4) + i)];
            xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const uint32_t lo = s.raw[r][word], hi = lo >> 16;
#pragma unroll
            for (int j = 0; j < L::kWordCodes; ++j) {
              const uint32_t bits = (j < L::kHalfCodes ? lo : hi) & (L::kMask << (kBits * (j % L::kHalfCodes)));
              dot[r] = __fmaf_rn(__uint_as_float(bits), xv[j], dot[r]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          // dot·2^(149−S) first: exact (a power of two), and finite wherever the true partial sum is.
          acc[r] = __fmaf_rn(Scale::decode(s.scale[r]), dot[r] * chunk.x,
                             __fmaf_rn(Scale::decode(s.bias[r]), chunk.y, acc[r]));
        }
      }
    }
    if (s.index + 1 == b.steps) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sum = warp_sum(acc[r]);
        if (lane == 0) partial[s.task * kRows + r] = sum;
        acc[r] = 0.0f;
      }
    }
  };

  // The first two steps' codes are on their way before x (the previous kernel's output) is read;
  // routed experts wait first, for the ids that say which codes to read.
  allow_next_kernel();
  if (b.expert_ids) wait_for_previous_kernel();
  Step<Raw> a, c;
  int task = warp, index = 0;
  bool more_a = load(task, index, a);
  advance(a, task, index);
  bool more_c = load(task, index, c);
  wait_for_previous_kernel();
  // x's conversion sits between the previous kernel's end and the first step (the first steps'
  // codes have usually landed by then), so it is spread over the whole block: two threads a chunk,
  // half of its elements each, the chunk's largest |x| and its sum (first half + second half)
  // shared between the pair. Measured on an H200 (8B decode): 384 tok/s against 366 with a thread
  // a chunk.
  //
  // With a NormFold, x is rms_norm(residual + delta) · weight, which every block computes itself
  // (one pass: the host checked that the row's pairs fit the block): v = residual + delta, Σv² over
  // the block, then v · factor · weight. (Its sum order is not add_rms_norm's: the normed values
  // may differ from that launch's in the last bit.)
  __shared__ float fold_scratch[kWarp];
  const NormFold& fold = b.fold;
  constexpr int kHalf = L::kChunk / 2;
  constexpr int kThreads = kWarps * kWarp;
  const int pair_slots = (2 * b.x_chunks + kThreads - 1) / kThreads * kThreads;  // whole pairs a pass
  for (int j = threadIdx.x; j < pair_slots; j += kThreads) {
    const int k = j / 2, half = j & 1;
    const bool valid = k < b.x_chunks;
    const int first = k * L::kChunk + half * kHalf;  // this thread's first element of x
    float v[kHalf];
#pragma unroll
    for (int i = 0; i < kHalf / 4; ++i) {
      const float* src = fold.residual ? fold.residual : x;
      float4 f = valid ? load_after_wait(reinterpret_cast<const float4*>(src + first) + i)
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (fold.residual && valid) {
        const float4 d = load_after_wait(reinterpret_cast<const float4*>(fold.delta + first) + i);
        f = make_float4(f.x + d.x, f.y + d.y, f.z + d.z, f.w + d.w);
      }
      v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
    }
    if (fold.residual) {
      float squares = 0.0f;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) squares = fmaf(v[i], v[i], squares);
      const float factor = 1.0f / sqrtf(block_sum(squares, fold_scratch) / static_cast<float>(b.chunks * L::kChunk) + fold.eps);
#pragma unroll
      for (int i = 0; i < kHalf / 4; ++i) {
        if (!valid) break;
        const float4 w = __ldg(reinterpret_cast<const float4*>(fold.weight + first) + i);
        const float4 n = make_float4(v[4 * i] * factor * w.x, v[4 * i + 1] * factor * w.y, v[4 * i + 2] * factor * w.z,
                                     v[4 * i + 3] * factor * w.w);
        v[4 * i] = n.x, v[4 * i + 1] = n.y, v[4 * i + 2] = n.z, v[4 * i + 3] = n.w;
        if (blockIdx.x == 0) reinterpret_cast<float4*>(fold.normed + first)[i] = n;
      }
    }
    float top = 0.0f, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) top = fmaxf(top, fabsf(v[i])), sum += v[i];
    top = fmaxf(top, __shfl_xor_sync(0xFFFFFFFFu, top, 1));
    const float other = __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    sum = half == 0 ? sum + other : other + sum;
    if (!valid) continue;
    if constexpr (kDigits) {
      // n = 256·h + l with h = round(n / 256): h in [-127, 127], l in [-128, 127]. A non-finite
      // chunk gets no digits; its Σx carries the NaN / infinity into every row's sum.
      constexpr int kHalfUnits = D::kUnits / 2;
      const float inv = top > 0.0f && top <= 3.4e38f ? D::kLimit / top : 0.0f;
      uint32_t h[kHalf], l[kHalf];
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const int n = min(max(__float2int_rn(v[i] * inv), -D::kLimit), D::kLimit), hi = (n + 128) >> 8;
        h[i] = static_cast<uint32_t>(hi) & 0xFFu, l[i] = static_cast<uint32_t>(n - hi * 256) & 0xFFu;
      }
      auto pack = [](const uint32_t* d, int first, int stride) {
        return static_cast<int>(d[first] | d[first + stride] << 8 | d[first + 2 * stride] << 16 | d[first + 3 * stride] << 24);
      };
#pragma unroll
      for (int u = 0; u < kHalfUnits; ++u) {
        int4& unit = xd[D::unit(k, half * kHalfUnits + u)];
        if constexpr (kBits == 4) {
          unit = make_int4(pack(h, 8 * u, 2), pack(h, 8 * u + 1, 2), pack(l, 8 * u, 2), pack(l, 8 * u + 1, 2));
        } else {
          unit = make_int4(pack(h, 8 * u, 1), pack(l, 8 * u, 1), pack(h, 8 * u + 4, 1), pack(l, 8 * u + 4, 1));
        }
      }
      if (half == 0) meta[k] = make_float2(top / D::kLimit * (kBits == 4 ? 1.0f / 16.0f : 1.0f), sum);
    } else {
      // |x| < 2^(e − 126) for biased exponent e, so |x|·2^S < 2^126 with S = 252 − e; S ≤ 127 keeps
      // 2^(S−p) normal, S ≥ 22 keeps 2^(149−S) finite. Element j of the chunk sits at bit position
      // p = kBits·(j mod kHalfCodes) of its 16-bit half.
      const int e = static_cast<int>(__float_as_uint(top) >> 23);
      const int S = min(max(252 - e, 22), 127);
#pragma unroll
      for (int i = 0; i < kHalf / 4; ++i) {
        const int first = half * kHalf + 4 * i;
        float4 f;
        f.x = v[4 * i] * pow2(S - kBits * (first % L::kHalfCodes));
        f.y = v[4 * i + 1] * pow2(S - kBits * ((first + 1) % L::kHalfCodes));
        f.z = v[4 * i + 2] * pow2(S - kBits * ((first + 2) % L::kHalfCodes));
        f.w = v[4 * i + 3] * pow2(S - kBits * ((first + 3) % L::kHalfCodes));
        xs[L::unit(k, first / 4)] = f;
      }
      if (half == 0) meta[k] = make_float2(pow2(149 - S), sum);
    }
  }
  __syncthreads();
  // Every thread of this block has read the residual: the last block to count itself stores the
  // sum (it needs the count only at the end).
  int ticket = 0;
  if (fold.residual && threadIdx.x == 0) ticket = atomicAdd(fold.arrivals, 1);
  // Two steps in flight per lane: while one is decoded the other (and then its successor) loads.
  while (more_a) {
    consume(a);
    advance(c, task, index);
    more_a = load(task, index, a);
    if (!more_c) break;
    consume(c);
    advance(a, task, index);
    more_c = load(task, index, c);
  }
  __shared__ bool fold_last;
  if (fold.residual && threadIdx.x == 0) fold_last = ticket == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (fold.residual && fold_last) {
    // residual + delta as add_rms_norm stores it; no other block reads the residual any more.
    const int n4 = b.chunks * L::kChunk / 4;
    for (int i = threadIdx.x; i < n4; i += kThreads) {
      const float4 r = reinterpret_cast<const float4*>(fold.residual)[i];
      const float4 d = reinterpret_cast<const float4*>(fold.delta)[i];
      reinterpret_cast<float4*>(fold.residual)[i] = make_float4(r.x + d.x, r.y + d.y, r.z + d.z, r.w + d.w);
    }
    if (threadIdx.x == 0) *fold.arrivals = 0;  // ready for the next launch (and replay)
  }
  // Local row group l's row r: its slices' sums in order.
  auto row_sum = [&](int64_t l, int64_t r) {
    float sum = 0.0f;
    for (int64_t s = 0; s < (int64_t{1} << b.split_shift); ++s) sum += partial[((l << b.split_shift) + s) * kRows + r];
    return sum;
  };
  if (b.swiglu) {
    for (int64_t i = threadIdx.x; i < (group_end - group0) / 2 * kRows; i += kThreads) {
      const int64_t l = 2 * (i / kRows);
      const GroupAt at = locate(b, static_cast<int>(group0 + l));
      const int64_t row = int64_t{at.group} * kRows + i % kRows;
      if (row < b.rows[0])  // silu_mul's arithmetic
        b.y[0][int64_t{at.slot} * b.rows[0] + row] = silu(row_sum(l, i % kRows)) * row_sum(l + 1, i % kRows);
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < (group_end - group0) * kRows; i += kThreads) {
    const GroupAt at = locate(b, static_cast<int>(group0 + i / kRows));
    const int64_t row = int64_t{at.group} * kRows + i % kRows;
    if (row >= b.rows[at.m]) continue;
    b.y[at.m][int64_t{at.slot} * b.rows[at.m] + row] = row_sum(i / kRows, i % kRows);
  }
}

// A device attribute, read from the driver once per device (a launch must not wait on queries).
template <cudaDeviceAttr kAttribute>
int device_attribute() {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int>, kDevices> cache{};
  int device = 0;
  QINFER_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>* slot = device < kDevices ? &cache[device] : nullptr;
  int value = slot ? slot->load(std::memory_order_relaxed) : 0;
  if (value == 0) {
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttribute, device));
    if (slot) slot->store(value, std::memory_order_relaxed);
  }
  return value;
}

template <int kBits, class Scale, bool kDigits>
void launch_kernel(const float* x, const AffineBatch& b, unsigned blocks, size_t shared, cudaStream_t stream) {
  // Beyond 48 KiB a kernel must opt in (a per-device function attribute, cheap to set again).
  if (shared > 48 * 1024)
    QINFER_CUDA_CHECK(cudaFuncSetAttribute(gemv_affine_kernel<kBits, Scale, kDigits>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  launch_overlapped(gemv_affine_kernel<kBits, Scale, kDigits>, blocks, kWarps * kWarp, shared, stream, x, b);
}

template <class Scale>
void launch_scaled(const float* x, const AffineBatch& b, int bits, bool digits, unsigned blocks, size_t shared,
                   cudaStream_t stream) {
  if (digits) {
    if (bits == 8) return launch_kernel<8, Scale, true>(x, b, blocks, shared, stream);
    return launch_kernel<4, Scale, true>(x, b, blocks, shared, stream);
  }
  if (bits == 8) return launch_kernel<8, Scale, false>(x, b, blocks, shared, stream);
  launch_kernel<4, Scale, false>(x, b, blocks, shared, stream);
}

// Whether the kernel takes w, and w with the batch's first matrix shares x's layout.
bool takes(const WeightView& w, const WeightView& first) {
  if (!w.quantized || w.mode != quant::Mode::affine || (w.bits != 4 && w.bits != 8) || !w.biases) return false;
  if ((w.group_size != 32 && w.group_size != 64 && w.group_size != 128) || w.in <= 0 || w.in % w.group_size != 0)
    return false;
  if (w.in > (int64_t{1} << 26) || w.rows > (int64_t{1} << 28)) return false;  // the kernel's 32-bit indices
  if (w.scale_dtype != DType::f32 && w.scale_dtype != DType::bf16 && w.scale_dtype != DType::f16) return false;
  if (!aligned16(w.data) || w.row_words % 4 != 0 || w.row_words * 32 != w.in * w.bits) return false;
  return w.bits == first.bits && w.group_size == first.group_size && w.scale_dtype == first.scale_dtype &&
         w.in == first.in;
}

// How b runs: its grid and dynamic shared memory; b gets the layout from `first` and the plan's split.
struct Plan {
  bool fits = false;   // false: the batch does not fit shared memory
  unsigned blocks = 0; // 0: nothing to do
  size_t shared = 0;
  bool digits = false;  // x as int8 digits (the fast precision)
};

Plan plan_affine(AffineBatch& b, const WeightView& first, bool digits) {
  b.chunks = static_cast<int>(first.in * first.bits / 128);
  b.group_shift = first.group_shift;
  b.row_bytes = static_cast<int>(first.row_words * 4);
  b.groups = static_cast<int>(first.in >> first.group_shift);
  // Slices long enough for kMinSteps steps a lane (pipelining needs more than one), at most kWarps.
  int64_t split = 1;
  while (split < kWarps && b.chunks / (2 * split) >= int64_t{kMinSteps} * kWarp) split *= 2, ++b.split_shift;
  const int per_matrix = b.expert_ids ? b.slots : 1;  // routed experts: a block of rows per slot
  for (int i = 0; i < b.count; ++i) b.first_group[i + 1] = b.first_group[i] + per_matrix * ((b.rows[i] + kRows - 1) / kRows);
  b.expert_groups = (b.rows[0] + kRows - 1) / kRows;  // with experts, every matrix's rows are an expert's
  b.x_chunks = b.chunks * (b.expert_ids ? b.slots / b.x_slot_div : 1);
  const int64_t groups = b.first_group[b.count];
  if (groups == 0) return {true, 0, 0};
  // A matrix too small for a task per warp of the full grid (an attention output projection) takes
  // shorter slices, down to two steps a lane, while the tasks still fit: more warps in flight.
  const int64_t grid_blocks = int64_t{kBlocksPerSm} * device_attribute<cudaDevAttrMultiProcessorCount>();
  const int64_t grid_warps = grid_blocks * kWarps;
  while (split < kWarps && 2 * groups * split <= grid_warps && b.chunks / (2 * split) >= 2 * kWarp)
    split *= 2, ++b.split_shift;
  b.steps = static_cast<int>(((b.chunks + split - 1) / split + kWarp - 1) / kWarp);
  // A persistent grid: kBlocksPerSm blocks an SM, fewer where the blocks would get under a task a
  // warp (and under swiglu no more blocks than (gate, up) pairs of row groups).
  const int64_t pair = b.swiglu ? 2 : 1;
  const int64_t blocks =
      std::clamp<int64_t>(std::min((groups * split + kWarps - 1) / kWarps, groups / pair), 1, grid_blocks);
  b.block_units = static_cast<int>(groups / pair / blocks);
  b.extra_units = static_cast<int>(groups / pair % blocks);
  const int64_t block_groups = pair * ((groups / pair + blocks - 1) / blocks);
  const size_t shared = static_cast<size_t>(int64_t{b.x_chunks} * 128 / first.bits * x_bytes(digits) + b.x_chunks * sizeof(float2) +
                                            block_groups * split * kRows * sizeof(float));
  if (shared > static_cast<size_t>(device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>())) return {};
  return {true, static_cast<unsigned>(blocks), shared, digits};
}

void launch_plan(const float* x, const AffineBatch& b, const WeightView& first, const Plan& plan,
                 cudaStream_t stream) {
  if (plan.blocks == 0) return;
  const int bits = first.bits;
  if (first.scale_dtype == DType::bf16) launch_scaled<ScaleBf16>(x, b, bits, plan.digits, plan.blocks, plan.shared, stream);
  else if (first.scale_dtype == DType::f16) launch_scaled<ScaleF16>(x, b, bits, plan.digits, plan.blocks, plan.shared, stream);
  else launch_scaled<ScaleF32>(x, b, bits, plan.digits, plan.blocks, plan.shared, stream);
}

// The (gate, up) batch of the fused SwiGLU.
// Matrix i of b: w, its rows going to y.
void set_matrix(AffineBatch& b, int i, const WeightView& w, float* y) {
  b.codes[i] = static_cast<const char*>(w.data);
  b.scales[i] = w.scales;
  b.biases[i] = w.biases;
  b.y[i] = y;
  b.rows[i] = static_cast<int>(w.rows);
}

AffineBatch swiglu_batch(const WeightView& gate, const WeightView& up, float* out) {
  AffineBatch b{};
  b.count = 2;
  b.swiglu = true;
  set_matrix(b, 0, gate, out);
  set_matrix(b, 1, up, out);
  return b;
}

}  // namespace

bool gemv_affine_folds(const NormFold& fold, const WeightView& w) {
  const int64_t chunks = w.in * w.bits / 128;
  return fold.residual && fold.arrivals && 2 * chunks <= kWarps * kWarp && aligned16(fold.residual) &&
         aligned16(fold.delta) && aligned16(fold.weight) && aligned16(fold.normed);
}

bool try_launch_gemv_affine(const float* x, const GemvBatch& batch, cudaStream_t stream) {
  if (batch.count < 1 || batch.count > kMaxGemvMatrices || !aligned16(x)) return false;
  const WeightView& first = batch.w[0];
  if (batch.fold.residual && !(takes(first, first) && gemv_affine_folds(batch.fold, first))) return false;
  AffineBatch b{};
  b.count = batch.count;
  b.fold = batch.fold;
  for (int i = 0; i < batch.count; ++i) {
    const WeightView& w = batch.w[i];
    if (!takes(w, first)) return false;
    set_matrix(b, i, w, batch.y[i]);
  }
  const Plan plan = plan_affine(b, first, batch.fast);
  if (!plan.fits || (b.fold.residual && plan.blocks == 0)) return false;  // a fold needs a launch
  launch_plan(x, b, first, plan, stream);
  return true;
}

bool try_launch_moe_affine(const float* x, int64_t T, int64_t k, int64_t E, const int32_t* ids, const float* weights,
                           const WeightView& gate, const WeightView& up, const WeightView& down, float* act,
                           float* down_rows, float* out, bool fast, DeviceStatus* status, cudaStream_t stream) {
  const int64_t slots = T * k;
  if (T < 1 || k < 1 || E < 1 || !aligned16(x) || !aligned16(act)) return false;
  if (!takes(gate, gate) || !takes(up, gate) || !takes(down, down) || up.rows != gate.rows) return false;
  if (gate.rows % E != 0 || down.rows % E != 0 || down.in != gate.rows / E || gate.in != down.rows / E) return false;
  const int64_t I = gate.rows / E, H = down.rows / E;
  // The kernel's 32-bit x chunk and row group indices (row groups: 2·slots·⌈rows / kRows⌉, fewer
  // than slots·rows for rows of at least 32 elements, which takes() holds to).
  if (slots * std::max(I, H) >= (int64_t{1} << 30)) return false;
  AffineBatch gate_up = swiglu_batch(gate, up, act);
  AffineBatch downs{};
  downs.count = 1;
  set_matrix(downs, 0, down, down_rows);
  for (AffineBatch* b : {&gate_up, &downs}) {
    b->expert_ids = ids, b->status = status;
    b->experts = static_cast<int>(E), b->slots = static_cast<int>(slots);
  }
  gate_up.rows[0] = gate_up.rows[1] = static_cast<int>(I);  // an expert's rows
  gate_up.x_slot_div = static_cast<int>(k);  // a token's slots share its x
  downs.rows[0] = static_cast<int>(H);
  downs.x_slot_div = 1;  // each slot its own activation row
  const Plan gate_up_plan = plan_affine(gate_up, gate, fast), down_plan = plan_affine(downs, down, fast);
  if (!gate_up_plan.fits || !down_plan.fits) return false;
  launch_plan(x, gate_up, gate, gate_up_plan, stream);
  launch_plan(act, downs, down, down_plan, stream);
  launch_moe_combine(down_rows, nullptr, weights, T, k, H, out, stream);
  return true;
}

bool gemv_affine_swiglu_fits(const float* x, const WeightView& gate, const WeightView& up) {
  if (!aligned16(x) || !takes(gate, gate) || !takes(up, gate) || up.rows != gate.rows) return false;
  AffineBatch b = swiglu_batch(gate, up, nullptr);
  return plan_affine(b, gate, false).fits;  // digits take less shared memory than f32 x
}

void launch_gemv_affine_swiglu(const float* x, const WeightView& gate, const WeightView& up, float* out, bool fast,
                               const NormFold& fold, cudaStream_t stream) {
  AffineBatch b = swiglu_batch(gate, up, out);
  b.fold = fold;
  const Plan plan = plan_affine(b, gate, fast);
  if (plan.fits) launch_plan(x, b, gate, plan, stream);  // callers asked gemv_affine_swiglu_fits first
}

}  // namespace qinfer::cuda
