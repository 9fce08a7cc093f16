// The engine on a tensor-parallel group (models::TensorParallelModel, two ranks as threads): generate
// and the scheduler give the tokens of one Model on the golden fixtures qwen3 (attention) and qwen3_5
// (Gated DeltaNet state slots, snapshotted for n > 1), with preemption, on the ref and cpu backends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "io/json.h"
#include "models/tensor_parallel.h"
#include "engine_support.h"

namespace qinfer::engine {
namespace {

using testing::kGolden;
using testing::make_prompt;
using testing::Recorder;
using testing::run_alone;
using testing::test_tokenizer;

std::unique_ptr<Ops> backend(const std::string& name) {
  return name == "ref" ? make_ref_ops() : make_cpu_ops(global_thread_pool());
}

std::unique_ptr<models::TensorParallelModel> two_ranks(const models::Checkpoint& checkpoint, const std::string& name) {
  std::vector<std::unique_ptr<Ops>> ops;
  for (int r = 0; r < 2; ++r) ops.push_back(backend(name));
  return std::make_unique<models::TensorParallelModel>(checkpoint, std::move(ops));
}

RequestParams request(std::vector<int32_t> prompt, int32_t max_tokens, float temperature, uint64_t seed, int32_t n) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = temperature;
  p.sampling.top_p = 0.9f;
  p.sampling.seed = seed;
  p.n = n;
  return p;
}

struct Case {
  std::string fixture, backend;
};

class TensorParallelEngine : public ::testing::TestWithParam<Case> {};

// The fixture's reference prompts and two of other lengths, greedily, through engine::generate.
TEST_P(TensorParallelEngine, GenerateGivesTheTokensOfOneModel) {
  const models::Checkpoint checkpoint = models::open_checkpoint(kGolden / GetParam().fixture);
  const std::unique_ptr<Ops> ops = backend(GetParam().backend);
  models::Model one(checkpoint, *ops);
  const auto group = two_ranks(checkpoint, GetParam().backend);
  auto prompts = io::read_json_file(kGolden / GetParam().fixture / "reference.json")["prompts"]
                     .get<std::vector<std::vector<int32_t>>>();
  prompts.push_back(make_prompt(1, 5));
  prompts.push_back(make_prompt(37, 6));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestParams p = request(prompts[i], 16, 0.0f, 0, 1);
    const testing::Single want = run_alone(one, p), got = run_alone(*group, p);
    EXPECT_EQ(got.tokens, want.tokens) << "prompt " << i;
    EXPECT_EQ(got.text, want.text) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, TensorParallelEngine,
                         ::testing::Values(Case{"qwen3", "ref"}, Case{"qwen3", "cpu"}, Case{"qwen3_5", "ref"},
                                           Case{"qwen3_5", "cpu"}),
                         [](const auto& info) { return info.param.fixture + "_" + info.param.backend; });

// Every choice of every request, as the scheduler over `model` produced it; checks it had to preempt.
std::vector<std::vector<std::vector<int32_t>>> schedule(models::Runner& model,
                                                        const std::vector<RequestParams>& requests) {
  // 16 blocks of 4 tokens for 7 concurrent sequences of up to ~45 tokens: preemption is certain.
  Engine s(model, test_tokenizer(),
              {.kv_blocks = 16, .block_size = 4, .max_running = 7, .step_token_budget = 12, .max_context = 64});
  Recorder rec(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_TRUE(s.submit(requests[i], rec.sink(i, requests[i].n)));
  EXPECT_TRUE(rec.wait());
  std::vector<std::vector<std::vector<int32_t>>> tokens;
  for (size_t i = 0; i < requests.size(); ++i) {
    tokens.push_back(rec[i].tokens);
    for (size_t c = 0; c < rec[i].finished.size(); ++c)
      EXPECT_EQ(rec[i].finished[c].finish_reason, "length") << "request " << i << " choice " << c << ": "
                                                            << rec[i].finished[c].error;
  }
  const EngineStats st = s.stats();
  EXPECT_GT(st.preemptions_total, 0);
  EXPECT_EQ(st.kv_blocks_used, 0) << "KV blocks leaked";
  EXPECT_EQ(st.state_slots_used, 0) << "state slots leaked";
  return tokens;
}

class TensorParallelEngineServing : public ::testing::TestWithParam<std::string> {};

// Concurrent greedy and sampled requests, n = 3 branching off a shared prompt (a copied recurrent
// state on qwen3_5), and a pool too small for them all.
TEST_P(TensorParallelEngineServing, GivesTheTokensOfOneModel) {
  const models::Checkpoint checkpoint = models::open_checkpoint(kGolden / GetParam());
  const std::unique_ptr<Ops> ops = backend("cpu");
  models::Model one(checkpoint, *ops);
  const auto group = two_ranks(checkpoint, "cpu");
  const std::vector<RequestParams> requests = {
      request(make_prompt(23, 1), 14, 0.8f, 7, 3), request(make_prompt(30, 2), 14, 0.0f, 0, 1),
      request(make_prompt(9, 3), 14, 0.8f, 9, 1), request(make_prompt(17, 4), 14, 0.0f, 0, 2)};
  const auto want = schedule(one, requests);
  const auto got = schedule(*group, requests);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (size_t c = 0; c < want[i].size(); ++c) {
      EXPECT_EQ(got[i][c].size(), 14u);
      EXPECT_EQ(got[i][c], want[i][c]) << "request " << i << " choice " << c;
    }
  }
}

// Runs `body` on a group of two processes (played by threads, joined over a real socket), one cpu rank
// each: process 0 leads and runs `body` on its group; process 1 follows until that group is destroyed.
// Returns process 1's error, if it had one.
std::string over_two_processes(const models::Checkpoint& checkpoint,
                               const std::function<void(models::TensorParallelModel&)>& body) {
  std::unique_ptr<parallel::ProcessGroup> head = parallel::ProcessGroup::listen("127.0.0.1:0", 2);
  const std::string address = "127.0.0.1:" + std::to_string(head->port());
  std::string follower_error;
  std::thread follower([&] {
    try {
      models::Placement placement;
      placement.first_rank = 1;
      placement.size = 2;
      placement.processes = parallel::ProcessGroup::join(address, 1, 2, std::chrono::seconds(20));
      std::vector<std::unique_ptr<Ops>> rank_ops;
      rank_ops.push_back(backend("cpu"));
      models::TensorParallelModel group(checkpoint, std::move(rank_ops), {}, std::move(placement));
      group.follow();
    } catch (const std::exception& e) {
      follower_error = e.what();
    }
  });
  {
    head->accept_all(std::chrono::seconds(20));
    models::Placement placement;
    placement.size = 2;
    placement.processes = std::move(head);
    std::vector<std::unique_ptr<Ops>> rank_ops;
    rank_ops.push_back(backend("cpu"));
    models::TensorParallelModel group(checkpoint, std::move(rank_ops), {}, std::move(placement));
    group.lead();
    body(group);
  }  // process 0's group ends: process 1 stops following
  follower.join();
  return follower_error;
}

// The same over two processes: process 0 runs the scheduler and mirrors its caches (new slots zeroed,
// the n = 3 state snapshots gathered from and restored into process 1's ranks).
TEST_P(TensorParallelEngineServing, OverProcessesGivesTheTokensOfOneModel) {
  const models::Checkpoint checkpoint = models::open_checkpoint(kGolden / GetParam());
  const std::unique_ptr<Ops> ops = backend("cpu");
  models::Model one(checkpoint, *ops);
  const std::vector<RequestParams> requests = {
      request(make_prompt(23, 1), 14, 0.8f, 7, 3), request(make_prompt(30, 2), 14, 0.0f, 0, 1),
      request(make_prompt(9, 3), 14, 0.8f, 9, 1), request(make_prompt(17, 4), 14, 0.0f, 0, 2)};
  const auto want = schedule(one, requests);
  std::vector<std::vector<std::vector<int32_t>>> got;
  EXPECT_EQ(over_two_processes(checkpoint, [&](models::TensorParallelModel& group) { got = schedule(group, requests); }),
            "");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (size_t c = 0; c < want[i].size(); ++c) EXPECT_EQ(got[i][c], want[i][c]) << "request " << i << " choice " << c;
  }
}

// Requests one after another, each finding the earlier ones' blocks (and, on qwen3_5, checkpoints of
// the recurrent state): (tokens, cached prompt tokens) of each.
std::vector<std::pair<std::vector<int32_t>, int32_t>> in_turn(
    models::Runner& model, const std::vector<RequestParams>& requests,
    const EngineOptions& options = {.block_size = 4, .max_running = 4, .max_context = 128}) {
  Engine s(model, test_tokenizer(), options);
  std::vector<std::pair<std::vector<int32_t>, int32_t>> out;
  for (const RequestParams& r : requests) {
    Recorder rec(1);
    EXPECT_TRUE(s.submit(r, rec.sink(0)));
    EXPECT_TRUE(rec.wait());
    out.push_back({rec[0].tokens[0], rec[0].finished[0].cached_prompt_tokens});
  }
  EXPECT_EQ(s.stats().kv_blocks_used, 0);
  EXPECT_EQ(s.stats().state_slots_used, 0);
  return out;
}

// The prefix cache on a group (two ranks as threads, and two processes): every rank's blocks and
// state checkpoints (kept inside a prefill chunk, left behind by a step from a block boundary, a
// finished sequence's live state) serve the same hits as one model's, with the same tokens. A prompt
// that extends an earlier one, one that shares a prefix with it, the first again, and a conversation's
// next turn.
TEST_P(TensorParallelEngineServing, PrefixCacheGivesTheHitsAndTokensOfOneModel) {
  const models::Checkpoint checkpoint = models::open_checkpoint(kGolden / GetParam());
  const std::unique_ptr<Ops> ops = backend("cpu");
  models::Model one(checkpoint, *ops);
  const std::vector<int32_t> a = make_prompt(30, 500);
  std::vector<int32_t> b = a, c(a.begin(), a.begin() + 17);
  for (int32_t t : make_prompt(9, 600)) b.push_back(t);
  for (int32_t t : make_prompt(6, 700)) c.push_back(t);
  std::vector<RequestParams> requests = {request(a, 13, 0.0f, 0, 1), request(b, 8, 0.0f, 0, 1),
                                         request(c, 8, 0.0f, 0, 1), request(b, 8, 0.8f, 3, 1)};
  // The next turn of a's conversation: a, its reply, a new message.
  std::vector<int32_t> turn = a;
  for (int32_t t : run_alone(one, requests[0]).tokens) turn.push_back(t);
  for (int32_t t : make_prompt(5, 900)) turn.push_back(t);
  requests.push_back(request(turn, 8, 0.0f, 0, 1));

  const auto want = in_turn(one, requests);
  int32_t reused = 0;
  for (const auto& [tokens, cached] : want) reused += cached;
  EXPECT_GT(want[3].second, 0) << "b again";
  EXPECT_GE(want[4].second, 40) << "the conversation's next turn";
  using Outcomes = std::vector<std::pair<std::vector<int32_t>, int32_t>>;
  const Outcomes threads = in_turn(*two_ranks(checkpoint, "cpu"), requests);
  Outcomes processes;
  EXPECT_EQ(over_two_processes(checkpoint, [&](models::TensorParallelModel& g) { processes = in_turn(g, requests); }),
            "");
  for (const Outcomes* got : std::initializer_list<const Outcomes*>{&threads, &processes}) {
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ((*got)[i].first, want[i].first) << "request " << i << (got == &threads ? " (threads)" : " (processes)");
      EXPECT_EQ((*got)[i].second, want[i].second) << "request " << i;
    }
  }
  EXPECT_GT(reused, 0);
}

// The host tier on a group of two ranks as threads: each rank's blocks (and checkpoints) go out and
// come back, giving one model's tokens and hits; a group over processes refuses the tier (its other
// processes' rows are out of reach) with a clear error.
TEST_P(TensorParallelEngineServing, HostTierGivesTheTokensOfOneModel) {
  const models::Checkpoint checkpoint = models::open_checkpoint(kGolden / GetParam());
  const std::unique_ptr<Ops> ops = backend("cpu");
  models::Model one(checkpoint, *ops);
  const EngineOptions options{.kv_blocks = 24, .block_size = 4, .max_running = 2, .max_context = 96,
                              .host_cache_gb = 0.002};
  std::vector<RequestParams> requests = {request(make_prompt(41, 21), 4, 0.0f, 0, 1)};
  for (uint32_t i = 1; i <= 3; ++i) requests.push_back(request(make_prompt(41, 100 + i), 4, 0.0f, 0, 1));
  requests.push_back(requests[0]);
  const auto want = in_turn(one, requests, options);
  EXPECT_EQ(want.back().second, 40) << "the first prompt again, from the host (the device pool holds 24 blocks)";
  EXPECT_EQ(want.back().first, want.front().first);
  EXPECT_EQ(in_turn(*two_ranks(checkpoint, "cpu"), requests, options), want);
  std::string refused;
  EXPECT_EQ(over_two_processes(checkpoint,
                               [&](models::TensorParallelModel& g) {
                                 try {
                                   Engine s(g, test_tokenizer(), options);
                                 } catch (const Error& e) {
                                   refused = e.what();
                                 }
                               }),
            "");
  EXPECT_THAT(refused, ::testing::HasSubstr("host tier is not available to a tensor-parallel group over processes"));
}

INSTANTIATE_TEST_SUITE_P(Golden, TensorParallelEngineServing, ::testing::Values("qwen3", "qwen3_5"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace qinfer::engine
