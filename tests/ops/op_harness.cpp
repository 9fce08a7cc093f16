// op_harness [--backend NAME] [--op SUBSTRING] [--perf]: runs every case of cases.cpp on the backend
// under test and on ref, one line per case and a final "N passed, M failed"; exits 1 on any failure.
#include <fmt/core.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <string_view>

#include "backend/cpu/cpu_ops.h"
#ifdef QINFER_HAVE_CUDA
#include "backend/cuda/bandwidth.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device.h"
#endif
#include "ops/harness.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace qinfer::harness {

namespace {

Tensor host_upload(Ops& ops, const Tensor& host) {
  Tensor t = ops.alloc(host.dtype, host.shape);
  if (host.nbytes() > 0) std::memcpy(t.data, host.data, host.nbytes());
  return t;
}

#ifdef QINFER_HAVE_CUDA
// Calls are queued between CUDA events (no host wait per call): batches of 8 calls, median over
// batches. Events on the legacy default stream order after the Ops' blocking stream.
double cuda_median_seconds(const std::function<void(int)>& fn) {
  int i = 0;
  constexpr int kBatch = 8;
  const double ms = cuda::median_time_ms([&] {
    for (int k = 0; k < kBatch; ++k) fn(i++);
  });
  return ms * 1e-3 / kBatch;
}

Backend::Device cuda_device() {
  auto l2 = [] {
    const auto devices = cuda::list_devices();
    return devices.empty() ? size_t{50} << 20 : static_cast<size_t>(devices[0].l2_cache_bytes);
  };
  return {[] { return cuda::measure_copy_bandwidth_gbs(); }, l2, cuda_median_seconds};
}
#endif

}  // namespace

const std::vector<Backend>& backends() {
  static const std::vector<Backend> list = {
      {"cpu", "the cpu backend with the best kernels this CPU runs",
       [] { return make_cpu_ops(global_thread_pool()); }, host_upload, clone},
      {"cpu-portable", "the cpu backend on its portable (non-AVX2) kernels",
       [] { return make_cpu_ops(global_thread_pool(), cpu::portable_kernels()); }, host_upload, clone},
#ifdef QINFER_HAVE_CUDA
      {"cuda", "the cuda backend on GPU 0, exact precision", [] { return make_cuda_ops(0, Precision::exact); },
       cuda::to_device, cuda::to_host, 0.0, cuda_device()},
      // bf16 operands in prefill GEMMs and attention: ~2^-9 per operand, a few 1e-3 per output.
      {"cuda-fast", "the cuda backend on GPU 0, fast precision", [] { return make_cuda_ops(0, Precision::fast); },
       cuda::to_device, cuda::to_host, 1e-2, cuda_device()},
#endif
  };
  return list;
}

Tensor random_tensor(Rng& rng, DType dtype, std::vector<int64_t> shape, float stddev) {
  Tensor t = host_tensor(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = rng.normal(stddev);
    switch (dtype) {
      case DType::f32: t.ptr<float>()[i] = x; break;
      case DType::bf16: t.ptr<uint16_t>()[i] = f32_to_bf16(x); break;
      case DType::f16: t.ptr<uint16_t>()[i] = f32_to_f16(x); break;
      default: throw std::invalid_argument("random_tensor: unsupported dtype");
    }
  }
  return t;
}

Tensor i32_tensor(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor t = host_tensor(DType::i32, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) throw std::invalid_argument("i32_tensor: size mismatch");
  if (!values.empty()) std::memcpy(t.data, values.data(), values.size() * sizeof(int32_t));  // no null source
  return t;
}

Tensor clone(const Tensor& host) {
  Tensor t = host_tensor(host.dtype, host.shape);
  if (host.nbytes() > 0) std::memcpy(t.data, host.data, host.nbytes());
  return t;
}

double rel_rms(const Tensor& got, const Tensor& want) {
  const auto is_float = [](DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; };
  if (got.shape != want.shape || got.dtype != want.dtype || !is_float(got.dtype)) return INFINITY;
  std::vector<float> g32(got.numel()), w32(want.numel());
  convert_to_f32(got.dtype, got.data, g32.data(), g32.size());
  convert_to_f32(want.dtype, want.data, w32.data(), w32.size());
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = g32[i], w = w32[i];
    diff += (g - w) * (g - w), norm += w * w;
  }
  if (std::isnan(diff)) return INFINITY;
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

void Run::compare(const std::string& output, const Tensor& dut_out, const Tensor& ref_out, double tolerance) {
  checks.push_back({output, rel_rms(get(dut_out), ref_out), std::max(tolerance, backend_.tolerance_floor)});
}

void Run::compare_ids(const std::string& output, const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t mismatches = got.size() == want.size() ? 0 : std::max(got.size(), want.size());
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) mismatches += got[i] != want[i];
  checks.push_back({output, static_cast<double>(mismatches), 0.0});
}

}  // namespace qinfer::harness

int main(int argc, char** argv) {
  using namespace qinfer;
  using namespace qinfer::harness;
  std::string backend_name = "cpu", filter;
  bool perf = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      backend_name = argv[++i];
    } else if (arg == "--op" && i + 1 < argc) {
      filter = argv[++i];
    } else if (arg == "--perf") {
      perf = true;
    } else {
      fmt::print(stderr, "usage: op_harness [--backend NAME] [--op SUBSTRING] [--perf]\nbackends:\n");
      for (const Backend& b : backends()) fmt::print(stderr, "  {:14} {}\n", b.name, b.description);
      return 2;
    }
  }
  const Backend* backend = nullptr;
  for (const Backend& b : backends())
    if (b.name == backend_name) backend = &b;
  if (backend == nullptr) {
    fmt::print(stderr, "op_harness: unknown backend '{}' (run with --help for the list)\n", backend_name);
    return 2;
  }
  std::unique_ptr<Ops> dut;
  try {
    dut = backend->make();
  } catch (const std::exception& e) {
    fmt::print(stderr, "op_harness: cannot start backend '{}': {}\n", backend_name, e.what());
    return 2;
  }
  if (perf && dut->device() != Device::cpu && !backend->device) {
    // perf.cpp's wall clock times host calls; device ops return before their kernels finish.
    fmt::print(stderr, "op_harness: --perf on {} needs a device timer\n", backend->name);
    return 2;
  }
  if (perf) return run_perf(*backend, *dut, filter);

  std::unique_ptr<Ops> ref = make_ref_ops();
  int passed = 0, failed = 0;
  uint64_t seed = 0;
  for (const Case& c : all_cases()) {
    ++seed;  // the seed follows the case's place in the full list, so --op reproduces a failure
    if (!filter.empty() && c.op.find(filter) == std::string::npos) continue;
    Run run(*ref, *dut, *backend, seed);
    std::string detail;
    bool ok = true;
    try {
      c.run(run);
      for (const Check& check : run.checks) {
        ok = ok && check.ok();
        detail += fmt::format("  {} {:.2e}{}", check.output, check.error, check.ok() ? "" : fmt::format(" > {:.0e}", check.tolerance));
      }
      if (run.checks.empty()) ok = false, detail = "  no checks ran";
    } catch (const std::exception& e) {
      ok = false, detail = fmt::format("  threw: {}", e.what());
    }
    (ok ? passed : failed)++;
    fmt::print("{} {:<16} {:<44}{}\n", ok ? "ok  " : "FAIL", c.op, c.params, detail);
  }
  fmt::print("{} passed, {} failed ({} vs ref)\n", passed, failed, backend->name);
  return failed == 0 && passed > 0 ? 0 : 1;
}
