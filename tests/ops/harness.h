#pragma once
// The op harness (like llama.cpp's test-backend-ops): every op of backend/ops.h on a backend under
// test against `ref` from identical inputs, compared by relative RMS; and a perf mode that prints
// GB/s against a memory-bandwidth probe. A backend plugs in as one Backend entry (backends()).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace qinfer::harness {

// A backend under test: how to make it and how tensors reach its memory and come back. Host
// backends copy; a device backend supplies its own transfers.
struct Backend {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<Ops>()> make;
  std::function<Tensor(Ops&, const Tensor& host)> upload;
  std::function<Tensor(const Tensor& device)> download;
  // A backend that rounds some operands to bf16 by design (cuda's fast precision) is held to at
  // least this relative RMS error everywhere.
  double tolerance_floor = 0.0;
  // --perf on an accelerator: its bandwidth ceiling (GB/s, a copy counted read + write), its last
  // cache level, and a timer of queued work (median seconds per call of fn(i), i cycling copies).
  struct Device {
    std::function<double()> probe_gbs;
    std::function<size_t()> cache_bytes;
    std::function<double(const std::function<void(int)>& fn)> median_seconds;
  };
  std::optional<Device> device;
};

const std::vector<Backend>& backends();

// SplitMix64 (Steele, Lea and Flood): a 64-bit state and three multiplies a draw, several times
// faster than mt19937_64 and ample for test inputs.
class SplitMix64 {
 public:
  using result_type = uint64_t;
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // Near-normal (Irwin–Hall: four 16-bit uniforms from one draw, mean 0, variance stddev², tails cut
  // at 3.46 stddev). The harness draws hundreds of millions of values; std::normal_distribution's
  // logarithms and rejections made input generation most of its run time.
  float normal(float stddev = 1.0f) {
    const uint64_t bits = gen_();
    const float sum = static_cast<float>((bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) +
                                         (bits >> 48)) + 2.0f;  // + 4 · 0.5: each uniform is (k + 0.5) / 65536
    constexpr float kScale = 1.7320508f / 65536.0f;              // sqrt(3): variance of 4 uniforms is 1/3
    return (sum - 2.0f * 65536.0f) * kScale * stddev;
  }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }  // [lo, hi]
  SplitMix64& engine() { return gen_; }

 private:
  SplitMix64 gen_;
};

// Host tensors: normal(0, stddev) values stored as `dtype` (f32, bf16 or f16), and i32 from a list.
Tensor random_tensor(Rng& rng, DType dtype, std::vector<int64_t> shape, float stddev = 1.0f);
Tensor i32_tensor(std::vector<int64_t> shape, const std::vector<int32_t>& values);
Tensor clone(const Tensor& host);

// ‖got − want‖ / ‖want‖ over float tensors of one dtype (‖got‖ when want is all zero).
double rel_rms(const Tensor& got, const Tensor& want);

// One comparison of one output of a case.
struct Check {
  std::string output;
  double error = 0.0, tolerance = 0.0;
  bool ok() const { return error <= tolerance; }
};

// What a case sees: both backends, transfers into / out of the one under test, and its checks.
class Run {
 public:
  Run(Ops& ref, Ops& dut, const Backend& backend, uint64_t seed) : ref(ref), dut(dut), rng(seed), backend_(backend) {}
  Ops& ref;
  Ops& dut;
  Rng rng;
  Tensor put(const Tensor& host) { return backend_.upload(dut, host); }
  Tensor get(const Tensor& device) { return backend_.download(device); }
  // Records rel_rms(dut result, ref result) against tolerance.
  void compare(const std::string& output, const Tensor& dut_out, const Tensor& ref_out, double tolerance);
  void compare_ids(const std::string& output, const std::vector<int32_t>& got, const std::vector<int32_t>& want);
  std::vector<Check> checks;

 private:
  const Backend& backend_;
};

struct Case {
  std::string op;      // the op's name in ops.h
  std::string params;  // dtype and shapes, for the report line
  std::function<void(Run&)> run;
};

std::vector<Case> all_cases();

// --perf: times `ops` on realistic shapes and prints GB/s next to a memory-bandwidth probe.
int run_perf(const Backend& backend, Ops& ops, const std::string& filter);

}  // namespace qinfer::harness
