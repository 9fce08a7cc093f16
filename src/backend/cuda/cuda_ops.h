#pragma once
// The cuda backend (backend/ops.h) on one GPU, and moving tensors between host memory and it.
#include <cstdint>
#include <memory>

#include "backend/ops.h"

struct CUstream_st;  // cudaStream_t, without the CUDA headers

namespace qinfer {

// How prefill-sized work (more tokens than the decode GEMV takes) rounds its operands. `exact` splits
// every f32 activation and dequantized weight into a bf16 pair (hi + lo, ~16 mantissa bits) and
// attention runs in TF32: within ~1e-3 of an f32 forward, at two to three GEMMs per linear. `fast`
// rounds them to bf16 once — what a bf16 model does in PyTorch or vLLM — at one GEMM per linear and
// bf16 attention. Decode steps are exact in both (their GEMVs split x exactly at no cost).
enum class Precision { exact, fast };

// The cuda backend on `device`: tensors live in device memory (a stream-ordered pool; alloc
// zero-fills), every op is enqueued on one stream owned by the Ops, and the host waits only where it
// reads results (sample, copies into host memory). Throws when there is no such device.
std::unique_ptr<Ops> make_cuda_ops(int device, Precision precision);

}  // namespace qinfer

namespace qinfer::cuda {

// A new tensor of `ops` (a cuda Ops) holding a copy of host tensor `host`.
Tensor to_device(Ops& ops, const Tensor& host);
// A new host tensor holding a copy of device tensor `device`. Waits for the work queued before it
// (the Ops' stream is a blocking stream, so the synchronous copy orders after it).
Tensor to_host(const Tensor& device);
// src → dst (same dtype and element count), each in host memory or on `ops`' device; returns with a
// host destination filled. Throws if a kernel reported a bad index since the last check.
void copy(Ops& ops, const Tensor& src, Tensor& dst);
// qinfer::copy_columns (backend/tensor.h) for tensors on `ops`' device.
void copy_columns(Ops& ops, const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width);
// The stream every op of `ops` (a cuda Ops) is enqueued on: collectives (NCCL) join it.
CUstream_st* stream_of(Ops& ops);
// False while `ops` replays a recorded step: the step's graph already holds its work, so work that
// joins stream_of(ops) from outside the ops (collectives) must not be enqueued again.
bool enqueues(Ops& ops);
// Returns once the work queued on `ops` has run; throws if a kernel reported a bad index.
void finish(Ops& ops);

}  // namespace qinfer::cuda
