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

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }  // [lo, hi]
  std::mt19937_64& engine() { return gen_; }

 private:
  std::mt19937_64 gen_;
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
