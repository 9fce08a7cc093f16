#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace qinfer::parallel {

namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes), "NcclId must hold an ncclUniqueId");

void check(ncclResult_t result, const char* what, int rank) {
  QINFER_CHECK(result == ncclSuccess, "tensor parallel rank {}: {} failed: {} ({})", rank, what,
               ncclGetErrorString(result), ncclGetLastError(nullptr));
}

void check(cudaError_t result, const char* what, int rank) {
  QINFER_CHECK(result == cudaSuccess, "tensor parallel rank {}: {} failed: {}", rank, what,
               cudaGetErrorString(result));
}

}  // namespace

void configure_nccl() {
  // Every connection is made at init, while no rank has work queued: NCCL otherwise connects a
  // protocol at its first collective, allocating device memory on one rank's thread while a peer's
  // thread may hold the driver waiting on a device that waits on this rank (one process, one thread
  // per rank). A value the user set is kept.
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
}

NcclId make_nccl_id() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId", 0);
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

NcclCommunicator::NcclCommunicator(const NcclId& id, int rank, int size, int device)
    : rank_(rank), size_(size), device_(device) {
  QINFER_CHECK(size >= 1 && rank >= 0 && rank < size, "tensor parallel {}: rank {} is not in 0..{}", size, rank,
               size - 1);
  check(cudaSetDevice(device), "cudaSetDevice", rank);
  ncclUniqueId unique;
  std::memcpy(&unique, id.bytes.data(), sizeof(unique));
  ncclComm_t comm = nullptr;
  check(ncclCommInitRank(&comm, size, unique, rank), "ncclCommInitRank", rank);
  comm_ = comm;
}

NcclCommunicator::~NcclCommunicator() {
  if (void* comm = comm_.exchange(nullptr)) ncclCommDestroy(static_cast<ncclComm_t>(comm));
}

void NcclCommunicator::abort() {
  if (void* comm = comm_.exchange(nullptr)) ncclCommAbort(static_cast<ncclComm_t>(comm));
}

void NcclCommunicator::all_reduce_sum(Ops& ops, Tensor& t) {
  QINFER_CHECK(t.dtype == DType::f32 && t.device == Device::cuda,
               "all_reduce_sum: rank {} gave a {} tensor in {} memory; NCCL reduces f32 device tensors", rank_,
               name(t.dtype), t.device == Device::cuda ? "device" : "host");
  if (!cuda::enqueues(ops)) return;
  void* comm = comm_.load();
  QINFER_CHECK(comm != nullptr, "tensor parallel rank {}: the group was stopped after another rank failed", rank_);
  check(cudaSetDevice(device_), "cudaSetDevice", rank_);
  check(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), ncclFloat32, ncclSum,
                      static_cast<ncclComm_t>(comm), cuda::stream_of(ops)),
        "ncclAllReduce", rank_);
}

void NcclCommunicator::finish(Ops& ops) { cuda::finish(ops); }

}  // namespace qinfer::parallel
