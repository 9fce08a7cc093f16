#pragma once
// The processes of a tensor-parallel group that spans hosts (or several processes of one host), each
// started with the same command (as torchrun launches a job). Process 0 listens on HOST:PORT and every
// other process connects to it, so the group is a star around process 0. Over it the processes agree
// on what must be the same everywhere (the NCCL id), process 0 sends what the others follow when it
// alone runs the engine (models::TensorParallelModel::lead / follow), and host ranks sum tensors. GPU
// ranks talk over NCCL directly, which crosses hosts through its network transport.
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace qinfer::parallel {

class ProcessGroup {
 public:
  // Process `index` of `count` joins the group at `address` (HOST:PORT; process 0 binds it, port 0
  // picks a free one that port() reports). Returns once all `count` processes are connected; waits
  // at most `timeout` for them, then fails naming who is missing. Each connecting process sends its
  // index, and a process that gives one already taken or out of range is refused with an error on
  // both sides.
  static std::unique_ptr<ProcessGroup> join(const std::string& address, int index, int count,
                                            std::chrono::milliseconds timeout = std::chrono::minutes(5));
  // Process 0 only: binds `address` now and returns the group before the others connect; connect()
  // then waits for them. Lets a caller learn port() first (tests, port 0).
  static std::unique_ptr<ProcessGroup> listen(const std::string& address, int count);
  void accept_all(std::chrono::milliseconds timeout = std::chrono::minutes(5));

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int index() const { return index_; }
  int count() const { return count_; }
  int port() const { return port_; }

  // Process 0's `bytes` on every process (the others' argument is ignored).
  std::vector<char> broadcast(const std::vector<char>& bytes);
  // Every process's `value`, in process order, on every process.
  std::vector<int64_t> all_gather(int64_t value);
  // Every process's `bytes` on process 0, in process order (the others get an empty list).
  std::vector<std::vector<char>> gather(const std::vector<char>& bytes);
  // `values` becomes the element-wise sum over the processes, added in process order on process 0
  // (((v0 + v1) + v2) ...), so every process ends with the same bits. Every process passes the same
  // length; a process that passes another fails the collective on all of them.
  void all_reduce_sum(std::span<float> values);

  // The index of a process whose connection has closed (it exited or crashed), waiting at most
  // `timeout` for one; -1 if none. Reads nothing: safe beside the collectives of another thread.
  int departed(std::chrono::milliseconds timeout) const;

 private:
  ProcessGroup(int index, int count) : index_(index), count_(count) {}
  void send(int fd, const void* data, size_t bytes) const;
  void receive(int fd, void* data, size_t bytes) const;
  // Process 0: the socket of process p (1 ≤ p < count). Others: the socket to process 0.
  int peer(int p) const;

  int index_, count_, port_ = 0;
  int listener_ = -1;
  std::vector<int> sockets_;  // process 0: index p - 1 → process p; others: one, to process 0
};

// The Communicator of a host rank (cpu / ref backends) that is alone in its process: its sums are the
// group's all_reduce_sum (the rank's place in the sum is its process's).
class ProcessCommunicator final : public Communicator {
 public:
  explicit ProcessCommunicator(ProcessGroup& group) : group_(group) {}
  int rank() const override { return group_.index(); }
  int size() const override { return group_.count(); }
  void all_reduce_sum(Ops& ops, Tensor& t) override;

 private:
  ProcessGroup& group_;
};

}  // namespace qinfer::parallel
