// The cuda backend: argument checks (the same rules and messages as cpu / ref), device memory,
// the batch layouts uploaded as index arrays, and the dispatch of every op to its kernels
// (launch.h). Prefill-sized linear layers go through cuBLASLt on bf16 operands (gemm.h);
// sampling copies logits to the host and runs sampling.h's definition, except greedy rows, which
// are picked on the device.
#include "backend/cuda/cuda_ops.h"

#include <cublas_v2.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/launch.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace qinfer::cuda {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

void check_cublas(cublasStatus_t status, const char* call) {
  QINFER_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS call {} failed: {}", call, cublasGetStatusString(status));
}

// --- argument checks -----------------------------------------------------------------------------

void check_tensor(std::string_view op, std::string_view arg, const Tensor& t, int rank) {
  QINFER_CHECK(t.device == Device::cuda, "cuda {}: {} is in host memory; device ops take tensors of the cuda backend",
               op, arg);
  QINFER_CHECK(t.rank() == rank, "cuda {}: {} must have rank {}, got shape {}", op, arg, rank, shape_str(t.shape));
  for (int64_t d : t.shape)
    QINFER_CHECK(d >= 0, "cuda {}: {} has a negative dimension {}", op, arg, shape_str(t.shape));
  QINFER_CHECK(t.data != nullptr || t.numel() == 0, "cuda {}: {} has no storage", op, arg);
}

void check_f32(std::string_view op, std::string_view arg, const Tensor& t, int rank) {
  check_tensor(op, arg, t, rank);
  QINFER_CHECK(t.dtype == DType::f32, "cuda {}: {} must be f32, got {}", op, arg, name(t.dtype));
}

void check_i32(std::string_view op, std::string_view arg, const Tensor& t, int rank) {
  check_tensor(op, arg, t, rank);
  QINFER_CHECK(t.dtype == DType::i32, "cuda {}: {} must be i32, got {}", op, arg, name(t.dtype));
}

void check_shape(std::string_view op, std::string_view arg, const Tensor& t, const std::vector<int64_t>& shape) {
  QINFER_CHECK(t.shape == shape, "cuda {}: {} must have shape {}, got {}", op, arg, shape_str(shape),
               shape_str(t.shape));
}

void check_distinct(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                    const Tensor& b) {
  QINFER_CHECK(a.data != b.data || a.numel() == 0, "cuda {}: {} must not alias {}", op, a_name, b_name);
}

// Checks x [T, heads, head_dim], positions and params of a rotary op, and returns its per-frequency
// constants (rope_frequencies: what ref and cpu use); the angles are computed on the device.
RopeTable rope_table(std::string_view op, const Tensor& x, const Tensor& positions, const RopeParams& params) {
  check_f32(op, "x", x, 3);
  const int64_t T = x.dim(0), head_dim = x.dim(2), d = params.rotary_dim, half = d / 2;
  check_i32(op, "positions", positions, 2);
  check_shape(op, "positions", positions, {3, T});
  QINFER_CHECK(d > 0 && d % 2 == 0 && d <= head_dim, "cuda {}: rotary_dim {} must be even and in (0, head_dim {}]", op,
               d, head_dim);
  QINFER_CHECK(half <= kRopeMaxHalf, "cuda {}: rotary_dim {} is above the {} this backend supports", op, d,
               2 * kRopeMaxHalf);
  const RopeFrequencies f = rope_frequencies(fmt::format("cuda {}", op), params);
  RopeTable table{};
  std::copy(f.inv_freq.begin(), f.inv_freq.end(), table.inv_freq);
  std::copy(f.axis.begin(), f.axis.end(), table.axis);
  table.attention_factor = f.attention_factor;
  return table;
}

// check_seq_layout, its errors naming the cuda op.
void check_layout(std::string_view op, const SeqLayout& layout, int64_t tokens, int64_t slots) {
  check_seq_layout(fmt::format("cuda {}", op), layout, tokens, slots);
}

// Validates a paged layout against a pool of `num_blocks` blocks: every position a sequence stores
// (kv_store: cached .. cached+len) or reads (attention: 0 .. cached+len) has a physical block.
void check_attention_layout(std::string_view op, const AttentionLayout& layout, int64_t tokens, int64_t num_blocks,
                            bool reads_cache) {
  check_layout(op, layout.seqs, tokens, -1);
  const int64_t S = layout.seqs.num_seqs();
  QINFER_CHECK(layout.block_size > 0 && layout.max_blocks >= 0, "cuda {}: block_size {} / max_blocks {} are invalid",
               op, layout.block_size, layout.max_blocks);
  QINFER_CHECK(static_cast<int64_t>(layout.block_table.size()) == S * layout.max_blocks,
               "cuda {}: block_table has {} entries, expected {} sequences x {} max_blocks", op,
               layout.block_table.size(), S, layout.max_blocks);
  QINFER_CHECK(static_cast<int64_t>(layout.cached.size()) == S, "cuda {}: cached has {} entries for {} sequences", op,
               layout.cached.size(), S);
  QINFER_CHECK(num_blocks * layout.block_size <= std::numeric_limits<int32_t>::max(),
               "cuda {}: a pool of {} blocks of {} tokens has more rows than the kernels index", op, num_blocks,
               layout.block_size);
  const auto& cu = layout.seqs.cu_seqlens;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t cached = layout.cached[s], len = cu[s + 1] - cu[s];
    QINFER_CHECK(cached >= 0, "cuda {}: cached[{}] = {} is negative", op, s, cached);
    if (len == 0) continue;
    const int64_t first = reads_cache ? 0 : cached, end = cached + len;
    QINFER_CHECK(end <= static_cast<int64_t>(layout.max_blocks) * layout.block_size,
                 "cuda {}: sequence {} reaches position {}, beyond its block table of {} blocks of {} tokens", op, s,
                 end - 1, layout.max_blocks, layout.block_size);
    for (int64_t b = first / layout.block_size; b <= (end - 1) / layout.block_size; ++b) {
      const int32_t physical = layout.block_table[s * layout.max_blocks + b];
      QINFER_CHECK(physical >= 0 && physical < num_blocks,
                   "cuda {}: block_table[{}, {}] = {} is outside the pool's {} blocks", op, s, b, physical, num_blocks);
    }
  }
}

// --- device memory -------------------------------------------------------------------------------

// The Ops' stream, shared with every tensor it allocates so that frees stay ordered after the work
// that uses the memory, even for tensors that outlive the Ops.
struct Stream {
  int device = 0;
  cudaStream_t stream = nullptr;
  ~Stream() {
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
};

// An int32 array on the device that is uploaded again only when its contents change (a batch's
// layout is the same for every layer of a forward).
class IndexUpload {
 public:
  IndexUpload() = default;
  IndexUpload(const IndexUpload&) = delete;
  IndexUpload& operator=(const IndexUpload&) = delete;
  ~IndexUpload() {
    if (device_) cudaFreeAsync(device_, stream_);
  }

  const int32_t* get(const std::vector<int32_t>& values, cudaStream_t stream) {
    if (device_ != nullptr && values == host_) return device_;
    stream_ = stream;
    if (values.size() > capacity_) {
      if (device_) QINFER_CUDA_CHECK(cudaFreeAsync(device_, stream));
      device_ = nullptr;
      capacity_ = std::max<size_t>(values.size(), 2 * capacity_);
      QINFER_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&device_), capacity_ * sizeof(int32_t), stream));
    }
    if (device_ == nullptr) {  // nothing to hold yet: a distinct, valid pointer all the same
      capacity_ = 16;
      QINFER_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&device_), capacity_ * sizeof(int32_t), stream));
    }
    // Stream-ordered after the kernels that read the previous contents; a pageable source is
    // staged before the call returns, so `values` may change afterwards.
    if (!values.empty())
      QINFER_CUDA_CHECK(cudaMemcpyAsync(device_, values.data(), values.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                        stream));
    host_ = values;
    return device_;
  }

  // Within a recorded step (CudaOps::stage): the values staged last in step `step`, and where.
  uint64_t step = 0;
  std::vector<int32_t> step_values;
  const int32_t* step_device = nullptr;

 private:
  std::vector<int32_t> host_;
  int32_t* device_ = nullptr;
  size_t capacity_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Work memory for one op: freed (stream-ordered) when it goes out of scope.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) {
      const cudaError_t status = cudaMallocAsync(&data_, bytes, stream);
      QINFER_CHECK(status == cudaSuccess, "cuda: cannot allocate {} bytes of work memory: {}", bytes,
                   cudaGetErrorString(status));
    }
  }
  ~Scratch() {
    if (data_) cudaFreeAsync(data_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

constexpr size_t kGemmScratchElements = size_t{64} << 20;  // dequantized bf16 weight rows per GEMM pass (128 MiB)

constexpr int64_t round_up(int64_t n, int64_t align) { return (n + align - 1) / align * align; }

class CudaOps final : public Ops {
 public:
  CudaOps(int device, Precision precision) : precision_(precision) {
    // A bf16 model's cache as PyTorch and vLLM keep it; exact mode keeps every intermediate in f32.
    kv_dtype_ = precision == Precision::fast ? DType::bf16 : DType::f32;
    const int count = device_count();
    QINFER_CHECK(count > 0, "cuda: no CUDA device is visible (no driver or no GPU); use the cpu backend");
    QINFER_CHECK(device >= 0 && device < count, "cuda: device {} does not exist ({} visible)", device, count);
    QINFER_CUDA_CHECK(cudaSetDevice(device));
    int pools = 0;
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    QINFER_CHECK(pools != 0, "cuda: device {} has no stream-ordered memory pools (needs CUDA 11.2+ and a recent driver)",
                 device);
    // Freed memory stays in the pool: a forward allocates and frees its activations every step.
    cudaMemPool_t pool = nullptr;
    QINFER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    QINFER_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
    max_shared_ = attention_max_shared_bytes(device);

    stream_ = std::make_shared<Stream>();
    stream_->device = device;
    // A blocking stream: work on the legacy default stream (to_host's copies) orders after it.
    QINFER_CUDA_CHECK(cudaStreamCreate(&stream_->stream));
    QINFER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&status_), sizeof(DeviceStatus)));
    QINFER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&status_host_), sizeof(DeviceStatus), cudaHostAllocDefault));
    QINFER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&readback_host_), kReadbackBytes, cudaHostAllocDefault));
    QINFER_CUDA_CHECK(cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), stream()));
    check_cublas(cublasCreate(&cublas_), "cublasCreate");
    check_cublas(cublasSetStream(cublas_, stream()), "cublasSetStream");
    bf16_gemm_ = std::make_unique<Bf16Gemm>();
    // QINFER_CUDA_GRAPHS=0 runs every step as is (to compare, or to profile kernel by kernel).
    const char* graphs = std::getenv("QINFER_CUDA_GRAPHS");
    graphs_enabled_ = graphs == nullptr || std::string_view(graphs) != "0";
  }

  ~CudaOps() override {
    cudaSetDevice(stream_->device);
    cudaStreamSynchronize(stream());
    recordings_.clear();
    if (staging_host_) cudaFreeHost(staging_host_);
    if (staging_device_) cudaFree(staging_device_);
    if (arrivals_) cudaFree(arrivals_);
    if (replay_done_) cudaEventDestroy(replay_done_);
    for (cudaEvent_t e : timing_events_)
      if (e) cudaEventDestroy(e);
    for (int i = 0; i < 2; ++i) {
      if (upload_buffers_[i]) cudaFreeHost(upload_buffers_[i]);
      if (upload_done_[i]) cudaEventDestroy(upload_done_[i]);
    }
    if (cublas_) cublasDestroy(cublas_);
    if (status_) cudaFree(status_);
    if (status_host_) cudaFreeHost(status_host_);
    if (readback_host_) cudaFreeHost(readback_host_);
  }

  std::string_view name() const override { return "cuda"; }
  std::optional<uint64_t> free_memory() const override {
    select_device();
    size_t free = 0, total = 0;
    QINFER_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }
  Device device() const override { return Device::cuda; }
  cudaStream_t stream() const { return stream_->stream; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override { return allocate(dtype, std::move(shape), true); }
  Tensor alloc_output(DType dtype, std::vector<int64_t> shape) override {
    return allocate(dtype, std::move(shape), false);
  }

  Tensor allocate(DType dtype, std::vector<int64_t> shape, bool zero) {
    for (int64_t d : shape) QINFER_CHECK(d >= 0, "cuda alloc: negative dimension in shape {}", shape_str(shape));
    enter();
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.device = Device::cuda;
    const uint64_t bytes = t.nbytes();
    if (bytes == 0) return t;
    if (replaying()) {
      // A stand-in address, never dereferenced: a replayed step launches nothing, but the ops'
      // checks (e.g. that an output does not alias an input) still see distinct tensors.
      placeholder_ += (bytes + 255) / 256 * 256;
      t.data = reinterpret_cast<void*>(placeholder_);
      return t;
    }
    void* p = nullptr;
    const cudaError_t status = cudaMallocAsync(&p, bytes, stream());
    if (status != cudaSuccess) {
      cudaGetLastError();
      fail("cuda alloc: cannot allocate {} bytes on GPU {} for a {} {} tensor: {}", bytes, stream_->device,
           qinfer::name(dtype), shape_str(t.shape), cudaGetErrorString(status));
    }
    std::shared_ptr<Stream> holder = stream_;
    t.owner = std::shared_ptr<void>(p, [holder](void* q) { cudaFreeAsync(q, holder->stream); });
    t.data = p;
    if (zero) QINFER_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream()));
    return t;
  }

  // Weights at load: chunks of the mapped files are copied (by the thread pool) into one of two
  // pinned buffers while the other one's transfer runs; pageable memory would be staged by the
  // driver one small piece at a time.
  Tensor upload(DType dtype, std::vector<int64_t> shape, std::span<const std::span<const std::byte>> pieces) override {
    QINFER_CHECK(mode_ == Mode::eager, "cuda upload: not inside a recorded step ({})", step_key_);
    Tensor t = allocate(dtype, std::move(shape), false);
    uint64_t total = 0;
    for (const auto& piece : pieces) total += piece.size();
    QINFER_CHECK(total == t.nbytes(), "cuda upload: {} bytes given for a {} tensor of {} bytes", total,
                 qinfer::name(dtype), t.nbytes());
    if (total == 0) return t;
    if (!upload_buffers_[0]) {
      for (int i = 0; i < 2; ++i) {
        QINFER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&upload_buffers_[i]), kUploadChunk, cudaHostAllocDefault));
        QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_[i], cudaEventDisableTiming));
        QINFER_CUDA_CHECK(cudaEventRecord(upload_done_[i], stream()));
      }
    }
    // Pieces are packed into the buffer back to back (a rank's column slice of a matrix is one piece
    // per row: hundreds of thousands of short ones for a MoE layer's experts) and each full buffer
    // goes over in one transfer.
    ThreadPool& pool = global_thread_pool();
    auto* dst = static_cast<char*>(t.data);
    char* staging = nullptr;
    uint64_t filled = 0;
    int buffer = 0;
    auto send = [&] {
      if (filled > 0) {
        QINFER_CUDA_CHECK(cudaMemcpyAsync(dst, staging, filled, cudaMemcpyHostToDevice, stream()));
        QINFER_CUDA_CHECK(cudaEventRecord(upload_done_[buffer], stream()));
        dst += filled;
      }
      staging = nullptr;
      filled = 0;
    };
    constexpr uint64_t kSlice = uint64_t{1} << 20;  // copies this long and longer go to the thread pool
    for (const auto& piece : pieces) {
      for (uint64_t offset = 0; offset < piece.size();) {
        if (!staging) {
          buffer = next_upload_buffer_;
          next_upload_buffer_ ^= 1;
          QINFER_CUDA_CHECK(cudaEventSynchronize(upload_done_[buffer]));  // its previous transfer is done
          staging = upload_buffers_[buffer];
        }
        const uint64_t n = std::min<uint64_t>(kUploadChunk - filled, piece.size() - offset);
        char* to = staging + filled;
        const std::byte* from = piece.data() + offset;
        if (n < kSlice) {
          std::memcpy(to, from, n);
        } else {
          pool.parallel_for((n + kSlice - 1) / kSlice, [&](size_t begin, size_t end) {
            const uint64_t lo = begin * kSlice, hi = std::min<uint64_t>(n, end * kSlice);
            std::memcpy(to + lo, from + lo, hi - lo);
          });
        }
        filled += n;
        offset += n;
        if (filled == kUploadChunk) send();
      }
    }
    send();
    return t;
  }

  // Copies between host memory and this device (either side, either direction).
  void copy(const Tensor& src, Tensor& dst) override {
    QINFER_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(),
                 "cuda copy: {} {} cannot be copied into {} {}", qinfer::name(src.dtype), shape_str(src.shape),
                 qinfer::name(dst.dtype), shape_str(dst.shape));
    const uint64_t bytes = src.nbytes();
    if (bytes == 0) return;
    QINFER_CHECK(src.data != nullptr && dst.data != nullptr, "cuda copy: a tensor of {} bytes has no storage", bytes);
    enter();
    const bool from_device = src.device == Device::cuda, to_device = dst.device == Device::cuda;
    if (!from_device && !to_device) {
      std::memmove(dst.data, src.data, bytes);
      return;
    }
    if (mode_ != Mode::eager) {
      QINFER_CHECK(to_device, "cuda copy: a recorded step ({}) cannot copy device memory to the host", step_key_);
      if (!from_device) {
        stage(src.data, bytes, dst.data);
        return;
      }
      if (replaying()) return;
    }
    const cudaMemcpyKind kind = from_device ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                            : cudaMemcpyHostToDevice;
    if (!to_device) return read_back(dst.data, src.data, bytes);
    QINFER_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, bytes, kind, stream()));
  }

  Tensor alloc_pinned(DType dtype, std::vector<int64_t> shape) override {
    for (int64_t d : shape) QINFER_CHECK(d >= 0, "cuda alloc_pinned: negative dimension in shape {}", shape_str(shape));
    enter();
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.device = Device::cpu;
    const uint64_t bytes = t.nbytes();
    if (bytes == 0) return t;
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail("cuda alloc_pinned: {} bytes of pinned host memory: {}", bytes, cudaGetErrorString(status));
    }
    t.data = p;
    t.owner = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    return t;
  }

  // Pinned host memory (alloc_pinned) on either side. The copies go to the stream in batches
  // (cudaMemcpyBatchAsync: one call for a run of thousands of small rows, where a call each costs more
  // than the bytes): a batch is a run of copies in one direction with no destination twice, since
  // copies inside a batch may run in any order. Nothing waits: a host destination is complete in
  // stream order, before anything queued after it (the host tier's bytes are read only by later copies
  // on this stream, never by the host).
  void copy_many(std::span<const std::pair<Tensor, Tensor>> copies) override {
    if (mode_ != Mode::eager) return Ops::copy_many(copies);
    enter();
    auto kind_of = [](const std::pair<Tensor, Tensor>& c) {
      const bool from_device = c.first.device == Device::cuda, to_device = c.second.device == Device::cuda;
      return from_device ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                         : (to_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    };
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    std::unordered_set<const void*> written;
    for (size_t i = 0; i < copies.size();) {
      const cudaMemcpyKind kind = kind_of(copies[i]);
      dsts.clear();
      srcs.clear();
      sizes.clear();
      written.clear();
      for (; i < copies.size() && kind_of(copies[i]) == kind && written.insert(copies[i].second.data).second; ++i) {
        const auto& [src, dst] = copies[i];
        QINFER_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel() && src.data && dst.data,
                     "cuda copy_many: {} {} cannot be copied into {} {}", qinfer::name(src.dtype),
                     shape_str(src.shape), qinfer::name(dst.dtype), shape_str(dst.shape));
        if (src.nbytes() == 0) continue;
        dsts.push_back(dst.data);
        srcs.push_back(src.data);
        sizes.push_back(src.nbytes());
      }
      if (dsts.empty()) continue;
      cudaMemcpyAttributes attributes{};
      attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      if (cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attributes, &first, 1, stream()) ==
          cudaSuccess)
        continue;
      // A driver without batched copies: one call each, in order.
      (void)cudaGetLastError();
      for (size_t k = 0; k < dsts.size(); ++k)
        QINFER_CUDA_CHECK(cudaMemcpyAsync(dsts[k], srcs[k], sizes[k], kind, stream()));
    }
  }

  void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) override {
    if (src.device == Device::cpu && dst.device == Device::cpu) return qinfer::copy_columns(src, src_col, dst, dst_col, width);
    QINFER_CHECK(src.rank() == 2 && dst.rank() == 2 && src.dim(0) == dst.dim(0) && src.dtype == dst.dtype &&
                     src.device == Device::cuda && dst.device == Device::cuda && src_col >= 0 && dst_col >= 0 &&
                     width >= 0 && src_col + width <= src.dim(1) && dst_col + width <= dst.dim(1) &&
                     bits(src.dtype) % 8 == 0,
                 "cuda copy_columns: bad arguments (src [{}, {}] col {}, dst [{}, {}] col {}, width {})",
                 src.rank() == 2 ? src.dim(0) : -1, src.rank() == 2 ? src.dim(1) : -1, src_col,
                 dst.rank() == 2 ? dst.dim(0) : -1, dst.rank() == 2 ? dst.dim(1) : -1, dst_col, width);
    enter();
    if (replaying()) return;
    const int64_t elem = bits(src.dtype) / 8;
    launch_copy_2d(static_cast<const char*>(src.data) + src_col * elem, src.dim(1) * elem,
                   static_cast<char*>(dst.data) + dst_col * elem, dst.dim(1) * elem, width * elem, src.dim(0),
                   stream());
  }

  void embedding(const Tensor& ids, const Weight& table, Tensor& out) override {
    check_i32("embedding", "ids", ids, 1);
    const WeightView w = view("embedding", "table", table, 2);
    const int64_t T = ids.dim(0);
    check_f32("embedding", "out", out, 2);
    check_shape("embedding", "out", out, {T, w.in});
    enter();
    if (replaying()) return;
    launch_embedding(ids.ptr<int32_t>(), T, w, out.ptr<float>(), status_, stream());
  }

  void linear_many(const Tensor& x, const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys) override {
    QINFER_CHECK(ws.size() == ys.size() && !ws.empty() && ws.size() <= static_cast<size_t>(kMaxGemvMatrices),
                 "cuda linear_many: {} matrices and {} outputs (expected 1 to {} of each, as many outputs as matrices)",
                 ws.size(), ys.size(), kMaxGemvMatrices);
    check_f32("linear_many", "x", x, 2);
    const int64_t T = x.dim(0), in = x.dim(1);
    std::vector<WeightView> views;
    for (size_t i = 0; i < ws.size(); ++i) {
      views.push_back(view("linear_many", "w", *ws[i], 2));
      QINFER_CHECK(views[i].in == in, "cuda linear_many: w[{}] {} does not take inputs of width {}", i,
                   shape_str(ws[i]->shape()), in);
      check_f32("linear_many", "y", *ys[i], 2);
      check_shape("linear_many", "y", *ys[i], {T, views[i].rows});
      check_distinct("linear_many", "y", *ys[i], "x", x);
    }
    if (T > kGemvMaxTokens || in == 0) {
      // GEMMs on 16-bit operands share x's conversion (a launch per matrix less: q/k/v, gate/up).
      bool shared = T > 0 && in > 0 && ws.size() > 1;
      for (const WeightView& w : views) shared = shared && (w.quantized || w.dtype != DType::f32) && w.rows > 0;
      if (!shared) {
        for (size_t i = 0; i < ws.size(); ++i) linear(x, *ws[i], *ys[i]);
        return;
      }
      for (const WeightView& w : views) check_gemm_shape(T, w.rows, in);
      enter();
      if (replaying()) return;
      const GemmInput input(*this, x.ptr<float>(), T * in);
      for (size_t i = 0; i < views.size(); ++i) gemm_bf16(input, T, views[i], ys[i]->ptr<float>());
      return;
    }
    GemvBatch batch;
    batch.count = static_cast<int>(ws.size());
    batch.fast = precision_ == Precision::fast;
    for (size_t i = 0; i < ws.size(); ++i) {
      batch.w[i] = views[i];
      batch.y[i] = ys[i]->ptr<float>();
    }
    enter();
    if (replaying() || T == 0) return;
    launch_gemv_batch(x.ptr<float>(), T, batch, stream());
  }

  // One decode token: the add and norm folded into the GEMV's blocks (gemv_affine_folds); else the
  // two ops.
  void add_rms_norm_linear_many(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y,
                                const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys) override {
    check_add_rms_norm(x, delta, w, y);
    QINFER_CHECK(!ws.empty() && ws.size() <= kMaxGemvMatrices && ws.size() == ys.size(),
                 "cuda add_rms_norm_linear_many: {} matrices and {} outputs (expected 1 to 4 of each)", ws.size(),
                 ys.size());
    if (x.dim(0) == 1) {
      GemvBatch batch;
      batch.count = static_cast<int>(ws.size());
      batch.fast = precision_ == Precision::fast;
      bool fits = true;
      for (size_t i = 0; i < ws.size(); ++i) {
        const WeightView v = view("add_rms_norm_linear_many", "w", *ws[i], 2);
        check_f32("add_rms_norm_linear_many", "y", *ys[i], 2);
        fits = fits && v.in == x.dim(1) && ys[i]->dim(0) == 1 && ys[i]->dim(1) == v.rows && v.rows > 0 &&
               ys[i]->data != x.data && ys[i]->data != y.data && ys[i]->data != delta.data;
        batch.w[i] = v;
        batch.y[i] = ys[i]->ptr<float>();
      }
      enter();
      if (replaying()) return;
      batch.fold = fold(x, delta, w, eps, y);
      if (fits && try_launch_gemv_affine(y.ptr<float>(), batch, stream())) return;  // it asks gemv_affine_folds
    }
    Ops::add_rms_norm_linear_many(x, delta, w, eps, y, ws, ys);
  }

  void add_rms_norm_linear_swiglu(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y,
                                  const Weight& gate, const Weight& up, Tensor& out) override {
    check_add_rms_norm(x, delta, w, y);
    if (x.dim(0) == 1) {
      const WeightView g = view("add_rms_norm_linear_swiglu", "gate", gate, 2);
      const WeightView u = view("add_rms_norm_linear_swiglu", "up", up, 2);
      check_f32("add_rms_norm_linear_swiglu", "out", out, 2);
      const bool fits = g.in == x.dim(1) && g.rows > 0 && out.dim(0) == 1 && out.dim(1) == g.rows &&
                        out.data != x.data && out.data != y.data && out.data != delta.data &&
                        gemv_affine_swiglu_fits(y.ptr<float>(), g, u);
      enter();
      if (replaying()) return;
      const NormFold f = fold(x, delta, w, eps, y);
      if (fits && gemv_affine_folds(f, g)) {
        launch_gemv_affine_swiglu(y.ptr<float>(), g, u, out.ptr<float>(), precision_ == Precision::fast, f, stream());
        return;
      }
    }
    Ops::add_rms_norm_linear_swiglu(x, delta, w, eps, y, gate, up, out);
  }

  void linear_swiglu(const Tensor& x, const Weight& gate, const Weight& up, Tensor& out) override {
    check_f32("linear_swiglu", "x", x, 2);
    if (x.dim(0) == 1) {
      const WeightView g = view("linear_swiglu", "gate", gate, 2), u = view("linear_swiglu", "up", up, 2);
      const bool dense = gemv_swiglu_fits(x.ptr<float>(), g, u);
      if (dense || gemv_affine_swiglu_fits(x.ptr<float>(), g, u)) {
        QINFER_CHECK(g.in == x.dim(1), "cuda linear_swiglu: gate {} does not take inputs of width {}",
                     shape_str(gate.shape()), x.dim(1));
        check_f32("linear_swiglu", "out", out, 2);
        check_shape("linear_swiglu", "out", out, {1, g.rows});
        check_distinct("linear_swiglu", "out", out, "x", x);
        enter();
        if (replaying()) return;
        if (dense) launch_gemv_swiglu(x.ptr<float>(), g, u, out.ptr<float>(), stream());
        else launch_gemv_affine_swiglu(x.ptr<float>(), g, u, out.ptr<float>(), precision_ == Precision::fast, {}, stream());
        return;
      }
    }
    Ops::linear_swiglu(x, gate, up, out);
  }

  void linear(const Tensor& x, const Weight& weight, Tensor& y) override {
    check_f32("linear", "x", x, 2);
    const int64_t T = x.dim(0), in = x.dim(1);
    const WeightView w = view("linear", "w", weight, 2);
    QINFER_CHECK(w.in == in, "cuda linear: w {} does not take inputs of width {}", shape_str(weight.shape()), in);
    const int64_t out = w.rows;
    check_f32("linear", "y", y, 2);
    check_shape("linear", "y", y, {T, out});
    check_distinct("linear", "y", y, "x", x);
    enter();
    if (replaying()) return;
    if (T == 0 || out == 0) return;
    if (in == 0) {
      QINFER_CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), stream()));
      return;
    }
    if (T <= kGemvMaxTokens) return launch_gemv(x.ptr<float>(), T, w, y.ptr<float>(), precision_ == Precision::fast, stream());
    gemm(x.ptr<float>(), T, w, y.ptr<float>());
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    check_rows("rms_norm", x, y);
    check_f32("rms_norm", "w", w, 1);
    check_shape("rms_norm", "w", w, {x.dim(1)});
    enter();
    if (replaying()) return;
    launch_rms_norm(x.ptr<float>(), w.ptr<float>(), nullptr, eps, x.dim(0), x.dim(1), y.ptr<float>(), stream());
  }

  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) override {
    check_add_rms_norm(x, delta, w, y);
    enter();
    if (replaying()) return;
    launch_add_rms_norm(x.ptr<float>(), delta.ptr<float>(), w.ptr<float>(), eps, x.dim(0), x.dim(1), y.ptr<float>(),
                        stream());
  }

  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& y) override {
    check_rows("rms_norm_gated", x, y);
    check_f32("rms_norm_gated", "z", z, 2);
    check_shape("rms_norm_gated", "z", z, x.shape);
    check_f32("rms_norm_gated", "w", w, 1);
    check_shape("rms_norm_gated", "w", w, {x.dim(1)});
    enter();
    if (replaying()) return;
    launch_rms_norm(x.ptr<float>(), w.ptr<float>(), z.ptr<float>(), eps, x.dim(0), x.dim(1), y.ptr<float>(),
                    stream());
  }

  void l2_norm(const Tensor& x, float eps, float scale, Tensor& y) override {
    check_rows("l2_norm", x, y);
    enter();
    if (replaying()) return;
    launch_l2_norm(x.ptr<float>(), eps, scale, x.dim(0), x.dim(1), y.ptr<float>(), stream());
  }

  void rope(Tensor& x, const Tensor& positions, const RopeParams& params) override {
    const RopeTable table = rope_table("rope", x, positions, params);
    enter();
    if (replaying()) return;
    launch_rope(x.ptr<float>(), positions.ptr<int32_t>(), x.dim(0), x.dim(1), x.dim(2), params.rotary_dim / 2, table,
                stream());
  }

  void rms_norm_rope(Tensor& x, const Tensor& w, float eps, const Tensor& positions,
                     const RopeParams& params) override {
    const RopeTable table = rope_table("rms_norm_rope", x, positions, params);
    check_f32("rms_norm_rope", "w", w, 1);
    check_shape("rms_norm_rope", "w", w, {x.dim(2)});
    enter();
    if (replaying()) return;
    launch_rms_norm_rope(x.ptr<float>(), w.ptr<float>(), eps, positions.ptr<int32_t>(), x.dim(0), x.dim(1), x.dim(2),
                         params.rotary_dim / 2, table, stream());
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    check_same("silu_mul", "gate", gate, "up", up);
    check_same("silu_mul", "gate", gate, "out", out);
    enter();
    if (replaying()) return;
    launch_silu_mul(gate.ptr<float>(), up.ptr<float>(), out.ptr<float>(), gate.numel(), stream());
  }

  void sigmoid_mul(Tensor& x, const Tensor& gate) override {
    check_f32("sigmoid_mul", "x", x, x.rank());
    check_f32("sigmoid_mul", "gate", gate, gate.rank());
    const bool per_row = x.rank() == 2 && gate.rank() == 2 && gate.dim(1) == 1 && x.dim(1) != 1;
    check_shape("sigmoid_mul", "gate", gate, per_row ? std::vector<int64_t>{x.dim(0), 1} : x.shape);
    enter();
    if (replaying()) return;
    launch_sigmoid_mul(x.ptr<float>(), gate.ptr<float>(), x.numel(), per_row ? x.dim(1) : 1, stream());
  }

  void add(Tensor& x, const Tensor& y) override {
    check_same("add", "x", x, "y", y);
    enter();
    if (replaying()) return;
    launch_add(x.ptr<float>(), y.ptr<float>(), x.numel(), stream());
  }

  void rms_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_w, const Tensor& k_w, float eps,
                           const Tensor& positions, const RopeParams& params, const AttentionLayout& layout,
                           KvPool& pool) override {
    constexpr std::string_view op = "rms_norm_rope_store";
    const RopeTable table = rope_table(op, q, positions, params);
    rope_table(op, k, positions, params);
    check_f32(op, "v", v, 3);
    check_shape(op, "v", v, k.shape);
    const int64_t T = q.dim(0), heads = q.dim(1), kv_heads = k.dim(1), head_dim = q.dim(2);
    check_shape(op, "k", k, {T, kv_heads, head_dim});
    check_f32(op, "q_w", q_w, 1);
    check_shape(op, "q_w", q_w, {head_dim});
    check_f32(op, "k_w", k_w, 1);
    check_shape(op, "k_w", k_w, {head_dim});
    check_distinct(op, "k", k, "q", q);
    const KvPoolView pool_view = check_pool(op, pool, layout.block_size, kv_heads, head_dim);
    check_attention_layout(op, layout, T, pool.k.dim(0), false);
    enter();
    const AttentionArrays arrays = upload_attention(layout, 0);
    if (replaying()) return;
    if (try_launch_rms_norm_rope_store(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), q_w.ptr<float>(),
                                       k_w.ptr<float>(), eps, positions.ptr<int32_t>(), T, heads, kv_heads, head_dim,
                                       params.rotary_dim / 2, table, arrays.dst_rows, pool_view, stream()))
      return;
    launch_rms_norm_rope(q.ptr<float>(), q_w.ptr<float>(), eps, positions.ptr<int32_t>(), T, heads, head_dim,
                         params.rotary_dim / 2, table, stream());
    launch_rms_norm_rope(k.ptr<float>(), k_w.ptr<float>(), eps, positions.ptr<int32_t>(), T, kv_heads, head_dim,
                         params.rotary_dim / 2, table, stream());
    launch_kv_store(k.ptr<float>(), v.ptr<float>(), arrays.dst_rows, T, kv_heads * head_dim, pool_view, stream());
  }

  void kv_store(const Tensor& k, const Tensor& v, const AttentionLayout& layout, KvPool& pool) override {
    check_f32("kv_store", "k", k, 3);
    check_f32("kv_store", "v", v, 3);
    check_shape("kv_store", "v", v, k.shape);
    const int64_t T = k.dim(0), kv_heads = k.dim(1), head_dim = k.dim(2);
    const KvPoolView pool_view = check_pool("kv_store", pool, layout.block_size, kv_heads, head_dim);
    check_attention_layout("kv_store", layout, T, pool.k.dim(0), false);
    enter();
    const AttentionArrays arrays = upload_attention(layout, 0);
    if (replaying()) return;
    launch_kv_store(k.ptr<float>(), v.ptr<float>(), arrays.dst_rows, T, kv_heads * head_dim, pool_view, stream());
  }

  void attention(const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
                 Tensor& out) override {
    check_f32("attention", "q", q, 3);
    const int64_t T = q.dim(0), heads = q.dim(1), head_dim = q.dim(2);
    check_f32("attention", "out", out, 3);
    check_shape("attention", "out", out, q.shape);
    check_distinct("attention", "out", out, "q", q);
    QINFER_CHECK(pool.k.rank() == 4, "cuda attention: pool.k must be [num_blocks, block_size, kv_heads, head_dim], got {}",
                 shape_str(pool.k.shape));
    const int64_t kv_heads = pool.k.dim(2);
    const KvPoolView pool_view = check_pool("attention", pool, layout.block_size, kv_heads, head_dim);
    QINFER_CHECK(kv_heads > 0 && heads % kv_heads == 0,
                 "cuda attention: {} query heads are not a multiple of {} kv heads", heads, kv_heads);
    check_attention_layout("attention", layout, T, pool.k.dim(0), true);
    QINFER_CHECK(attention_shared_bytes(head_dim) <= max_shared_,
                 "cuda attention: head_dim {} needs {} bytes of shared memory, above this GPU's {}", head_dim,
                 attention_shared_bytes(head_dim), max_shared_);
    enter();
    if (T == 0 || heads == 0 || head_dim == 0) return;
    const int64_t group = heads / kv_heads;
    int64_t max_len = 0, max_keys = 0;
    const auto& cu = layout.seqs.cu_seqlens;
    for (int64_t s = 0; s < layout.seqs.num_seqs(); ++s) {
      if (cu[s + 1] == cu[s]) continue;
      max_len = std::max<int64_t>(max_len, cu[s + 1] - cu[s]);
      max_keys = std::max<int64_t>(max_keys, layout.cached[s] + cu[s + 1] - cu[s]);
    }
    // Prefill: the tensor-core kernel, in its own tiles (it reads q and the pool as float4s).
    const bool bf16 = precision_ == Precision::fast;
    const int64_t mma_rows = attention_mma_tile_rows(head_dim, bf16);
    const auto address = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); };
    const bool aligned = (address(q) | address(out) | address(pool.k) | address(pool.v)) % 16 == 0;
    if (mma_rows > 0 && max_len * group >= kAttentionMmaMinRows && aligned &&
        attention_mma_shared_bytes(head_dim, bf16) <= max_shared_) {
      const AttentionArrays arrays = upload_attention(layout, group, mma_rows);
      if (replaying()) return;
      // A short chunk after a long cached prefix fills few tiles: the bf16 kernel splits their keys.
      int splits = bf16 && mode_ != Mode::capturing
                       ? attention_mma_splits(arrays.num_tiles * kv_heads, max_keys, sm_count_)
                       : 1;
      while (splits > 1 && attention_partial_floats(splits, T, heads, head_dim) > (int64_t{64} << 20)) splits /= 2;
      Scratch partial = scratch(splits > 1 ? attention_partial_floats(splits, T, heads, head_dim) * sizeof(float) : 0);
      launch_attention_mma(q.ptr<float>(), pool_view, arrays, T, heads, kv_heads, head_dim, scale, bf16, splits,
                           partial.as<float>(), out.ptr<float>(), stream());
      return;
    }
    // Decode and verification: the flash-decoding kernel. A recorded step plans its key splits for
    // the block table's capacity (splits past a sequence's keys find none).
    const int64_t decode_rows =
        max_len <= kAttentionDecodeMaxTokens && aligned ? attention_decode_tile_rows(head_dim, max_len * group) : 0;
    if (decode_rows > 0) {
      const AttentionArrays arrays = upload_attention(layout, group, decode_rows);
      if (replaying()) return;
      if (mode_ == Mode::capturing) max_keys = int64_t{layout.max_blocks} * layout.block_size;
      int splits = attention_decode_splits(arrays.num_tiles * kv_heads, max_keys, sm_count_);
      while (splits > 1 && attention_partial_floats(splits, T, heads, head_dim) > (int64_t{64} << 20)) splits /= 2;
      Scratch partial = scratch(splits > 1 ? attention_partial_floats(splits, T, heads, head_dim) * sizeof(float) : 0);
      launch_attention_decode(q.ptr<float>(), pool_view, arrays, T, heads, kv_heads, head_dim, decode_rows, scale,
                              splits, partial.as<float>(), decode_arrivals(arrays.num_tiles * kv_heads),
                              out.ptr<float>(), stream());
      return;
    }
    const AttentionArrays arrays = upload_attention(layout, group, kAttentionTileRows);
    if (replaying()) return;

    // Few blocks and long keys (decode): divide each tile's keys among several blocks. A recorded
    // step plans for its block table's capacity (splits past a sequence's keys find none).
    if (mode_ == Mode::capturing) max_keys = int64_t{layout.max_blocks} * layout.block_size;
    const int64_t blocks = arrays.num_tiles * kv_heads;
    int64_t splits = 1;
    // One key tile (32) per split at the least: a decode block walks its keys serially, so a few
    // tiles per block keep the step short while the merge stays cheap.
    if (blocks < 2 * sm_count_ && max_keys > 64) {
      splits = std::min<int64_t>({(2 * sm_count_ + blocks - 1) / blocks, (max_keys + 63) / 64, 64});
      while (splits > 1 && attention_partial_floats(splits, T, heads, head_dim) > (int64_t{64} << 20)) splits /= 2;
    }
    Scratch partial = scratch(splits > 1 ? attention_partial_floats(splits, T, heads, head_dim) * sizeof(float) : 0);
    launch_attention(q.ptr<float>(), pool_view, arrays, T, heads, kv_heads, head_dim, scale, static_cast<int>(splits),
                     partial.as<float>(), out.ptr<float>(), stream());
  }

  void moe_route(const Tensor& logits, bool renormalize, Tensor& ids, Tensor& weights) override {
    check_f32("moe_route", "logits", logits, 2);
    const int64_t T = logits.dim(0), E = logits.dim(1);
    check_i32("moe_route", "ids", ids, 2);
    QINFER_CHECK(ids.dim(0) == T, "cuda moe_route: ids must be i32 [{}, k], got {}", T, shape_str(ids.shape));
    const int64_t k = ids.dim(1);
    check_f32("moe_route", "weights", weights, 2);
    check_shape("moe_route", "weights", weights, {T, k});
    QINFER_CHECK(k >= 1 && k <= E, "cuda moe_route: top-k {} must be in [1, {} experts]", k, E);
    QINFER_CHECK((E + 2 * k) * 4 <= static_cast<int64_t>(max_shared_),
                 "cuda moe_route: {} experts do not fit the router kernel's shared memory", E);
    enter();
    if (replaying()) return;
    launch_moe_route(logits.ptr<float>(), T, E, k, renormalize, ids.ptr<int32_t>(), weights.ptr<float>(), stream());
  }

  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Weight& gate, const Weight& up,
                   const Weight& down, Tensor& out) override {
    check_f32("moe_experts", "x", x, 2);
    const int64_t T = x.dim(0), H = x.dim(1);
    check_i32("moe_experts", "ids", ids, 2);
    QINFER_CHECK(ids.dim(0) == T, "cuda moe_experts: ids must be i32 [{}, k], got {}", T, shape_str(ids.shape));
    const int64_t k = ids.dim(1);
    check_f32("moe_experts", "weights", weights, 2);
    check_shape("moe_experts", "weights", weights, {T, k});
    const WeightView g = view("moe_experts", "gate", gate, 3);
    const std::vector<int64_t> gate_shape = gate.shape();
    const int64_t E = gate_shape[0], I = gate_shape[1];
    QINFER_CHECK(gate_shape[2] == H, "cuda moe_experts: gate {} does not take inputs of width {}",
                 shape_str(gate_shape), H);
    const WeightView u = view("moe_experts", "up", up, 3);
    QINFER_CHECK(up.shape() == gate_shape, "cuda moe_experts: up must be {}, got {}", shape_str(gate_shape),
                 shape_str(up.shape()));
    const WeightView d = view("moe_experts", "down", down, 3);
    QINFER_CHECK(down.shape() == std::vector<int64_t>({E, H, I}), "cuda moe_experts: down must be [{}, {}, {}], got {}",
                 E, H, I, shape_str(down.shape()));
    check_f32("moe_experts", "out", out, 2);
    check_shape("moe_experts", "out", out, {T, H});
    check_distinct("moe_experts", "out", out, "x", x);
    enter();
    if (replaying()) return;
    // Grouping reads the routing back to the host, a synchronisation a recorded step cannot hold:
    // recorded (decode) steps keep the per-token kernels.
    if (T >= kMoeGroupedMinTokens && mode_ == Mode::eager && k > 0 && H > 0 && I > 0 && E > 0 &&
        E <= kMoeGroupedMaxExperts)
      return moe_grouped(x.ptr<float>(), T, H, I, E, k, ids.ptr<int32_t>(), weights.ptr<float>(), g, u, d,
                         out.ptr<float>());
    // MLX affine experts go through the affine GEMV (x read as the dense one-token GEMVs read it,
    // every slot's rows in one launch) where their layout and the batch fit it; the rest, and what
    // it does not take, through the row-dot kernels: grouped by expert once many slots share
    // experts, else per slot.
    const size_t act_bytes = static_cast<size_t>(round_up(T * k * I, 4)) * sizeof(float);  // down rows 16-byte aligned after
    if (g.quantized && g.mode == quant::Mode::affine) {
      Scratch work = scratch(act_bytes + static_cast<size_t>(T * k * H) * sizeof(float));
      if (try_launch_moe_affine(x.ptr<float>(), T, k, E, ids.ptr<int32_t>(), weights.ptr<float>(), g, u, d,
                                work.as<float>(), reinterpret_cast<float*>(work.as<char>() + act_bytes),
                                out.ptr<float>(), precision_ == Precision::fast, status_, stream()))
        return;
    }
    if (moe_groups_by_expert(T, H, I, E, k)) {
      Scratch work = scratch(moe_grouped_rows_bytes(T, H, I, E, k));
      return launch_moe_experts_grouped(x.ptr<float>(), T, H, I, E, k, ids.ptr<int32_t>(), weights.ptr<float>(), g, u,
                                        d, work.as<char>(), out.ptr<float>(), status_, stream());
    }
    Scratch act = scratch(act_bytes);
    launch_moe_experts(x.ptr<float>(), T, H, I, E, k, ids.ptr<int32_t>(), weights.ptr<float>(), g, u, d,
                       act.as<float>(), out.ptr<float>(), status_, stream());
  }

  // moe_experts grouped by expert, per chunk of tokens: the slots sorted by expert on the device and
  // the counts read back (one synchronisation), then per expert with tokens the gate and up GEMMs on
  // its gathered rows, silu(gate)·up, the down GEMM into its block of rows, and at the end the
  // combine of each token's rows in slot order. Operands round as in gemm(): exact precision stacks
  // x's hi and lo rows into one GEMM per weight (plus hi·w_lo for dequantized weights), and the
  // activation's pair takes two down GEMMs; fast precision takes the hi operands alone.
  void moe_grouped(const float* x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, const int32_t* ids,
                   const float* weights, const WeightView& gate, const WeightView& up, const WeightView& down,
                   float* out) {
    const auto bf16 = [](const WeightView& w) { return !w.quantized && w.dtype == DType::bf16; };
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 256 == 0; };
    const bool pairs = precision_ == Precision::exact;
    const int64_t f = pairs ? 2 : 1;
    // cuBLASLt's algorithms take 256-byte aligned operands: bf16 experts serve in place when every
    // expert's slice starts so; other weights are dequantized, one expert at a time, into scratch.
    const bool in_place = bf16(gate) && bf16(up) && bf16(down) && aligned(gate.data) && aligned(up.data) &&
                          aligned(down.data) && (I * H) % 128 == 0;
    const bool gate_up_lo = pairs && !(bf16(gate) && bf16(up)), down_lo = pairs && !bf16(down);
    // Expert blocks start at multiples of row_align rows, so that bf16 and f32 rows start 256-byte
    // aligned; 16 at the least, so that GEMM shapes (cuBLASLt plans) come in steps of 16 rows.
    int64_t row_align = 128;
    while (row_align > 16 && (row_align / 2 * H) % 128 == 0) row_align /= 2;
    // Gathered x rows and down rows stay within kChunkBytes per chunk of tokens.
    constexpr int64_t kChunkBytes = int64_t{512} << 20;
    const int64_t max_tokens = std::max<int64_t>(1, kChunkBytes / (k * (f * H * 2 + H * 4)));
    const int64_t chunks = (T + max_tokens - 1) / max_tokens, chunk = (T + chunks - 1) / chunks;

    const int64_t gate_up_elems = round_up(2 * I * H, 128), down_elems = round_up(H * I, 128);
    Scratch gate_up_w = scratch(in_place ? 0 : static_cast<size_t>((gate_up_lo ? 2 : 1) * gate_up_elems * 2));
    Scratch down_w = scratch(in_place ? 0 : static_cast<size_t>((down_lo ? 2 : 1) * down_elems * 2));
    char* gate_up_hi = gate_up_w.as<char>();
    char* gate_up_lo_w = gate_up_lo ? gate_up_hi + gate_up_elems * 2 : nullptr;
    char* down_hi = down_w.as<char>();
    char* down_lo_w = down_lo ? down_hi + down_elems * 2 : nullptr;

    const int64_t work_ints = moe_sort_work_ints(chunk * k, E);
    Scratch sort = scratch(static_cast<size_t>(work_ints + chunk * k + 2 * E + 1) * sizeof(int32_t));
    int32_t* slot_row = sort.as<int32_t>() + work_ints;
    int32_t* meta = slot_row + chunk * k;
    std::vector<int32_t> counts(2 * E + 1);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t tokens = std::min(chunk, T - t0), slots = tokens * k;
      const int32_t* chunk_ids = ids + t0 * k;
      launch_moe_sort(chunk_ids, slots, t0 * k, E, row_align, sort.as<int32_t>(), slot_row, meta, status_, stream());
      read_back(counts.data(), meta, counts.size() * sizeof(int32_t));  // throws for an expert id out of range
      const int64_t rows = counts[2 * E];
      int64_t max_padded = 0;
      for (int64_t e = 0; e < E; ++e) max_padded = std::max(max_padded, round_up(counts[e], row_align));
      Scratch x_rows = scratch(static_cast<size_t>(f * rows * H * 2));
      Scratch down_rows = scratch(static_cast<size_t>(rows * H) * sizeof(float));
      launch_moe_gather(x + t0 * H, H, k, slots, chunk_ids, slot_row, meta, E, row_align, pairs, x_rows.as<char>(),
                        stream());
      // gate and up outputs (side by side, or one after the other), and the activation's bf16 pair.
      const int64_t y_elems = round_up(f * max_padded * I, 64), act_elems = round_up(max_padded * I, 128);
      Scratch y = scratch(static_cast<size_t>(2 * y_elems) * sizeof(float));
      Scratch act = scratch(static_cast<size_t>((pairs ? 2 : 1) * act_elems * 2));
      char* act_hi = act.as<char>();
      char* act_lo = pairs ? act_hi + act_elems * 2 : nullptr;
      for (int64_t e = 0; e < E; ++e) {
        if (counts[e] == 0) continue;
        const int64_t padded = round_up(counts[e], row_align), first = counts[E + e];
        const char* xe = x_rows.as<char>() + f * first * H * 2;
        float* de = down_rows.as<float>() + first * H;
        float* y_gate = y.as<float>();
        float* y_up = y_gate + y_elems;
        int64_t ld = I;
        if (in_place) {
          bf16_gemm_->run(xe, f * padded, static_cast<const char*>(gate.data) + e * I * H * 2, I, H, y_gate, I, false,
                          stream());
          bf16_gemm_->run(xe, f * padded, static_cast<const char*>(up.data) + e * I * H * 2, I, H, y_up, I, false,
                          stream());
        } else {
          launch_dequantize_rows_bf16_pair(gate, e * I, I, gate_up_hi, gate_up_lo_w, stream());
          launch_dequantize_rows_bf16_pair(up, e * I, I, gate_up_hi + I * H * 2,
                                           gate_up_lo_w ? gate_up_lo_w + I * H * 2 : nullptr, stream());
          y_up = y_gate + I;
          ld = 2 * I;
          bf16_gemm_->run(xe, f * padded, gate_up_hi, 2 * I, H, y_gate, ld, false, stream());
          if (gate_up_lo) bf16_gemm_->run(xe, padded, gate_up_lo_w, 2 * I, H, y_gate, ld, true, stream());
        }
        launch_moe_silu_mul(y_gate, y_up, ld, padded, I, pairs, act_hi, act_lo, stream());
        const void* down_e = down_hi;
        if (in_place) down_e = static_cast<const char*>(down.data) + e * H * I * 2;
        else launch_dequantize_rows_bf16_pair(down, e * H, H, down_hi, down_lo_w, stream());
        bf16_gemm_->run(act_hi, padded, down_e, H, I, de, H, false, stream());
        if (pairs) bf16_gemm_->run(act_lo, padded, down_e, H, I, de, H, true, stream());
        if (down_lo) bf16_gemm_->run(act_hi, padded, down_lo_w, H, I, de, H, true, stream());
      }
      launch_moe_combine(down_rows.as<float>(), slot_row, weights + t0 * k, tokens, k, H, out + t0 * H, stream());
    }
  }

  void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g,
                 Tensor& beta) override {
    check_f32("gdn_gates", "a", a, 2);
    const int64_t T = a.dim(0), Hv = a.dim(1);
    for (const auto& [arg, t] : {std::pair<const char*, const Tensor*>{"b", &b}, {"g", &g}, {"beta", &beta}}) {
      check_f32("gdn_gates", arg, *t, 2);
      check_shape("gdn_gates", arg, *t, a.shape);
    }
    check_f32("gdn_gates", "A_log", A_log, 1);
    check_shape("gdn_gates", "A_log", A_log, {Hv});
    check_f32("gdn_gates", "dt_bias", dt_bias, 1);
    check_shape("gdn_gates", "dt_bias", dt_bias, {Hv});
    enter();
    if (replaying()) return;
    launch_gdn_gates(a.ptr<float>(), b.ptr<float>(), A_log.ptr<float>(), dt_bias.ptr<float>(), T, Hv, g.ptr<float>(),
                     beta.ptr<float>(), stream());
  }

  void conv1d_causal(const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                     Tensor& out) override {
    check_f32("conv1d_causal", "x", x, 2);
    const int64_t T = x.dim(0), C = x.dim(1);
    check_f32("conv1d_causal", "w", w, 2);
    QINFER_CHECK(w.dim(0) == C && w.dim(1) >= 1, "cuda conv1d_causal: w must be [{}, K ≥ 1], got {}", C,
                 shape_str(w.shape));
    const int64_t K = w.dim(1);
    check_f32("conv1d_causal", "conv_state", conv_state, 3);
    check_shape("conv1d_causal", "conv_state", conv_state, {conv_state.dim(0), K - 1, C});
    check_f32("conv1d_causal", "out", out, 2);
    check_shape("conv1d_causal", "out", out, {T, C});
    check_distinct("conv1d_causal", "out", out, "x", x);
    check_layout("conv1d_causal", layout, T, conv_state.dim(0));
    enter();
    const SeqArrays arrays = upload_seqs(conv_layout_, layout);
    if (replaying()) return;
    launch_conv1d_causal(x.ptr<float>(), w.ptr<float>(), arrays, T, C, K, conv_state.ptr<float>(), out.ptr<float>(),
                         stream());
  }

  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const SeqLayout& layout, Tensor& state, Tensor& out, GdnAlgorithm algorithm) override {
    constexpr std::string_view op = "gated_delta_rule";
    check_f32(op, "q", q, 3);
    const int64_t T = q.dim(0), Hk = q.dim(1), Dk = q.dim(2);
    check_f32(op, "k", k, 3);
    check_shape(op, "k", k, q.shape);
    check_f32(op, "v", v, 3);
    QINFER_CHECK(v.dim(0) == T, "cuda {}: v must have {} tokens, got {}", op, T, shape_str(v.shape));
    const int64_t Hv = v.dim(1), Dv = v.dim(2);
    QINFER_CHECK(Hk > 0 && Hv % Hk == 0, "cuda {}: {} value heads are not a multiple of {} key heads", op, Hv, Hk);
    QINFER_CHECK(Dk <= kDeltaMaxDk, "cuda {}: key head dim {} is above the {} this backend supports", op, Dk,
                 kDeltaMaxDk);
    for (const auto& [arg, t] : {std::pair<const char*, const Tensor*>{"g", &g}, {"beta", &beta}}) {
      check_f32(op, arg, *t, 2);
      check_shape(op, arg, *t, {T, Hv});
    }
    check_f32(op, "state", state, 4);
    check_shape(op, "state", state, {state.dim(0), Hv, Dv, Dk});
    check_f32(op, "out", out, 3);
    check_shape(op, "out", out, {T, Hv, Dv});
    check_distinct(op, "out", out, "q", q);
    check_distinct(op, "out", out, "k", k);
    check_distinct(op, "out", out, "v", v);
    check_layout(op, layout, T, state.dim(0));
    enter();

    // Which sequences take the chunked form: forced, or chosen for long sequences (as ref does)
    // when the kernel holds these head dims.
    const bool chunk_fits = Dk <= kDeltaChunkedMaxDk && delta_chunked_shared_bytes(Dk) <= max_shared_;
    QINFER_CHECK(algorithm != GdnAlgorithm::chunked || chunk_fits,
                 "cuda {}: the chunked kernels take key head dims up to {} within this GPU's {} bytes of shared "
                 "memory, got Dk {}",
                 op, kDeltaChunkedMaxDk, max_shared_, Dk);
    // A sequence with a snapshot before its last token runs in two rounds: its first snapshot_at
    // tokens into the snapshot slot, then the rest from there into its target. A snapshot after all
    // its tokens is one more store of the state in the one round.
    delta_pieces_.clear();
    delta_rest_.clear();
    const auto& cu = layout.cu_seqlens;
    for (int64_t s = 0; s < layout.num_seqs(); ++s) {
      const int32_t begin = cu[s], end = cu[s + 1], from = layout.state_slot[static_cast<size_t>(s)];
      const int32_t to = layout.target_slot(s), snapshot = layout.snapshot_slot(s);
      // One with no tokens still owes its target a copy of its state (the recurrent kernel's).
      if (begin == end && to == from) continue;
      const int32_t at = begin + layout.snapshot_tokens(s);
      if (snapshot >= 0 && at < end) {
        delta_pieces_.push_back({begin, at, from, snapshot, -1});
        delta_rest_.push_back({at, end, snapshot, to, -1});
      } else {
        delta_pieces_.push_back({begin, end, from, to, snapshot});
      }
    }
    QINFER_CHECK(delta_rest_.empty() || mode_ == Mode::eager,
                 "cuda {}: a recorded step has a snapshot before a sequence's last token", op);
    const bool automatic_chunks = algorithm == GdnAlgorithm::automatic && chunk_fits;
    const auto round = [&](const std::vector<DeltaPiece>& pieces, IndexUpload& cache) {
      recurrent_seqs_.clear();
      chunked_seqs_.clear();
      int64_t max_chunked_len = 0;
      // Entries of the device layout: each piece, and the gaps between pieces (listed nowhere).
      delta_entries_.clear();
      for (const DeltaPiece& p : pieces) {
        const int32_t last = delta_entries_.empty() ? 0 : delta_entries_.back().end;
        if (p.begin > last) delta_entries_.push_back({last, p.begin, 0, 0, -1});
        const int64_t len = p.end - p.begin;
        const bool chunked = len > 0 && (algorithm == GdnAlgorithm::chunked || (automatic_chunks && len > kDeltaChunk));
        (chunked ? chunked_seqs_ : recurrent_seqs_).push_back(static_cast<int32_t>(delta_entries_.size()));
        if (chunked) max_chunked_len = std::max(max_chunked_len, len);
        delta_entries_.push_back(p);
      }
      const int64_t E = static_cast<int64_t>(delta_entries_.size());
      blob_.assign(1, 0);
      for (const DeltaPiece& e : delta_entries_) blob_.push_back(e.end);
      for (const DeltaPiece& e : delta_entries_) blob_.push_back(e.from);
      for (const DeltaPiece& e : delta_entries_) blob_.push_back(e.to);
      for (const DeltaPiece& e : delta_entries_) blob_.push_back(e.also);
      for (const auto* list : {&recurrent_seqs_, &chunked_seqs_}) blob_.insert(blob_.end(), list->begin(), list->end());
      const int32_t* base = upload(cache, blob_);
      if (replaying()) return;
      SeqArrays arrays;
      arrays.cu_seqlens = base;
      arrays.state_slot = base + E + 1;
      arrays.state_to = arrays.state_slot + E;
      arrays.snapshot_to = arrays.state_to + E;
      arrays.num_seqs = E;
      const int32_t* recurrent_list = arrays.snapshot_to + E;
      const int32_t* chunked_list = recurrent_list + recurrent_seqs_.size();
      launch_delta_rule_recurrent(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(), beta.ptr<float>(),
                                  arrays, recurrent_list, static_cast<int64_t>(recurrent_seqs_.size()), Hk, Hv, Dk, Dv,
                                  state.ptr<float>(), out.ptr<float>(), stream());
      Scratch work = scratch(chunked_seqs_.empty() ? 0 : delta_chunked_work_floats(T, Hv, Dk) * sizeof(float));
      launch_delta_rule_chunked(q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), g.ptr<float>(), beta.ptr<float>(),
                                arrays, chunked_list, static_cast<int64_t>(chunked_seqs_.size()), max_chunked_len, T,
                                Hk, Hv, Dk, Dv, work.as<float>(), state.ptr<float>(), out.ptr<float>(), stream());
    };
    round(delta_pieces_, delta_layout_);
    if (!delta_rest_.empty()) round(delta_rest_, delta_rest_layout_);
  }

  // Counters for `n` (tile, kv head) pairs of the decode attention, or null (more than it holds, or
  // none made yet inside a recording): the separate merge kernel then runs.
  int* decode_arrivals(int64_t n) {
    if (!arrivals_ && mode_ == Mode::eager) {
      QINFER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&arrivals_), kArrivals * sizeof(int)));
      QINFER_CUDA_CHECK(cudaMemsetAsync(arrivals_, 0, kArrivals * sizeof(int), stream()));
    }
    return n <= kArrivals ? arrivals_ : nullptr;
  }

  // --- recorded steps (CUDA graphs) ---------------------------------------------------------------
  // A key's first step runs as usual; its second is captured into a graph (kernels, memory nodes,
  // and copies of the staged inputs from pinned memory) and launched; later ones re-run only the
  // host side of the ops, which writes the step's inputs into the same pinned slots, and launch
  // the graph: one launch per step instead of one per kernel.
  void begin_step(const std::string& key) override {
    QINFER_CHECK(mode_ == Mode::eager, "cuda: step '{}' begins inside step '{}'", key, step_key_);
    if (!graphs_enabled_) return;
    select_device();  // a replayed step's device time starts at its launch, not here
    step_key_ = key;
    if (!recordings_.count(key) && recordings_.size() >= kMaxRecordings) {
      // Keys of caches that are gone never come back: drop the least recently used recording.
      auto oldest = std::min_element(recordings_.begin(), recordings_.end(), [](const auto& a, const auto& b) {
        return a.second->last_step < b.second->last_step;
      });
      if (oldest->second->exec) QINFER_CUDA_CHECK(cudaEventSynchronize(replay_done_));
      recordings_.erase(oldest);
    }
    std::unique_ptr<Recording>& rec = recordings_[key];
    if (!rec) rec = std::make_unique<Recording>();
    recording_ = rec.get();
    rec->last_step = ++step_serial_;
    if (rec->failed) return;
    if (rec->exec) {
      // The pinned inputs of the previous replay are read by its graph: wait until it has run.
      QINFER_CUDA_CHECK(cudaEventSynchronize(replay_done_));
      start_step(Mode::replaying);
      if (rec->staged.empty()) launch_recording();
      return;
    }
    if (rec->runs++ == 0) return;  // the first step of a key runs as is
    if (!staging_host_) {
      QINFER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&staging_host_), kStagingBytes, cudaHostAllocDefault));
      QINFER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&staging_device_), kStagingBytes));
      QINFER_CUDA_CHECK(cudaEventCreateWithFlags(&replay_done_, cudaEventDisableTiming));
    }
    QINFER_CUDA_CHECK(cudaEventSynchronize(replay_done_));
    // Relaxed: cuBLAS may allocate its workspace on a first call inside the capture.
    QINFER_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
    rec->staged.clear();
    start_step(Mode::capturing);
  }

  Tensor end_step(Tensor output) override {
    if (mode_ == Mode::eager) return output;
    Recording& rec = *recording_;
    if (mode_ == Mode::capturing) {
      // The graph copies the output into memory it does not own, then frees all it allocated.
      if (!rec.output.data || rec.output.shape != output.shape || rec.output.dtype != output.dtype) {
        void* p = nullptr;
        QINFER_CUDA_CHECK(cudaMalloc(&p, output.nbytes()));
        rec.output = output;
        rec.output.owner = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
        rec.output.data = p;
      }
      QINFER_CUDA_CHECK(cudaMemcpyAsync(rec.output.data, output.data, output.nbytes(), cudaMemcpyDeviceToDevice, stream()));
      output = Tensor();
      cudaGraph_t graph = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(stream(), &graph);
      mode_ = Mode::eager;
      if (ended != cudaSuccess || graph == nullptr) {
        cudaGetLastError();
        rec.failed = true;
        fail("cuda: recording step '{}' failed: {}", step_key_, cudaGetErrorString(ended));
      }
      const cudaError_t made = cudaGraphInstantiate(&rec.exec, graph, 0);
      cudaGraphDestroy(graph);
      if (made != cudaSuccess) {
        cudaGetLastError();
        rec.exec = nullptr;
        rec.failed = true;
        fail("cuda: instantiating the graph of step '{}' failed: {}", step_key_, cudaGetErrorString(made));
      }
      log_debug("cuda: recorded step '{}' ({} staged inputs, {} bytes)", step_key_, rec.staged.size(), stage_offset_);
    } else {
      mode_ = Mode::eager;
      QINFER_CHECK(stage_index_ == rec.staged.size(),
                   "cuda: step '{}' staged {} inputs, its recording {}: the step does not repeat", step_key_,
                   stage_index_, rec.staged.size());
      if (replay_launched_) return rec.output;
    }
    launch_recording();
    return rec.output;
  }

  // A replayed step's graph starts as soon as its last input is staged (stage()), not when the walk
  // through the model ends: the rest of the walk, which launches nothing, overlaps the GPU's work.
  // (The rest cannot stage or fail differently from the recording: same key, same shapes.)
  void launch_recording() {
    start_device_timing();
    QINFER_CUDA_CHECK(cudaGraphLaunch(recording_->exec, stream()));
    QINFER_CUDA_CHECK(cudaEventRecord(replay_done_, stream()));
    replay_launched_ = true;
  }

  void abort_step() override {
    if (mode_ == Mode::capturing) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(stream(), &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      recording_->failed = true;
    }
    mode_ = Mode::eager;
  }

  bool records_steps() const override { return graphs_enabled_; }

  // The stopwatch starts at the step's first launch: the first op entered outside a replay, or the
  // replay's graph launch (its ops launch nothing; the host's walk before it is not device time).
  void begin_device_timing() override {
    select_device();
    if (!timing_events_[0]) {
      for (cudaEvent_t& e : timing_events_) QINFER_CUDA_CHECK(cudaEventCreate(&e));
    }
    timing_ = Timing::armed;
  }
  std::optional<double> end_device_timing() override {
    if (timing_ != Timing::running) {
      timing_ = Timing::off;
      return 0.0;  // nothing ran on the device
    }
    timing_ = Timing::off;
    select_device();
    QINFER_CUDA_CHECK(cudaEventRecord(timing_events_[1], stream()));
    QINFER_CUDA_CHECK(cudaEventSynchronize(timing_events_[1]));
    float ms = 0.0f;
    QINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_events_[0], timing_events_[1]));
    return static_cast<double>(ms) / 1e3;
  }

  // In a replayed step, which launches nothing: its graph holds the work.
  bool replaying() const { return mode_ == Mode::replaying; }
  void finish() {
    enter();
    synchronize();
  }

  // Greedy rows without penalties are picked by the argmax alone; other rows are weighed and picked
  // on the device too (sample.cu), one id per row coming back, except a row whose candidates
  // overflow or whose threshold would be lowered: pick_weighted finishes it from the whole row.
  void sample(const Tensor& logits, const std::vector<SamplingParams>& params,
              const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
              std::vector<int32_t>& out) override {
    if (logits.device == Device::cpu) return sample_rows(logits, params, history, step, out);
    check_f32("sample", "logits", logits, 2);
    const int64_t rows = logits.dim(0), vocab = logits.dim(1);
    QINFER_CHECK(vocab > 0, "sample: logits have an empty vocabulary");
    QINFER_CHECK(static_cast<int64_t>(params.size()) == rows && static_cast<int64_t>(history.size()) == rows &&
                     static_cast<int64_t>(step.size()) == rows,
                 "sample: {} logit rows but {} params, {} histories and {} steps", rows, params.size(),
                 history.size(), step.size());
    enter();
    const bool greedy = std::all_of(params.begin(), params.end(),
                                    [](const SamplingParams& p) { return p.temperature <= 0.0f && !has_penalties(p); });
    if (greedy) {
      out.resize(rows);
      Scratch ids(static_cast<size_t>(rows) * sizeof(int32_t), stream());
      Scratch parts(argmax_scratch_bytes(rows, vocab), stream());
      launch_argmax_rows(logits.ptr<float>(), rows, vocab, ids.as<int32_t>(), parts.as<void>(), stream());
      read_back(out.data(), ids.as<int32_t>(), static_cast<size_t>(rows) * sizeof(int32_t));
      return;
    }
    sample_on_device(logits, params, history, step, out);
  }

  void mask_logits(Tensor& logits, const Tensor& rows, const Tensor& allowed) override {
    if (logits.device == Device::cpu) return mask_logits_rows(logits, rows, allowed);
    check_f32("mask_logits", "logits", logits, 2);
    check_i32("mask_logits", "rows", rows, 1);
    const int64_t S = logits.dim(0), V = logits.dim(1), R = rows.dim(0);
    QINFER_CHECK(allowed.dtype == DType::u32 && allowed.shape == std::vector<int64_t>({R, (V + 31) / 32}),
                 "cuda mask_logits: allowed must be u32 [{}, {}], got {} {}", R, (V + 31) / 32, qinfer::name(allowed.dtype),
                 shape_str(allowed.shape));
    // The rows are checked where they are read: a bad one would write outside the logits.
    std::vector<int32_t> host_rows(R);
    read_back(host_rows.data(), rows.ptr<int32_t>(), static_cast<size_t>(R) * sizeof(int32_t));
    std::vector<char> seen(S, 0);
    for (int32_t row : host_rows) {
      QINFER_CHECK(row >= 0 && row < S && !seen[row], "cuda mask_logits: row {} is out of [0, {}) or repeated", row, S);
      seen[row] = 1;
    }
    enter();
    launch_mask_logits(logits.ptr<float>(), V, rows.ptr<int32_t>(), R, allowed.ptr<uint32_t>(), stream());
  }

 private:
  static_assert(kSamplingBlockIds == kSamplingBlock, "sample.cu's blocks are sampling.h's");

  void sample_on_device(const Tensor& logits, const std::vector<SamplingParams>& params,
                        const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
                        std::vector<int32_t>& out) {
    const int64_t rows = logits.dim(0), vocab = logits.dim(1);
    QINFER_CHECK(rows <= 65535, "sample: at most 65535 rows at once on cuda (got {})", rows);
    const int64_t nb = (vocab + kSamplingBlock - 1) / kSamplingBlock;
    // Each row's parameters, and its distinct history ids in [0, vocab) with their counts.
    std::vector<DeviceSampleRow> host_rows(static_cast<size_t>(rows));
    std::vector<int32_t> penalty_ids, penalty_counts;
    bool any_candidates = false;
    for (int64_t s = 0; s < rows; ++s) {
      const SamplingParams& p = params[s];
      DeviceSampleRow& r = host_rows[s];
      r.uniform = sampling_uniform(p.seed, step[s]);
      r.temperature = p.temperature, r.repetition = p.repetition_penalty;
      r.presence = p.presence_penalty, r.frequency = p.frequency_penalty;
      r.threshold = sampling_threshold(p);
      r.top_p = p.top_p, r.min_p = p.min_p;
      r.top_k = p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;
      r.candidates = p.temperature > 0.0f && (r.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f);
      any_candidates = any_candidates || r.candidates;
      r.penalties_begin = r.penalties_end = static_cast<int32_t>(penalty_ids.size());
      if (!has_penalties(p)) continue;
      for (const auto& [id, count] : history_counts(history[s], vocab)) {
        penalty_ids.push_back(id);
        penalty_counts.push_back(count);
      }
      r.penalties_end = static_cast<int32_t>(penalty_ids.size());
    }
    Scratch rows_device(host_rows.size() * sizeof(DeviceSampleRow), stream());
    Scratch ids_device(std::max<size_t>(1, penalty_ids.size()) * sizeof(int32_t), stream());
    Scratch counts_device(std::max<size_t>(1, penalty_ids.size()) * sizeof(int32_t), stream());
    QINFER_CUDA_CHECK(cudaMemcpyAsync(rows_device.as<void>(), host_rows.data(), host_rows.size() * sizeof(DeviceSampleRow),
                                      cudaMemcpyHostToDevice, stream()));
    if (!penalty_ids.empty()) {
      QINFER_CUDA_CHECK(cudaMemcpyAsync(ids_device.as<void>(), penalty_ids.data(), penalty_ids.size() * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, stream()));
      QINFER_CUDA_CHECK(cudaMemcpyAsync(counts_device.as<void>(), penalty_counts.data(),
                                        penalty_counts.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
    }
    const auto n = static_cast<size_t>(rows);
    const size_t candidates = any_candidates ? n * kSampleCandidates : 0;
    Scratch work(n * static_cast<size_t>(vocab) * sizeof(float), stream());
    Scratch best(n * sizeof(int32_t), stream()), row_max(n * sizeof(float), stream());
    Scratch masses(n * static_cast<size_t>(nb) * sizeof(double), stream());
    Scratch passing(n * static_cast<size_t>(nb) * sizeof(int32_t), stream());
    Scratch candidate_ids(candidates * sizeof(int32_t), stream());
    Scratch candidate_weights(candidates * sizeof(float), stream());
    Scratch argmax_scratch(argmax_scratch_bytes(rows, vocab), stream());
    Scratch picks(n * sizeof(int32_t), stream());
    const SamplingBuffers buf{work.as<float>(),           best.as<int32_t>(),
                              row_max.as<float>(),        masses.as<double>(),
                              passing.as<int32_t>(),      candidate_ids.as<int32_t>(),
                              candidate_weights.as<float>(), argmax_scratch.as<void>()};
    const auto* rows_on_device = rows_device.as<DeviceSampleRow>();
    launch_sampling_weigh(logits.ptr<float>(), rows, vocab, rows_on_device, ids_device.as<int32_t>(),
                          counts_device.as<int32_t>(), buf, stream());
    launch_sampling_pick(rows, vocab, rows_on_device, buf, picks.as<int32_t>(), stream());
    out.resize(n);
    read_back(out.data(), picks.as<int32_t>(), n * sizeof(int32_t));
    for (int64_t s = 0; s < rows; ++s)
      if (out[s] < 0) out[s] = pick_on_host(params[s], step[s], ~out[s], vocab, buf.masses + s * nb, buf.work + s * vocab);
  }

  // A row the device left to the host (launch_sampling_pick): pick_weighted over the whole row of
  // weights, which it needs anyway (the candidates overflowed, or a lower threshold reads them all).
  int32_t pick_on_host(const SamplingParams& p, uint64_t step, int32_t best, int64_t vocab, const double* masses,
                       const float* weights) {
    std::vector<double> blocks(static_cast<size_t>((vocab + kSamplingBlock - 1) / kSamplingBlock));
    std::vector<float> row(static_cast<size_t>(vocab));
    read_back(blocks.data(), masses, blocks.size() * sizeof(double));
    read_back(row.data(), weights, row.size() * sizeof(float));
    VectorWeights source(row);
    return pick_weighted(p, step, best, vocab, blocks, source);
  }

  // Every op runs with this Ops' device current (the caller's thread may have another one).
  // cudaGetDevice reads the thread's current device; cudaSetDevice costs a driver call even when
  // nothing changes, and a replayed decode step enters for every op and allocation.
  void select_device() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != stream_->device)
      QINFER_CUDA_CHECK(cudaSetDevice(stream_->device));
  }
  void enter() {
    select_device();
    if (mode_ == Mode::eager) start_device_timing();  // a recorded step's starts at its launch
  }

  void start_device_timing() {
    if (timing_ != Timing::armed) return;
    QINFER_CUDA_CHECK(cudaEventRecord(timing_events_[0], stream()));
    timing_ = Timing::running;
  }

  enum class Mode { eager, capturing, replaying };

  // One recorded step: the graph, where it leaves its output, and the staged inputs in order.
  struct Recording {
    cudaGraphExec_t exec = nullptr;
    Tensor output;
    std::vector<std::pair<size_t, size_t>> staged;  // (offset, bytes) in the staging buffers
    int runs = 0;          // steps begun so far
    uint64_t last_step = 0;  // step_serial_ when last begun
    bool failed = false;   // recording failed once: the key runs as is from now on
    ~Recording() {
      if (exec) cudaGraphExecDestroy(exec);
    }
  };

  void start_step(Mode mode) {
    mode_ = mode;
    ++step_serial_;
    stage_index_ = 0;
    stage_offset_ = 0;
    replay_launched_ = false;
    placeholder_ = 0x100000;
  }

  // Puts `bytes` of host data where a step's kernels read it: into the pinned staging buffer, from
  // which the recording copies it to `device_dst` (default: the device staging buffer at the same
  // offset) when it runs. Returns the device address.
  void* stage(const void* data, size_t bytes, void* device_dst = nullptr) {
    const size_t offset = (stage_offset_ + 15) / 16 * 16;
    QINFER_CHECK(offset + bytes <= kStagingBytes, "cuda: step '{}' stages more than {} bytes of inputs", step_key_,
                 kStagingBytes);
    std::memcpy(staging_host_ + offset, data, bytes);
    stage_offset_ = offset + bytes;
    void* dst = device_dst ? device_dst : staging_device_ + offset;
    if (mode_ == Mode::capturing) {
      recording_->staged.emplace_back(offset, bytes);
      QINFER_CUDA_CHECK(cudaMemcpyAsync(dst, staging_host_ + offset, bytes, cudaMemcpyHostToDevice, stream()));
    } else {
      QINFER_CHECK(stage_index_ < recording_->staged.size() &&
                       recording_->staged[stage_index_] == std::make_pair(offset, bytes),
                   "cuda: step '{}' stages its inputs differently from its recording", step_key_);
    }
    ++stage_index_;
    if (mode_ == Mode::replaying && stage_index_ == recording_->staged.size()) launch_recording();
    return dst;
  }

  // An index array on the device: uploaded when it changes, or staged inside a recorded step
  // (once per step while it stays the same, as a step's layers share their layout).
  const int32_t* upload(IndexUpload& cache, const std::vector<int32_t>& values) {
    if (mode_ == Mode::eager) return cache.get(values, stream());
    if (cache.step == step_serial_ && cache.step_values == values) return cache.step_device;
    cache.step = step_serial_;
    cache.step_values = values;
    cache.step_device = static_cast<const int32_t*>(stage(values.data(), values.size() * sizeof(int32_t)));
    return cache.step_device;
  }

  // Work memory for one op; none in a replayed step, which launches nothing.
  Scratch scratch(size_t bytes) { return Scratch(replaying() ? 0 : bytes, stream()); }

  // Waits for the stream, then throws if a kernel reported a bad index.
  // Host memory is only ever written from pinned buffers: a copy into pageable memory waits for the
  // device inside the driver, where it blocks other threads' driver calls, and with a tensor-parallel
  // rank's collectives queued that device waits for those threads (ranks share this process).
  void synchronize() {
    QINFER_CUDA_CHECK(cudaMemcpyAsync(status_host_, status_, sizeof(DeviceStatus), cudaMemcpyDeviceToHost, stream()));
    QINFER_CUDA_CHECK(cudaStreamSynchronize(stream()));
    check_status();
  }

  // synchronize()'s check, once its copy of the status has arrived.
  void check_status() {
    const DeviceStatus status = *status_host_;
    if (status.code == kStatusOk) return;
    QINFER_CUDA_CHECK(cudaMemsetAsync(status_, 0, sizeof(DeviceStatus), stream()));
    if (status.code == kStatusEmbeddingId)
      fail("cuda embedding: ids[{}] = {} is outside the table's {} rows", status.index, status.value, status.limit);
    if (status.code == kStatusExpertId)
      fail("cuda moe_experts: ids (flat index {}) = {} is outside the {} experts", status.index, status.value,
           status.limit);
    fail("cuda: a kernel reported error code {}", status.code);
  }

  // `bytes` of device memory at src into host memory at dst, after the work queued before; then
  // synchronize()'s check, whose status copy shares the last chunk's wait (one sync for a small read).
  void read_back(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return synchronize();
    for (size_t done = 0; done < bytes; done += kReadbackBytes) {
      const size_t n = std::min(kReadbackBytes, bytes - done);
      QINFER_CUDA_CHECK(cudaMemcpyAsync(readback_host_, static_cast<const char*>(src) + done, n,
                                        cudaMemcpyDeviceToHost, stream()));
      if (done + n == bytes)
        QINFER_CUDA_CHECK(
            cudaMemcpyAsync(status_host_, status_, sizeof(DeviceStatus), cudaMemcpyDeviceToHost, stream()));
      QINFER_CUDA_CHECK(cudaStreamSynchronize(stream()));
      std::memcpy(static_cast<char*>(dst) + done, readback_host_, n);
    }
    check_status();
  }

  void check_add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& w, const Tensor& y) {
    check_rows("add_rms_norm", x, y);
    check_f32("add_rms_norm", "delta", delta, 2);
    check_shape("add_rms_norm", "delta", delta, x.shape);
    check_f32("add_rms_norm", "w", w, 1);
    check_shape("add_rms_norm", "w", w, {x.dim(1)});
    check_distinct("add_rms_norm", "y", y, "x", x);
    check_distinct("add_rms_norm", "y", y, "delta", delta);
  }

  // The fold of add_rms_norm(x, delta, w, eps, y) into a one-token GEMV (residual null where the
  // counter cannot be had: a first step inside a recording).
  NormFold fold(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) {
    int* arrivals = decode_arrivals(1);
    if (!arrivals) return {};
    return {x.ptr<float>(), delta.ptr<float>(), w.ptr<float>(), y.ptr<float>(), eps, arrivals};
  }

  void check_rows(std::string_view op, const Tensor& x, const Tensor& y) {
    check_f32(op, "x", x, 2);
    check_f32(op, "y", y, 2);
    check_shape(op, "y", y, x.shape);
  }

  void check_same(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                  const Tensor& b) {
    check_f32(op, a_name, a, a.rank());
    check_f32(op, b_name, b, b.rank());
    check_shape(op, b_name, b, a.shape);
  }

  // A pool of f32 or bf16 K and V on this device (KvPool), as the kernels see it.
  KvPoolView check_pool(std::string_view op, const KvPool& pool, int32_t block_size, int64_t kv_heads,
                        int64_t head_dim) {
    for (const auto& [arg, t] : {std::pair{"pool.k", &pool.k}, std::pair{"pool.v", &pool.v}}) {
      check_tensor(op, arg, *t, 4);
      QINFER_CHECK(t->dtype == DType::f32 || t->dtype == DType::bf16, "cuda {}: {} must be f32 or bf16, got {}", op,
                   arg, qinfer::name(t->dtype));
    }
    QINFER_CHECK(pool.k.dtype == pool.v.dtype, "cuda {}: pool.k is {} but pool.v {}", op, qinfer::name(pool.k.dtype),
                 qinfer::name(pool.v.dtype));
    check_shape(op, "pool.k", pool.k, {pool.k.dim(0), block_size, kv_heads, head_dim});
    check_shape(op, "pool.v", pool.v, pool.k.shape);
    return KvPoolView{pool.k.data, pool.v.data, pool.k.dtype == DType::bf16};
  }

  // The kernels' view of a weight, after checking it like ref does: dense f32|bf16|f16 of `rank`, or
  // a quantized layout MLX writes with codes, scales (and affine biases) of matching shapes.
  WeightView view(std::string_view op, std::string_view arg, const Weight& weight, int rank) const {
    WeightView w;
    if (!weight.quantized()) {
      const Tensor& t = weight.dense;
      check_tensor(op, arg, t, rank);
      QINFER_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16,
                   "cuda {}: {} must be f32, bf16 or f16, got {}", op, arg, qinfer::name(t.dtype));
      w.dtype = t.dtype;
      w.data = t.data;
      w.in = t.shape.back();
      w.rows = weight.rows();
      return w;
    }
    quant::validate(weight.layout);
    const quant::Layout& layout = weight.layout;
    const std::string codes_arg = std::string(arg) + ".codes";
    check_tensor(op, codes_arg, weight.codes, rank);
    QINFER_CHECK(weight.codes.dtype == DType::u32, "cuda {}: {} must be u32, got {}", op, codes_arg,
                 qinfer::name(weight.codes.dtype));
    const std::vector<int64_t> logical = weight.shape();
    const int64_t in = logical.back();
    QINFER_CHECK(in % layout.group_size == 0 && (in * layout.bits) % 32 == 0 &&
                     weight.codes.shape.back() * 32 == in * layout.bits,
                 "cuda {}: {} codes {} do not hold whole groups of {} {}-bit values", op, arg,
                 shape_str(weight.codes.shape), layout.group_size, layout.bits);
    std::vector<int64_t> grouped = logical;
    grouped.back() /= layout.group_size;
    const bool affine = layout.mode == quant::Mode::affine;
    const std::string scales_arg = std::string(arg) + ".scales";
    check_tensor(op, scales_arg, weight.scales, rank);
    check_shape(op, scales_arg, weight.scales, grouped);
    if (affine) {
      QINFER_CHECK(weight.scales.dtype == DType::f32 || weight.scales.dtype == DType::bf16 ||
                       weight.scales.dtype == DType::f16,
                   "cuda {}: {} must be f32, bf16 or f16, got {}", op, scales_arg, qinfer::name(weight.scales.dtype));
      const std::string biases_arg = std::string(arg) + ".biases";
      check_tensor(op, biases_arg, weight.biases, rank);
      check_shape(op, biases_arg, weight.biases, grouped);
      QINFER_CHECK(weight.biases.dtype == weight.scales.dtype, "cuda {}: {} must be {} like the scales, got {}", op,
                   biases_arg, qinfer::name(weight.scales.dtype), qinfer::name(weight.biases.dtype));
    } else {
      QINFER_CHECK(weight.scales.dtype == DType::u8, "cuda {}: {} must be u8 codes, got {}", op, scales_arg,
                   qinfer::name(weight.scales.dtype));
    }
    w.quantized = true;
    w.data = weight.codes.data;
    w.scales = weight.scales.data;
    w.biases = affine ? weight.biases.data : nullptr;
    w.scale_dtype = weight.scales.dtype;
    w.mode = layout.mode;
    w.bits = layout.bits;
    w.group_size = layout.group_size;
    while ((1 << w.group_shift) < layout.group_size) ++w.group_shift;
    w.in = in;
    w.rows = weight.rows();
    w.row_words = weight.codes.shape.back();
    w.scale_factor = layout.mode == quant::Mode::nvfp4 && weight.global_scale > 0
                         ? weight.global_scale / (448.0f * 6.0f)
                         : 1.0f;
    return w;
  }

  // y = x · wᵀ for more tokens than the GEMV takes. f32 weights: cuBLAS fp32 GEMM. Others: the
  // tensor cores on bf16 operands with f32 accumulation. Exact precision splits each operand into a
  // bf16 pair hi + lo (launch.h) so that the result keeps f32-like accuracy: x·w = hi·w + lo·w for
  // bf16 weights (exact in bf16 already); for other formats the dequantized rows split too and
  // hi·hi + lo·hi + hi·lo (lo·lo is below f32 rounding). Fast precision takes hi·hi alone.
  static void check_gemm_shape(int64_t T, int64_t out, int64_t in) {
    constexpr int64_t kIntMax = std::numeric_limits<int>::max();
    QINFER_CHECK(T <= kIntMax && out <= kIntMax && in <= kIntMax, "cuda linear: [{}, {}] x [{}, {}] is too large for cuBLAS",
                 T, in, out, in);
  }

  // x [T, in] as the GEMMs' bf16 operand: hi, and in exact precision lo (launch.h's pair), in work
  // memory that lives as long as this object.
  class GemmInput {
   public:
    GemmInput(CudaOps& ops, const float* x, int64_t n)
        : pairs_(ops.precision_ == Precision::exact), bytes_(static_cast<size_t>(n) * 2),
          buffer_(ops.scratch((pairs_ ? 2 : 1) * bytes_)) {
      launch_to_bf16_pair(x, n, hi(), lo(), ops.stream());
    }
    void* hi() const { return buffer_.as<char>(); }
    void* lo() const { return pairs_ ? buffer_.as<char>() + bytes_ : nullptr; }

   private:
    bool pairs_;
    size_t bytes_;
    Scratch buffer_;
  };

  void gemm(const float* x, int64_t T, const WeightView& w, float* y) {
    const int64_t out = w.rows, in = w.in;
    check_gemm_shape(T, out, in);
    if (!w.quantized && w.dtype == DType::f32) {
      const float one = 1.0f, zero = 0.0f;
      // Column-major view: y (out × T, ld out) = W (in × out)ᵀ · x (in × T).
      check_cublas(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out), static_cast<int>(T),
                               static_cast<int>(in), &one, static_cast<const float*>(w.data), static_cast<int>(in), x,
                               static_cast<int>(in), &zero, y, static_cast<int>(out)),
                   "cublasSgemm");
      return;
    }
    gemm_bf16(GemmInput(*this, x, T * in), T, w, y);
  }

  // gemm of a 16-bit or quantized w on x already converted.
  void gemm_bf16(const GemmInput& input, int64_t T, const WeightView& w, float* y) {
    const int64_t out = w.rows, in = w.in;
    const bool pairs = precision_ == Precision::exact;
    void* x_hi = input.hi();
    void* x_lo = input.lo();
    if (!w.quantized && w.dtype == DType::bf16) {
      bf16_gemm_->run(x_hi, T, w.data, out, in, y, out, false, stream());
      if (pairs) bf16_gemm_->run(x_lo, T, w.data, out, in, y, out, true, stream());
      return;
    }
    const int64_t chunk = std::clamp<int64_t>(static_cast<int64_t>(kGemmScratchElements) / in, 1, out);
    const size_t w_bytes = static_cast<size_t>(chunk * in) * 2;
    Scratch w_pair = scratch((pairs ? 2 : 1) * w_bytes);
    void* w_hi = w_pair.as<char>();
    void* w_lo = pairs ? w_pair.as<char>() + w_bytes : nullptr;
    for (int64_t row0 = 0; row0 < out; row0 += chunk) {
      const int64_t n = std::min(chunk, out - row0);
      launch_dequantize_rows_bf16_pair(w, row0, n, w_hi, w_lo, stream());
      bf16_gemm_->run(x_hi, T, w_hi, n, in, y + row0, out, false, stream());
      if (!pairs) continue;
      bf16_gemm_->run(x_lo, T, w_hi, n, in, y + row0, out, true, stream());
      bf16_gemm_->run(x_hi, T, w_lo, n, in, y + row0, out, true, stream());
    }
  }

  // The layout of an attention batch on the device: [cu_seqlens | cached | block_table | dst_rows],
  // and with group > 0 the query tiles of `tile_rows` rows for that GQA group size.
  AttentionArrays upload_attention(const AttentionLayout& layout, int64_t group,
                                   int64_t tile_rows = kAttentionTileRows) {
    const int64_t S = layout.seqs.num_seqs();
    const auto& cu = layout.seqs.cu_seqlens;
    // Every layer of a recorded step passes the model's one layout: its arrays are built and staged
    // by the first (a decode step's block tables are S × the context's blocks: megabytes at S = 256).
    const bool recorded = mode_ != Mode::eager;
    const int32_t* base = layout_base_;
    if (!recorded || layout_step_ != step_serial_ || layout_source_ != &layout) {
      blob_.clear();
      blob_.insert(blob_.end(), cu.begin(), cu.end());
      blob_.insert(blob_.end(), layout.cached.begin(), layout.cached.end());
      blob_.insert(blob_.end(), layout.block_table.begin(), layout.block_table.end());
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
          const int64_t position = layout.cached[s] + (t - cu[s]);
          const int64_t block = layout.block_table[s * layout.max_blocks + position / layout.block_size];
          blob_.push_back(static_cast<int32_t>(block * layout.block_size + position % layout.block_size));
        }
      }
      base = upload(attention_layout_, blob_);
      layout_step_ = recorded ? step_serial_ : 0;
      layout_source_ = &layout;
      layout_base_ = base;
    }
    AttentionArrays arrays;
    arrays.cu_seqlens = base;
    arrays.cached = base + (S + 1);
    arrays.block_table = arrays.cached + S;
    arrays.dst_rows = arrays.block_table + S * layout.max_blocks;
    arrays.max_blocks = layout.max_blocks;
    arrays.block_size = layout.block_size;
    if (group > 0) {
      tiles_.clear();
      for (int64_t s = 0; s < S; ++s) {
        const int64_t rows = (cu[s + 1] - cu[s]) * group;
        for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
          tiles_.push_back(static_cast<int32_t>(s));
          tiles_.push_back(static_cast<int32_t>(r0));
        }
      }
      QINFER_CHECK(tiles_.size() / 2 <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                   "cuda attention: the batch has too many query tiles");
      arrays.tiles = upload(attention_tiles_, tiles_);
      arrays.num_tiles = static_cast<int64_t>(tiles_.size() / 2);
    }
    return arrays;
  }

  // conv1d_causal's sequence layout on the device: [cu_seqlens | state_slot | state_to | snapshot_at |
  // snapshot_to | token_seq].
  SeqArrays upload_seqs(IndexUpload& cache, const SeqLayout& layout) {
    const int64_t S = layout.num_seqs();
    const auto& cu = layout.cu_seqlens;
    blob_.clear();
    blob_.insert(blob_.end(), cu.begin(), cu.end());
    blob_.insert(blob_.end(), layout.state_slot.begin(), layout.state_slot.end());
    const auto& targets = layout.state_to.empty() ? layout.state_slot : layout.state_to;
    blob_.insert(blob_.end(), targets.begin(), targets.end());
    for (int64_t s = 0; s < S; ++s) blob_.push_back(layout.snapshot_tokens(s));
    for (int64_t s = 0; s < S; ++s) blob_.push_back(layout.snapshot_slot(s));
    for (int64_t s = 0; s < S; ++s)
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) blob_.push_back(static_cast<int32_t>(s));
    const int32_t* base = upload(cache, blob_);
    SeqArrays arrays;
    arrays.cu_seqlens = base;
    arrays.state_slot = base + (S + 1);
    arrays.state_to = arrays.state_slot + S;
    arrays.snapshot_at = arrays.state_to + S;
    arrays.snapshot_to = arrays.snapshot_at + S;
    arrays.token_seq = arrays.snapshot_to + S;
    arrays.num_seqs = S;
    return arrays;
  }

  std::shared_ptr<Stream> stream_;
  cublasHandle_t cublas_ = nullptr;
  Precision precision_;
  std::unique_ptr<Bf16Gemm> bf16_gemm_;  // made once the device is current
  DeviceStatus* status_ = nullptr;
  int sm_count_ = 0;
  size_t max_shared_ = 0;
  IndexUpload attention_layout_, attention_tiles_, conv_layout_, delta_layout_, delta_rest_layout_;
  // gated_delta_rule's runs of tokens: [begin, end) of one sequence from one slot to another (and a
  // copy of the state after it into `also`, -1: none).
  struct DeltaPiece {
    int32_t begin, end, from, to, also;
  };
  std::vector<DeltaPiece> delta_pieces_, delta_rest_, delta_entries_;
  // upload_attention's arrays of the recorded step layout_step_ (0: none), for the layout at layout_source_.
  uint64_t layout_step_ = 0;
  const AttentionLayout* layout_source_ = nullptr;
  const int32_t* layout_base_ = nullptr;
  // Recorded steps.
  static constexpr size_t kStagingBytes = size_t{16} << 20;
  static constexpr size_t kMaxRecordings = 64;
  bool graphs_enabled_ = true;
  Mode mode_ = Mode::eager;
  std::string step_key_;
  std::unordered_map<std::string, std::unique_ptr<Recording>> recordings_;
  Recording* recording_ = nullptr;
  uint64_t step_serial_ = 0;
  size_t stage_index_ = 0, stage_offset_ = 0;
  bool replay_launched_ = false;  // this replayed step's graph is launched (its inputs are all staged)
  uintptr_t placeholder_ = 0;
  static constexpr uint64_t kUploadChunk = uint64_t{64} << 20;
  char* upload_buffers_[2] = {nullptr, nullptr};  // pinned
  cudaEvent_t upload_done_[2] = {nullptr, nullptr};
  int next_upload_buffer_ = 0;
  char* staging_host_ = nullptr;    // pinned
  DeviceStatus* status_host_ = nullptr;  // pinned
  static constexpr size_t kReadbackBytes = size_t{4} << 20;
  char* readback_host_ = nullptr;  // pinned
  char* staging_device_ = nullptr;
  // The decode attention's per-(tile, kv head) arrival counters (launch_attention_decode): made
  // once, zeroed once, left zero by every launch; recorded steps hold the pointer, so never moved.
  static constexpr int64_t kArrivals = int64_t{1} << 16;
  int* arrivals_ = nullptr;
  cudaEvent_t replay_done_ = nullptr;
  // begin_device_timing / end_device_timing: the step's first and last marks on the stream.
  enum class Timing { off, armed, running };
  Timing timing_ = Timing::off;
  cudaEvent_t timing_events_[2] = {nullptr, nullptr};
  std::vector<int32_t> blob_, tiles_, recurrent_seqs_, chunked_seqs_;
};

CudaOps& cuda_ops(Ops& ops, std::string_view what) {
  auto* cuda = dynamic_cast<CudaOps*>(&ops);
  QINFER_CHECK(cuda != nullptr, "{}: needs the cuda backend, got {}", what, ops.name());
  return *cuda;
}

}  // namespace

Tensor to_device(Ops& ops, const Tensor& host) {
  CudaOps& cuda = cuda_ops(ops, "cuda::to_device");
  QINFER_CHECK(host.device == Device::cpu, "cuda::to_device: the tensor is already on the device");
  Tensor t = cuda.alloc(host.dtype, host.shape);
  cuda.copy(host, t);
  return t;
}

Tensor to_host(const Tensor& device) {
  QINFER_CHECK(device.device == Device::cuda, "cuda::to_host: the tensor is in host memory already");
  Tensor t = host_tensor(device.dtype, device.shape);
  if (t.nbytes() > 0) QINFER_CUDA_CHECK(cudaMemcpy(t.data, device.data, t.nbytes(), cudaMemcpyDeviceToHost));
  return t;
}

void copy(Ops& ops, const Tensor& src, Tensor& dst) { cuda_ops(ops, "cuda::copy").copy(src, dst); }

void copy_columns(Ops& ops, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  cuda_ops(ops, "cuda::copy_columns").copy_columns(src, src_col, dst, dst_col, width);
}

CUstream_st* stream_of(Ops& ops) { return cuda_ops(ops, "cuda::stream_of").stream(); }

bool enqueues(Ops& ops) { return !cuda_ops(ops, "cuda::enqueues").replaying(); }

void finish(Ops& ops) { cuda_ops(ops, "cuda::finish").finish(); }

}  // namespace qinfer::cuda

namespace qinfer {

std::unique_ptr<Ops> make_cuda_ops(int device, Precision precision) {
  return std::make_unique<cuda::CudaOps>(device, precision);
}

}  // namespace qinfer
