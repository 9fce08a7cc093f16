#pragma once
// Collectives between the ranks of a tensor-parallel group. A rank owns one Ops (one device); the
// model calls all_reduce_sum after every row-parallel projection. ThreadGroup runs N ranks as
// threads of this process over host memory (CI, the cpu / ref backends); the NCCL communicator
// (nccl_communicator.h) runs them on GPUs.
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/ops.h"

namespace qinfer::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // t (f32, in `ops`' memory) becomes the element-wise sum of every rank's t. Every rank calls it
  // with the same shape, in the same order; every rank ends with the same values.
  virtual void all_reduce_sum(Ops& ops, Tensor& t) = 0;
  // Returns once this rank's collectives so far have completed (they may run after all_reduce_sum
  // returns). The group's driver calls it at the end of every forward, so that no rank's device
  // still waits on a peer when the ranks go their own ways.
  virtual void finish(Ops& ops) { (void)ops; }
  // Called from any thread once another rank has failed: releases this rank's collectives in
  // flight (on the device too) and fails every later one, so that no rank waits for the failed one.
  virtual void abort() {}
};

// N ranks as threads sharing host memory. Sums run over ranks 0..N-1 in that order on every rank,
// so results are bit-identical across ranks and independent of thread timing.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size);
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int r);

  // Runs body(communicator) on `size` threads, one per rank, and joins them. The first exception a
  // rank throws is rethrown here; the other ranks, if waiting in a collective, are released with an
  // error so that nothing hangs. A group whose run failed cannot run again.
  void run(const std::function<void(Communicator&)>& body);
  // Releases every rank waiting in a collective with an error, and fails every later one: for a
  // driver that runs the ranks on threads of its own (models/tensor_parallel.h) when one fails.
  void abort();

 private:
  class Rank;
  friend class Rank;
  // Waits until every rank arrives (or throws once the group is aborted).
  void barrier();

  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<const Tensor*> published_;  // each rank's host contribution during a collective
  // Their element counts, as values: every rank checks them all and so fails or goes on together,
  // and none reads a contribution whose rank has already left with an error.
  std::vector<int64_t> published_numel_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

}  // namespace qinfer::parallel
