#include "parallel/communicator.h"

#include <cstring>
#include <thread>

#include "core/error.h"

namespace qinfer::parallel {

class ThreadGroup::Rank final : public Communicator {
 public:
  Rank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  void all_reduce_sum(Ops& ops, Tensor& t) override {
    QINFER_CHECK(t.dtype == DType::f32, "all_reduce_sum: rank {} gave a {} tensor; only f32 is reduced", rank_,
                 name(t.dtype));
    const Tensor mine = to_host(ops, t);  // t itself on the host backends
    group_.published_[rank_] = &mine;
    group_.published_numel_[rank_] = mine.numel();
    group_.barrier();
    const int64_t n = group_.published_numel_[0];
    for (int r = 0; r < size(); ++r)
      QINFER_CHECK(group_.published_numel_[r] == n, "all_reduce_sum: rank 0 reduces {} values but rank {} gave {}", n,
                   r, group_.published_numel_[r]);
    Tensor sum = host_tensor(DType::f32, t.shape);
    float* out = sum.ptr<float>();
    for (int r = 0; r < size(); ++r) {
      const Tensor& part = *group_.published_[r];
      const float* in = part.ptr<float>();
      if (r == 0) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
      else
        for (int64_t i = 0; i < n; ++i) out[i] += in[i];
    }
    group_.barrier();  // every rank has read every contribution before any is overwritten
    ops.copy(sum, t);
  }

 private:
  ThreadGroup& group_;
  int rank_;
};

ThreadGroup::ThreadGroup(int size) {
  QINFER_CHECK(size >= 1, "tensor parallel: the group size must be at least 1, got {}", size);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
  published_.assign(static_cast<size_t>(size), nullptr);
  published_numel_.assign(static_cast<size_t>(size), 0);
}

ThreadGroup::~ThreadGroup() = default;

Communicator& ThreadGroup::rank(int r) { return *ranks_.at(static_cast<size_t>(r)); }

void ThreadGroup::barrier() {
  std::unique_lock lock(mutex_);
  QINFER_CHECK(!aborted_, "tensor parallel: another rank failed; this rank stops");
  const uint64_t generation = generation_;
  if (++waiting_ == size()) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  QINFER_CHECK(generation_ != generation, "tensor parallel: another rank failed; this rank stops");
}

void ThreadGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  arrived_.notify_all();
}

void ThreadGroup::run(const std::function<void(Communicator&)>& body) {
  QINFER_CHECK(!aborted_, "tensor parallel: this thread group failed before and cannot run again");
  std::mutex error_mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int r = 0; r < size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*ranks_[r]);
      } catch (...) {
        {
          std::lock_guard lock(error_mutex);
          if (!first_error) first_error = std::current_exception();
        }
        abort();
      }
    });
  for (std::thread& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace qinfer::parallel
