#pragma once
// A tensor-parallel group that the engine drives like one Model: N rank Models of one checkpoint, each
// on its own backend with its slice of the weights and its own heads of every cache. Rank 0 runs on
// the caller's thread and ranks 1..N-1 on threads of the group, every rank the same forward at once;
// rank 0's logits are the result. Host ranks sum over a ThreadGroup, GPU ranks over NCCL.
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "models/model.h"
#include "parallel/process_group.h"

namespace qinfer::models {

// Where a process's ranks sit in a group that spans processes (parallel/process_group.h): ranks
// first_rank .. first_rank + local count - 1 of `size`. Empty: the group is this process's ranks.
struct Placement {
  int first_rank = 0, size = 0;
  std::unique_ptr<parallel::ProcessGroup> processes;
};

class TensorParallelModel final : public Runner {
 public:
  // One rank per backend in `ops` (all cpu / ref, or all cuda); `gpus` names each cuda rank's GPU
  // index (for NCCL) and is empty for host ranks. Loads every rank's slice at once; a split that does
  // not divide fails first, naming the config field. Across processes, GPU ranks share one NCCL group
  // (process 0 makes its id) and a host rank must be alone in its process.
  TensorParallelModel(const Checkpoint& checkpoint, std::vector<std::unique_ptr<Ops>> ops, std::vector<int> gpus = {},
                      Placement placement = {});
  ~TensorParallelModel() override;
  TensorParallelModel(const TensorParallelModel&) = delete;
  TensorParallelModel& operator=(const TensorParallelModel&) = delete;

  int size() const { return static_cast<int>(ops_.size()); }  // this process's ranks
  int local_ranks() const override { return size(); }
  const io::TextConfig& config() const override { return config_; }
  Ops& ops() const override { return *ops_[0]; }
  CacheShape cache_shape() const override;
  // One shard per rank (ModelCache's group constructor); the engine's blocks and slots apply to all.
  ModelCache make_cache(int64_t num_blocks, int32_t block_size, int64_t num_slots) const override;
  // Every rank runs the batch on its shard of `cache`; each sequence's cache advances once. No dump:
  // a rank's intermediates hold only its heads.
  Tensor forward(const Batch& batch, ModelCache& cache,
                 const std::function<void(const std::string&, const Tensor&)>& dump = {}) override;

  // Runs body(rank's model) on every rank at once (rank 0 on this thread); each must run the same
  // forwards in the same order. `qinfer eval` uses it for per-rank work.
  void for_each_rank(const std::function<void(Model&)>& body);

  // A group over processes in which only process 0 runs the engine (serve, chat: requests arrive at
  // one process): process 0 calls lead() before it makes a cache, and every other process calls
  // follow(), which makes the caches and runs the forwards process 0's do, on this process's ranks,
  // until process 0's group is destroyed. Without them every process runs the same command and
  // makes the same calls itself (eval, run, bench).
  void lead();
  void follow();

 private:
  // Runs job(rank) on every rank and waits for all. A rank that throws aborts the collectives of
  // the others (so none hangs) and its error is rethrown here as a qinfer::Error; the group then
  // refuses further work, as its ranks may have stopped at different points.
  void run(const std::function<void(int rank)>& job);
  void fail(int rank, std::exception_ptr error);
  void worker(int rank);
  // Frees every rank's model and communicator on the rank's thread, then stops the threads.
  void shut_down();
  // Process 0 of a leading group: `message` to every other process.
  void tell_followers(const std::vector<char>& message) const;
  // A group over processes: NCCL has no timeout, so a GPU collective whose peer process died waits
  // forever. This thread watches the group's connections; once one closes and the group is not
  // stopped within kDepartureGrace (a peer that finished normally leaves only after its last
  // collective, which this process has then finished too), it marks the group failed and aborts the
  // NCCL communicators: a forward waiting on the dead peer ends with an error, later ones fail at
  // once naming the peer. (Host ranks' sums fail on the closed connection by themselves.)
  void watch_peers();
  void stop_watching();

  io::TextConfig config_;
  std::vector<std::unique_ptr<Ops>> ops_;
  Placement placement_;
  bool leading_ = false;
  std::unique_ptr<parallel::ThreadGroup> host_group_;             // host ranks' collectives
  std::unique_ptr<parallel::Communicator> process_rank_;          // a host rank alone in its process
  std::vector<std::unique_ptr<parallel::Communicator>> nccl_;     // GPU ranks' collectives
  std::vector<std::unique_ptr<Model>> models_;

  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;  // bumped per job
  int pending_ = 0;          // worker ranks still running the job
  bool stopping_ = false;
  std::exception_ptr error_;  // the job's first failure
  std::string failed_;        // why the group stopped, once a job failed
  std::vector<std::thread> workers_;  // ranks 1..N-1

  std::thread watcher_;
  std::mutex watch_mutex_;
  std::condition_variable watch_stop_;
  bool watch_stopped_ = false;
};

}  // namespace qinfer::models
