#include "models/tensor_parallel.h"

#include <cstring>
#include <map>

#include "core/error.h"
#include "core/log.h"
#ifdef QINFER_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace qinfer::models {

namespace {

// What process 0 of a leading group tells the others, one message per cache operation or forward.
enum class Op : uint8_t { make_cache, drop_cache, zero_slot, snapshot, restore, forward, stop };

class Writer {
 public:
  explicit Writer(Op op) { put(op); }
  template <typename T>
  void put(const T& value) {
    append(&value, sizeof(T));
  }
  template <typename T>
  void put(const std::vector<T>& values) {
    put(static_cast<uint64_t>(values.size()));
    append(values.data(), values.size() * sizeof(T));
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  void append(const void* data, size_t n) {
    const size_t at = bytes_.size();
    bytes_.resize(at + n);
    if (n > 0) std::memcpy(bytes_.data() + at, data, n);
  }
  std::vector<char> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    T value;
    take(&value, sizeof(T));
    return value;
  }
  template <typename T>
  std::vector<T> vector() {
    const uint64_t n = get<uint64_t>();
    QINFER_CHECK(n <= (bytes_.size() - at_) / sizeof(T), "tensor parallel: a malformed message from process 0");
    std::vector<T> values(n);
    take(values.data(), n * sizeof(T));
    return values;
  }

 private:
  void take(void* out, size_t n) {
    QINFER_CHECK(n <= bytes_.size() - at_, "tensor parallel: a malformed message from process 0");
    std::memcpy(out, bytes_.data() + at_, n);
    at_ += n;
  }
  const std::vector<char>& bytes_;
  size_t at_ = 0;
};

// Process 0's cache, mirrored in the followers' caches of the same id.
class FollowerCaches final : public ModelCache::Mirror {
 public:
  FollowerCaches(parallel::ProcessGroup& processes, uint64_t id, int ranks_per_process)
      : processes_(processes), id_(id), per_process_(ranks_per_process) {}
  ~FollowerCaches() override {
    try {
      Writer w(Op::drop_cache);
      w.put(id_);
      processes_.broadcast(w.bytes());
    } catch (const Error&) {
      // The followers are gone: nothing holds the cache any more.
    }
  }
  int ranks() const override { return (processes_.count() - 1) * per_process_; }
  void zero_slot(int32_t slot) override {
    Writer w(Op::zero_slot);
    w.put(id_);
    w.put(slot);
    processes_.broadcast(w.bytes());
  }
  void snapshot(int32_t slot, ModelCache::StateSnapshot& s) override {
    Writer w(Op::snapshot);
    w.put(id_);
    w.put(slot);
    processes_.broadcast(w.bytes());
    const std::vector<std::vector<char>> parts = processes_.gather({});
    for (int p = 1; p < processes_.count(); ++p) {
      Reader r(parts[static_cast<size_t>(p)]);
      QINFER_CHECK(r.get<Op>() == Op::snapshot, "tensor parallel: process {} answered a snapshot with another message",
                   p);
      for (auto* layers : {&s.conv, &s.delta}) {
        const uint64_t n = r.get<uint64_t>();
        for (uint64_t i = 0; i < n; ++i) layers->push_back(r.vector<float>());
      }
    }
  }
  void restore(int32_t slot, const ModelCache::StateSnapshot& s, int first_rank) override {
    Writer w(Op::restore);
    w.put(id_);
    w.put(slot);
    for (const auto* layers : {&s.conv, &s.delta}) {
      const size_t per_rank = layers->size() / static_cast<size_t>(first_rank + ranks());
      w.put(static_cast<uint64_t>(per_rank * per_process_));
      // Each follower takes its own ranks' layers: process p's start at rank p · per_process.
      for (size_t i = static_cast<size_t>(first_rank) * per_rank; i < layers->size(); ++i) w.put((*layers)[i]);
    }
    processes_.broadcast(w.bytes());
  }

 private:
  parallel::ProcessGroup& processes_;
  uint64_t id_;
  int per_process_;
};

}  // namespace

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
  if (processes != nullptr && processes->count() > 1) watcher_ = std::thread([this] { watch_peers(); });
}

void TensorParallelModel::watch_peers() {
  constexpr auto kDepartureGrace = std::chrono::seconds(5);
  int gone = -1;
  while (gone < 0) {
    {
      std::lock_guard lock(watch_mutex_);
      if (watch_stopped_) return;
    }
    gone = placement_.processes->departed(std::chrono::milliseconds(200));
  }
  {
    std::unique_lock lock(watch_mutex_);
    if (watch_stop_.wait_for(lock, kDepartureGrace, [&] { return watch_stopped_; })) return;
  }
  const std::string why = fmt::format("process {} of the group is gone (its connection closed)", gone);
  log_error("tensor parallel: {}; ending the group's collectives", why);
  {
    std::lock_guard lock(mutex_);
    if (failed_.empty()) failed_ = why;
  }
  for (const auto& comm : nccl_)
    if (comm) comm->abort();
}

void TensorParallelModel::stop_watching() {
  {
    std::lock_guard lock(watch_mutex_);
    watch_stopped_ = true;
  }
  watch_stop_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

TensorParallelModel::~TensorParallelModel() {
  stop_watching();  // before process 0 tells the others to stop (they then leave)
  if (leading_) {
    try {
      tell_followers(Writer(Op::stop).bytes());
    } catch (const Error&) {
      // A follower already gone has nothing left to stop.
    }
  }
  shut_down();
}

void TensorParallelModel::shut_down() {
  // A rank's model, Ops and communicator go on its own thread (NCCL tears a group down together),
  // the communicator last: the Ops' recorded steps hold its collectives, and NCCL waits for those
  // graphs to be freed before it lets the communicator go.
  stop_watching();
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
  ModelCache cache(ranks, cache_shape(), num_blocks, block_size, num_slots);
  if (leading_) {
    Writer w(Op::make_cache);
    w.put(cache.id());
    w.put(num_blocks);
    w.put(block_size);
    w.put(num_slots);
    tell_followers(w.bytes());
    cache.set_mirror(std::make_unique<FollowerCaches>(*placement_.processes, cache.id(), size()));
  }
  return cache;
}

void TensorParallelModel::tell_followers(const std::vector<char>& message) const {
  placement_.processes->broadcast(message);
}

void TensorParallelModel::lead() {
  parallel::ProcessGroup* processes = placement_.processes.get();
  QINFER_CHECK(processes != nullptr && processes->index() == 0,
               "tensor parallel: only process 0 of a group over processes leads it");
  leading_ = true;
}

void TensorParallelModel::follow() {
  parallel::ProcessGroup* processes = placement_.processes.get();
  QINFER_CHECK(processes != nullptr && processes->index() != 0,
               "tensor parallel: only processes 1.. of a group over processes follow process 0");
  const size_t mine = static_cast<size_t>(processes->index() - 1);  // among the followers
  std::map<uint64_t, ModelCache> caches;
  auto cache_of = [&](uint64_t id) -> ModelCache& {
    auto it = caches.find(id);
    QINFER_CHECK(it != caches.end(), "tensor parallel: process 0 named cache {}, which this process does not hold", id);
    return it->second;
  };
  while (true) {
    const std::vector<char> message = processes->broadcast({});
    Reader r(message);
    const Op op = r.get<Op>();
    if (op == Op::stop) return;
    const uint64_t id = r.get<uint64_t>();
    switch (op) {
      case Op::make_cache: {
        const int64_t blocks = r.get<int64_t>();
        const int32_t block_size = r.get<int32_t>();
        const int64_t slots = r.get<int64_t>();
        caches.emplace(id, make_cache(blocks, block_size, slots));
        break;
      }
      case Op::drop_cache:
        caches.erase(id);
        break;
      case Op::zero_slot:
        cache_of(id).zero_slot(r.get<int32_t>());
        break;
      case Op::snapshot: {
        const ModelCache::StateSnapshot s = cache_of(id).snapshot(r.get<int32_t>());
        Writer w(Op::snapshot);
        for (const auto* layers : {&s.conv, &s.delta}) {
          w.put(static_cast<uint64_t>(layers->size()));
          for (const std::vector<float>& values : *layers) w.put(values);
        }
        processes->gather(w.bytes());
        break;
      }
      case Op::restore: {
        const int32_t slot = r.get<int32_t>();
        ModelCache::StateSnapshot s;
        for (auto* layers : {&s.conv, &s.delta}) {
          const uint64_t per_process = r.get<uint64_t>();
          for (size_t p = 0; p < static_cast<size_t>(processes->count() - 1); ++p)
            for (uint64_t i = 0; i < per_process; ++i) {
              std::vector<float> values = r.vector<float>();
              if (p == mine) layers->push_back(std::move(values));
            }
        }
        cache_of(id).restore(slot, s);
        break;
      }
      case Op::forward: {
        const uint64_t count = r.get<uint64_t>();
        std::vector<SequenceCache> sequences(count);
        Batch batch;
        batch.block_table_width = r.get<int32_t>();
        batch.may_record = r.get<uint8_t>() != 0;
        for (uint64_t i = 0; i < count; ++i) {
          std::vector<int32_t> tokens = r.vector<int32_t>();
          sequences[i].blocks = r.vector<int32_t>();
          sequences[i].cached = r.get<int32_t>();
          sequences[i].slot = r.get<int32_t>();
          const bool all_logits = r.get<uint8_t>() != 0;
          const int32_t state_to = r.get<int32_t>(), snapshot_at = r.get<int32_t>(), snapshot_to = r.get<int32_t>();
          batch.sequences.push_back({std::move(tokens), &sequences[i], all_logits, state_to, snapshot_at, snapshot_to});
        }
        (void)forward(batch, cache_of(id));
        break;
      }
      default:
        qinfer::fail("tensor parallel: an unknown message ({}) from process 0", static_cast<int>(op));
    }
  }
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
    check_room(cache, *s.cache, static_cast<int64_t>(s.tokens.size()), s.state_to, s.snapshot_to);
  }
  if (leading_) {  // the followers run this forward on their ranks, with the blocks and slots assigned here
    Writer w(Op::forward);
    w.put(cache.id());
    w.put(static_cast<uint64_t>(batch.sequences.size()));
    w.put(batch.block_table_width);
    w.put(static_cast<uint8_t>(batch.may_record));
    for (const Batch::Sequence& s : batch.sequences) {
      w.put(s.tokens);
      w.put(s.cache->blocks);
      w.put(s.cache->cached);
      w.put(s.cache->slot);
      w.put(static_cast<uint8_t>(s.all_logits));
      w.put(s.state_to);
      w.put(s.snapshot_at);
      w.put(s.snapshot_to);
    }
    tell_followers(w.bytes());
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
