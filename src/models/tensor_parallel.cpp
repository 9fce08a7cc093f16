#include "models/tensor_parallel.h"

#include "core/error.h"
#ifdef QINFER_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace qinfer::models {

TensorParallelModel::TensorParallelModel(const Checkpoint& checkpoint, std::vector<std::unique_ptr<Ops>> ops,
                                         std::vector<int> gpus, Placement placement)
    : config_(checkpoint.config.text), ops_(std::move(ops)), placement_(std::move(placement)) {
  const int n = size();
  QINFER_CHECK(n >= 1, "tensor parallel: the group needs at least one rank");
  if (placement_.size == 0) placement_.size = n;
  const int first = placement_.first_rank, total = placement_.size;
  QINFER_CHECK(first >= 0 && first + n <= total, "tensor parallel: ranks {}..{} are not in a group of {}", first,
               first + n - 1, total);
  // Before any thread starts: the error that names the field that does not divide.
  (void)parallel::plan_shards(config_, 0, total);
  const bool on_gpus = ops_[0]->device() == Device::cuda;
  for (const auto& o : ops_)
    QINFER_CHECK((o->device() == Device::cuda) == on_gpus, "tensor parallel: ranks on {} and {} cannot be mixed",
                 ops_[0]->name(), o->name());
  QINFER_CHECK(!on_gpus || static_cast<int>(gpus.size()) == n,
               "tensor parallel: {} cuda ranks need {} GPU indices, got {}", n, n, gpus.size());
  parallel::ProcessGroup* processes = placement_.processes.get();
  QINFER_CHECK(on_gpus || processes == nullptr || n == 1,
               "tensor parallel: {} host ranks in one process of a multi-process group (host ranks across processes "
               "take one rank per process)", n);
#ifdef QINFER_HAVE_NCCL
  if (on_gpus) parallel::configure_nccl();
  parallel::NcclId nccl_id;
  if (on_gpus && (processes == nullptr || processes->index() == 0)) nccl_id = parallel::make_nccl_id();
  if (on_gpus && processes != nullptr) {  // every process joins process 0's NCCL group
    const std::vector<char> id =
        processes->broadcast(std::vector<char>(nccl_id.bytes.begin(), nccl_id.bytes.end()));
    QINFER_CHECK(id.size() == nccl_id.bytes.size(), "tensor parallel: process 0 sent a {}-byte NCCL id", id.size());
    std::copy(id.begin(), id.end(), nccl_id.bytes.begin());
  }
#else
  QINFER_CHECK(!on_gpus, "--tensor-parallel on cuda needs NCCL, which this build did not find (nccl.h and libnccl in "
                         "the CUDA toolkit)");
#endif
  if (!on_gpus && processes != nullptr) process_rank_ = std::make_unique<parallel::ProcessCommunicator>(*processes);
  else if (!on_gpus) host_group_ = std::make_unique<parallel::ThreadGroup>(n);
  nccl_.resize(static_cast<size_t>(n));
  models_.resize(static_cast<size_t>(n));
  // Every rank joins its communicator (NCCL's init returns once all have) and loads its slice.
  auto load = [&](int r) {
    parallel::Communicator* comm = nullptr;
#ifdef QINFER_HAVE_NCCL
    if (on_gpus) {
      nccl_[static_cast<size_t>(r)] =
          std::make_unique<parallel::NcclCommunicator>(nccl_id, first + r, total, gpus[static_cast<size_t>(r)]);
      comm = nccl_[static_cast<size_t>(r)].get();
    }
#endif
    if (process_rank_) comm = process_rank_.get();
    else if (!on_gpus) comm = &host_group_->rank(r);
    models_[static_cast<size_t>(r)] = std::make_unique<Model>(checkpoint, *ops_[static_cast<size_t>(r)], comm);
  };
  try {
    for (int r = 1; r < n; ++r) workers_.emplace_back([this, r] { worker(r); });
    run(load);
  } catch (...) {
    shut_down();  // the destructor does not run for a constructor that throws
    throw;
  }
}

TensorParallelModel::~TensorParallelModel() { shut_down(); }

void TensorParallelModel::shut_down() {
  // A rank's model, Ops and communicator go on its own thread (NCCL tears a group down together),
  // the communicator last: the Ops' recorded steps hold its collectives, and NCCL waits for those
  // graphs to be freed before it lets the communicator go.
  {
    std::lock_guard lock(mutex_);
    failed_.clear();
  }
  try {
    run([this](int r) {
      models_[static_cast<size_t>(r)].reset();
      ops_[static_cast<size_t>(r)].reset();
      nccl_[static_cast<size_t>(r)].reset();
    });
  } catch (...) {
    // Nothing left to report to: the models and communicators are freed below either way.
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  models_.clear();
  nccl_.clear();
}

CacheShape TensorParallelModel::cache_shape() const { return models_[0]->cache_shape(); }

ModelCache TensorParallelModel::make_cache(int64_t num_blocks, int32_t block_size, int64_t num_slots) const {
  std::vector<Ops*> ranks;
  for (const auto& o : ops_) ranks.push_back(o.get());
  return ModelCache(ranks, cache_shape(), num_blocks, block_size, num_slots);
}

Tensor TensorParallelModel::forward(const Batch& batch, ModelCache& cache,
                                    const std::function<void(const std::string&, const Tensor&)>& dump) {
  QINFER_CHECK(!dump, "a tensor-parallel forward dumps no intermediates (each rank holds only its heads)");
  QINFER_CHECK(cache.ranks() == size(), "tensor parallel: a cache of {} ranks given to a group of {}", cache.ranks(),
               size());
  // What a rank would reject, and the blocks and slots, settled here once: every rank then runs to the
  // end or fails with the whole group, and no rank's Model allocates (its sequences arrive reserved).
  for (const Batch::Sequence& s : batch.sequences) {
    QINFER_CHECK(!s.tokens.empty() && s.cache != nullptr, "forward: every sequence needs tokens and a cache");
    for (int32_t t : s.tokens)
      QINFER_CHECK(t >= 0 && t < config_.vocab_size, "token id {} is outside the vocabulary (0..{})", t,
                   config_.vocab_size - 1);
    s.cache->reserve(cache, static_cast<int32_t>(s.tokens.size()));
  }
  // Ranks 1..N-1 advance copies of the sequences' caches; rank 0 advances the caller's, once.
  const size_t n = static_cast<size_t>(size());
  std::vector<std::vector<SequenceCache>> copies(n);
  std::vector<Batch> batches(n);
  for (size_t r = 1; r < n; ++r) {
    copies[r].reserve(batch.sequences.size());
    for (const Batch::Sequence& s : batch.sequences) copies[r].push_back(*s.cache);
    batches[r] = batch;
    for (size_t i = 0; i < batch.sequences.size(); ++i) batches[r].sequences[i].cache = &copies[r][i];
  }
  Tensor logits;
  run([&](int r) {
    const size_t i = static_cast<size_t>(r);
    if (r == 0) logits = models_[0]->forward(batch, cache.rank(0));
    else (void)models_[i]->forward(batches[i], cache.rank(r));
    // Every rank's collectives done before any returns: what the engine does next on rank 0 alone
    // (sampling, copies to the host) never waits on a device that waits on another rank.
    if (nccl_[i]) nccl_[i]->finish(*ops_[i]);
  });
  return logits;
}

void TensorParallelModel::for_each_rank(const std::function<void(Model&)>& body) {
  run([&](int r) { body(*models_[static_cast<size_t>(r)]); });
}

void TensorParallelModel::run(const std::function<void(int)>& job) {
  {
    std::lock_guard lock(mutex_);
    QINFER_CHECK(failed_.empty(), "tensor parallel: the group stopped after a rank failed ({})", failed_);
    job_ = &job;
    pending_ = static_cast<int>(workers_.size());  // size() - 1 once every worker started
    error_ = nullptr;
    ++generation_;
  }
  start_.notify_all();
  try {
    job(0);
  } catch (...) {
    fail(0, std::current_exception());
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (!error_) return;
  std::exception_ptr error = error_;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    failed_ = e.what();
  }
  lock.unlock();
  std::rethrow_exception(error);
}

void TensorParallelModel::fail(int rank, std::exception_ptr error) {
  // Errors leave as qinfer::Error; anything else (bad_alloc, ...) gets its rank named.
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(Error(fmt::format("tensor parallel rank {}: {}", rank, e.what())));
  } catch (...) {
    error = std::make_exception_ptr(Error(fmt::format("tensor parallel rank {}: an unknown exception", rank)));
  }
  {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = error;  // recorded before the others are released: the cause comes first
  }
  if (host_group_) host_group_->abort();
  for (const auto& comm : nccl_)
    if (comm) comm->abort();
}

void TensorParallelModel::worker(int rank) {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    try {
      (*job)(rank);
    } catch (...) {
      fail(rank, std::current_exception());
    }
    std::lock_guard lock(mutex_);
    if (--pending_ == 0) done_.notify_all();
  }
}

}  // namespace qinfer::models
