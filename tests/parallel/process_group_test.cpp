// parallel::ProcessGroup over real sockets on this host, its processes played by threads: joining
// (and who is refused), collectives that give every process the same bits, and failures that end in
// errors on every side instead of a hang. Then models::TensorParallelModel over two "processes" (one
// ref rank each) against one Model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include "core/error.h"
#include "models/tensor_parallel.h"
#include "parallel/process_group.h"
#include "support/golden_reference.h"

namespace qinfer::parallel {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// What `body` throws ("" when nothing).
std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Runs body(group) on `count` threads, each joining as one process; returns each one's error ("" when
// none). Process 0 listens on a free port first, so the others know where to connect.
std::vector<std::string> run_processes(int count, const std::function<void(ProcessGroup&)>& body,
                                       std::chrono::milliseconds timeout = 20s) {
  std::unique_ptr<ProcessGroup> head = ProcessGroup::listen("127.0.0.1:0", count);
  const std::string address = "127.0.0.1:" + std::to_string(head->port());
  std::vector<std::string> errors(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  for (int p = 0; p < count; ++p) {
    threads.emplace_back([&, p] {
      errors[static_cast<size_t>(p)] = error_of([&] {
        std::unique_ptr<ProcessGroup> group;
        if (p == 0) {
          head->accept_all(timeout);
          group = std::move(head);
        } else {
          group = ProcessGroup::join(address, p, count, timeout);
        }
        body(*group);
      });
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

TEST(ProcessGroup, CollectivesGiveEveryProcessTheSameBits) {
  constexpr int kCount = 3;
  std::vector<std::vector<float>> sums(kCount);
  std::vector<std::vector<int64_t>> gathered(kCount);
  std::vector<std::vector<char>> received(kCount);
  const auto errors = run_processes(kCount, [&](ProcessGroup& g) {
    const int p = g.index();
    EXPECT_EQ(g.count(), kCount);
    received[p] = g.broadcast(p == 0 ? std::vector<char>{'i', 'd', '\0', 'x'} : std::vector<char>{'n', 'o'});
    gathered[p] = g.all_gather(100 + p);
    // Values whose sum depends on the order of addition: 1e8 + 1 - 1e8.
    std::vector<float> v = {p == 0 ? 1e8f : p == 1 ? 1.0f : -1e8f, static_cast<float>(p), 0.5f};
    for (int i = 0; i < 1000; ++i) v.push_back(static_cast<float>(p * 1000 + i) * 1e-3f);
    g.all_reduce_sum(v);
    sums[p] = v;
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (int p = 0; p < kCount; ++p) {
    EXPECT_EQ(received[p], (std::vector<char>{'i', 'd', '\0', 'x'}));
    EXPECT_EQ(gathered[p], (std::vector<int64_t>{100, 101, 102}));
    ASSERT_EQ(sums[p].size(), sums[0].size());
    EXPECT_EQ(std::memcmp(sums[p].data(), sums[0].data(), sums[0].size() * sizeof(float)), 0);
  }
  EXPECT_EQ(sums[0][0], (1e8f + 1.0f) + -1e8f);  // process order, on every process
  EXPECT_EQ(sums[0][1], 3.0f);
  EXPECT_EQ(sums[0][2], 1.5f);
}

TEST(ProcessGroup, OneProcessIsAGroupOfItsOwn) {
  std::unique_ptr<ProcessGroup> g = ProcessGroup::join("127.0.0.1:0", 0, 1, 1s);
  std::vector<float> v = {1.5f, -2.0f};
  g->all_reduce_sum(v);
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(g->all_gather(7), (std::vector<int64_t>{7}));
}

TEST(ProcessGroup, MismatchedLengthsFailOnEveryProcess) {
  const auto errors = run_processes(3, [](ProcessGroup& g) {
    std::vector<float> v(g.index() == 2 ? 5 : 4, 1.0f);
    g.all_reduce_sum(v);
  });
  EXPECT_THAT(errors[0], HasSubstr("4 values on process 0, 5 on process 2"));
  EXPECT_THAT(errors[1], HasSubstr("lengths differ"));
  EXPECT_THAT(errors[2], HasSubstr("lengths differ"));
}

TEST(ProcessGroup, AProcessThatLeavesEndsTheOthersCollectivesWithAnError) {
  const auto errors = run_processes(3, [](ProcessGroup& g) {
    if (g.index() == 1) throw Error("process 1 failed while loading");
    std::vector<float> v(8, 1.0f);
    g.all_reduce_sum(v);  // process 1's socket closes when its group is destroyed
  });
  EXPECT_EQ(errors[1], "process 1 failed while loading");
  EXPECT_THAT(errors[0], HasSubstr("a peer process stopped"));
  // Process 2 learns it from process 0, whose failure closes its sockets in turn.
  EXPECT_THAT(errors[2], HasSubstr("a peer process stopped"));
}

TEST(ProcessGroup, DepartedNamesTheProcessWhoseConnectionClosed) {
  std::promise<void> checked;
  const std::shared_future<void> ready = checked.get_future().share();
  int before = 0, after = 0, seen_by_1 = 0;
  const auto errors = run_processes(3, [&](ProcessGroup& g) {
    if (g.index() == 0) {
      before = g.departed(50ms);  // everyone is still there
      checked.set_value();
      after = g.departed(10s);  // process 2 leaves; process 0 then leaves too
    } else {
      ready.wait();
      if (g.index() == 1) seen_by_1 = g.departed(10s);
    }
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(before, -1);
  EXPECT_EQ(after, 2);
  EXPECT_EQ(seen_by_1, 0);
}

// Process 0 of `count` accepts on a free port while `others(address)` joins there; its error ("" when
// none).
std::string head_error_while(int count, const std::function<void(const std::string& address)>& others) {
  std::unique_ptr<ProcessGroup> head = ProcessGroup::listen("127.0.0.1:0", count);
  std::string error;
  std::thread head_thread([&] { error = error_of([&] { head->accept_all(10s); }); });
  others("127.0.0.1:" + std::to_string(head->port()));
  head_thread.join();
  return error;
}

TEST(ProcessGroup, JoiningErrorsNameWhatIsWrong) {
  // A process index given twice is refused on both sides.
  std::string second_error;
  std::string head_error = head_error_while(3, [&](const std::string& address) {
    std::unique_ptr<ProcessGroup> first = ProcessGroup::join(address, 1, 3, 10s);
    second_error = error_of([&] { (void)ProcessGroup::join(address, 1, 3, 10s); });
  });
  EXPECT_THAT(head_error, HasSubstr("--tp-process 1 joined twice"));
  EXPECT_THAT(second_error, HasSubstr("refused process 1: --tp-process 1 joined twice"));
  // A different --tp-processes is refused.
  std::string other_error;
  head_error = head_error_while(2, [&](const std::string& address) {
    other_error = error_of([&] { (void)ProcessGroup::join(address, 1, 4, 10s); });
  });
  EXPECT_THAT(head_error, HasSubstr("started with --tp-processes 4, process 0 with 2"));
  EXPECT_THAT(other_error, HasSubstr("started with --tp-processes 4, process 0 with 2"));
  // Nobody comes: process 0 names who is missing; a process with nobody to reach gives up.
  EXPECT_THAT([] { (void)ProcessGroup::join("127.0.0.1:0", 0, 3, 300ms); },
              ::testing::ThrowsMessage<Error>(HasSubstr("processes 1, 2 did not join within")));
  std::unique_ptr<ProcessGroup> closed = ProcessGroup::listen("127.0.0.1:0", 2);
  const std::string nowhere = "127.0.0.1:" + std::to_string(closed->port());
  closed.reset();  // the port is free again: nothing listens there
  EXPECT_THAT([&] { (void)ProcessGroup::join(nowhere, 1, 2, 500ms); },
              ::testing::ThrowsMessage<Error>(HasSubstr("could not reach process 0 at " + nowhere)));
  EXPECT_THAT([] { (void)ProcessGroup::join("localhost", 1, 2, 100ms); },
              ::testing::ThrowsMessage<Error>(HasSubstr("expected HOST:PORT")));
  EXPECT_THAT([] { (void)ProcessGroup::join("127.0.0.1:1", 2, 2, 100ms); },
              ::testing::ThrowsMessage<Error>(HasSubstr("--tp-process 2: expected 0..1")));
}

// Two processes of one ref rank each: the forward of the group equals one Model's.
TEST(ProcessGroup, TensorParallelModelOverProcessesMatchesOneModel) {
  const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / "qwen3_5");
  const std::unique_ptr<Ops> ops = make_ref_ops();
  models::Model one(checkpoint, *ops);
  ModelCache single_cache = one.cache_for(64);
  SequenceCache a = single_cache.sequence(0);
  std::vector<std::vector<float>> want;
  const std::vector<std::vector<int32_t>> steps = {{3, 1, 4, 1, 5}, {9}, {2}};
  for (const auto& step : steps) {
    models::Batch batch;
    batch.sequences.push_back({step, &a, false});
    const Tensor logits = to_host(*ops, one.forward(batch, single_cache));
    want.emplace_back(logits.ptr<float>(), logits.ptr<float>() + logits.numel());
  }
  const int64_t V = checkpoint.config.text.vocab_size;
  std::vector<std::vector<double>> errors(2);
  std::unique_ptr<ProcessGroup> head = ProcessGroup::listen("127.0.0.1:0", 2);
  const std::string address = "127.0.0.1:" + std::to_string(head->port());
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int p = 0; p < 2; ++p) {
    threads.emplace_back([&, p] {
      try {
        models::Placement placement;
        placement.first_rank = p;
        placement.size = 2;
        if (p == 0) {
          head->accept_all(20s);
          placement.processes = std::move(head);
        } else {
          placement.processes = ProcessGroup::join(address, 1, 2, 20s);
        }
        std::vector<std::unique_ptr<Ops>> rank_ops;
        rank_ops.push_back(make_ref_ops());
        models::TensorParallelModel group(checkpoint, std::move(rank_ops), {}, std::move(placement));
        EXPECT_EQ(group.cache_shape().kv_heads, one.cache_shape().kv_heads / 2);
        ModelCache cache = group.cache_for(64, 1);
        SequenceCache b = cache.sequence(0);
        for (size_t i = 0; i < steps.size(); ++i) {
          models::Batch batch;
          batch.sequences.push_back({steps[i], &b, false});
          const Tensor got = to_host(group.ops(), group.forward(batch, cache));
          errors[static_cast<size_t>(p)].push_back(golden::compare(got.ptr<float>(), want[i], V).relative_rms);
        }
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(p)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, (std::vector<std::string>{"", ""}));
  for (const auto& per_process : errors) {
    ASSERT_EQ(per_process.size(), steps.size());
    for (double e : per_process) EXPECT_LE(e, 1e-5);
  }
}

TEST(ProcessGroup, HostRanksAcrossProcessesAreOnePerProcess) {
  const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / "qwen3");
  models::Placement placement;
  placement.size = 2;
  placement.processes = ProcessGroup::listen("127.0.0.1:0", 2);
  std::vector<std::unique_ptr<Ops>> ops;
  ops.push_back(make_ref_ops());
  ops.push_back(make_ref_ops());
  EXPECT_THAT([&] { models::TensorParallelModel group(checkpoint, std::move(ops), {}, std::move(placement)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("host ranks across processes take one rank per process")));
}

}  // namespace
TEST(ProcessGroup, AGroupWhosePeerIsGoneFailsItsNextForwardNamingIt) {
  const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / "qwen3");
  std::unique_ptr<ProcessGroup> head = ProcessGroup::listen("127.0.0.1:0", 2);
  const std::string address = "127.0.0.1:" + std::to_string(head->port());
  std::string error;
  std::thread leaver([&] {
    models::Placement placement{1, 2, ProcessGroup::join(address, 1, 2, 20s)};
    std::vector<std::unique_ptr<Ops>> rank_ops;
    rank_ops.push_back(make_ref_ops());
    models::TensorParallelModel group(checkpoint, std::move(rank_ops), {}, std::move(placement));
  });  // loads its ranks and leaves
  head->accept_all(20s);
  models::Placement placement{0, 2, std::move(head)};
  std::vector<std::unique_ptr<Ops>> rank_ops;
  rank_ops.push_back(make_ref_ops());
  models::TensorParallelModel group(checkpoint, std::move(rank_ops), {}, std::move(placement));
  leaver.join();
  std::this_thread::sleep_for(6s);  // past the watch's grace period
  ModelCache cache = group.cache_for(64, 1);
  SequenceCache a = cache.sequence(0);
  models::Batch batch;
  batch.sequences.push_back({{3, 1, 4}, &a, false});
  error = error_of([&] { (void)group.forward(batch, cache); });
  EXPECT_THAT(error, HasSubstr("process 1 of the group is gone"));
}

}  // namespace qinfer::parallel
