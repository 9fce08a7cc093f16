// `qinfer devices`: the CUDA GPUs this machine sees, with the facts that bound kernel speed.
#ifdef QINFER_HAVE_CUDA
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/device.h"
#include "cli/commands.h"

namespace {

using namespace qinfer;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void print_devices(bool measure_bandwidth) {
  auto devices = cuda::list_devices();
  if (devices.empty()) {
    fmt::print("no CUDA device found\n");
    return;
  }
  for (const auto& device : devices) {
    fmt::print("GPU {}: {}\n", device.index, device.name);
    fmt::print("  compute capability {}.{}, {} SMs, L2 {:.0f} MiB\n", device.compute_major, device.compute_minor,
               device.sm_count, device.l2_cache_bytes / (1024.0 * 1024.0));
    fmt::print("  memory {:.1f} GiB total, {:.1f} GiB free; {}-bit bus at {} MHz (peak {:.0f} GB/s)\n",
               device.total_memory_bytes / kGiB, device.free_memory_bytes / kGiB, device.memory_bus_width_bits,
               device.memory_clock_khz / 1000, device.peak_memory_bandwidth_gbs());
    if (measure_bandwidth) {
      QINFER_CUDA_CHECK(cudaSetDevice(device.index));
      double gbs = cuda::measure_copy_bandwidth_gbs();
      fmt::print("  copy bandwidth {:.0f} GB/s (device-to-device 1 GiB, read + write, median of 20)\n", gbs);
    }
  }
}

}  // namespace

// Declared by cli/commands.h outside qinfer::cli, like main.cpp's other CUDA-only wiring.
void add_devices_command(CLI::App& app) {
  auto* command = app.add_subcommand("devices", "List the CUDA GPUs and their memory, SMs and caches");
  auto measure_bandwidth = std::make_shared<bool>(false);
  command->add_flag("--bandwidth", *measure_bandwidth, "Also measure device-to-device copy bandwidth");
  command->callback([measure_bandwidth] { print_devices(*measure_bandwidth); });
}
#endif  // QINFER_HAVE_CUDA
