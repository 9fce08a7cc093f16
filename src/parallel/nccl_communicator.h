#pragma once
// Tensor parallelism over NCCL: one rank per GPU, collectives enqueued on the rank's cuda Ops stream
// (so they order with its kernels and can be captured in its recorded steps). Built only when the
// CUDA toolkit ships NCCL (QINFER_HAVE_NCCL). NVLink multicast is left as the environment sets it
// (NCCL_NVLS_ENABLE); nothing here creates multicast objects.
#include <array>
#include <atomic>

#include "parallel/communicator.h"

namespace qinfer::parallel {

// Ties the ranks of one group together: made once, given to every rank (threads of one process
// share it; other processes would receive its bytes).
struct NcclId {
  std::array<char, 128> bytes{};
};
NcclId make_nccl_id();
// NCCL's settings for ranks that are threads of one process (environment variables NCCL reads at its
// first use): called before any rank thread starts, as setenv is not thread-safe.
void configure_nccl();

class NcclCommunicator final : public Communicator {
 public:
  // Joins the group as `rank` of `size` on GPU `device` (made current on the calling thread);
  // returns once every rank has joined, so the ranks must call it concurrently.
  NcclCommunicator(const NcclId& id, int rank, int size, int device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // In place on `ops`' stream (a cuda Ops on this rank's device); returns without waiting for it.
  // Inside a recorded step it is captured with the step's kernels, and a replay (whose graph holds
  // it) enqueues nothing.
  void all_reduce_sum(Ops& ops, Tensor& t) override;
  void finish(Ops& ops) override;
  void abort() override;

 private:
  std::atomic<void*> comm_{nullptr};  // ncclComm_t; null once aborted
  int rank_, size_, device_;
};

}  // namespace qinfer::parallel
