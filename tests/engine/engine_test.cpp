// The engine (continuous batching) against single-sequence runs (engine::generate) on the golden
// fixtures: qwen3 (attention only) and qwen3_5 (Gated DeltaNet state slots + attention).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "core/error.h"
#include "io/json.h"
#include "models/eval.h"
#include "engine_support.h"

namespace qinfer::engine {
namespace {

using testing::fixture_model;
using testing::make_prompt;
using testing::Recorder;
using testing::run_alone;
using testing::test_tokenizer;
using ::testing::HasSubstr;

RequestParams greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  return p;
}

RequestParams sampled(std::vector<int32_t> prompt, int32_t max_tokens, uint64_t seed) {
  RequestParams p = greedy(std::move(prompt), max_tokens);
  p.sampling.temperature = 0.8f;
  p.sampling.top_p = 0.9f;
  p.sampling.seed = seed;
  return p;
}

std::vector<std::vector<int32_t>> reference_prompts(const std::string& fixture) {
  return io::read_json_file(testing::kGolden / fixture / "reference.json")["prompts"]
      .get<std::vector<std::vector<int32_t>>>();
}

// After the last finished event: a choice that a stop string or its sink ended on the output thread
// is freed by the model thread within a step, so the counts may take that long to settle.
void expect_all_free(const Engine& s) {
  EngineStats st = s.stats();
  for (int i = 0; i < 200 && (st.running || st.waiting || st.kv_blocks_used || st.state_slots_used); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    st = s.stats();
  }
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0) << "KV blocks leaked";
  EXPECT_EQ(st.state_slots_used, 0) << "state slots leaked";
}

class EngineFixture : public ::testing::TestWithParam<std::string> {
 protected:
  models::Model& model() { return fixture_model(GetParam()); }
  bool recurrent() { return model().cache_shape().linear_layers > 0; }
};

// Several prompts of different lengths, submitted at once with a small step budget (prefill chunks
// interleave with decodes; blocks of 4 tokens cross often), give each prompt's greedy tokens run alone,
// and the HF reference's greedy tokens for the fixture's prompts.
TEST_P(EngineFixture, BatchedGreedyEqualsSingleRuns) {
  models::Model& m = model();
  std::vector<RequestParams> requests;
  for (const auto& p : reference_prompts(GetParam())) requests.push_back(greedy(p, 12));
  for (int32_t len : {1, 17, 40, 5}) requests.push_back(greedy(make_prompt(len, static_cast<uint32_t>(len)), 12));
  std::vector<testing::Single> alone;
  for (const auto& r : requests) alone.push_back(run_alone(m, r));
  const auto hf_greedy = io::read_json_file(testing::kGolden / GetParam() / "reference.json")["greedy"]
                             .get<std::vector<std::vector<int32_t>>>();

  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 8, .step_token_budget = 24, .max_context = 256});
  EXPECT_EQ(s.options().kv_blocks, 8 * 64);
  Recorder rec(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_TRUE(s.submit(requests[i], rec.sink(i)));
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < requests.size(); ++i) {
    const testing::Outcome& o = rec[i];
    EXPECT_EQ(o.tokens[0], alone[i].tokens) << "request " << i;
    if (i < hf_greedy.size()) {
      EXPECT_EQ(o.tokens[0], hf_greedy[i]) << "request " << i << " vs HF";
    }
    EXPECT_EQ(o.text[0], alone[i].text) << "request " << i;
    EXPECT_EQ(o.text[0], test_tokenizer().decode(o.tokens[0])) << "request " << i;
    EXPECT_EQ(o.finished_events[0], 1);
    EXPECT_EQ(o.events_after_finish, 0);
    EXPECT_EQ(o.finished[0].finish_reason, "length");
    EXPECT_EQ(o.finished[0].prompt_tokens, static_cast<int64_t>(requests[i].prompt.size()));
    EXPECT_EQ(o.finished[0].cached_prompt_tokens, 0);
    EXPECT_EQ(o.finished[0].completion_tokens, 12);
  }
  const EngineStats st = s.stats();
  expect_all_free(s);
  EXPECT_EQ(st.completion_tokens_total, 12 * static_cast<int64_t>(requests.size()));
  int64_t prompt_total = 0;
  for (const auto& r : requests) prompt_total += static_cast<int64_t>(r.prompt.size());
  EXPECT_EQ(st.prompt_tokens_total, prompt_total);
  EXPECT_EQ(st.preemptions_total, 0);
  EXPECT_EQ(st.state_slots_total, recurrent() ? 8 : 0);
}

// A pool far too small for the load: sequences are preempted (recompute) and still produce exactly the
// tokens and text of unconstrained runs, seeded sampling with penalties included; afterwards every
// block and slot is free.
TEST_P(EngineFixture, PreemptionRecomputesIdentically) {
  models::Model& m = model();
  std::vector<RequestParams> requests;
  for (int i = 0; i < 6; ++i) {
    RequestParams p = i % 2 ? sampled(make_prompt(14 + 9 * i, 100 + i), 20, 50 + i)
                            : greedy(make_prompt(14 + 9 * i, 100 + i), 20);
    if (i == 3) p.sampling.repetition_penalty = 1.3f, p.sampling.frequency_penalty = 0.5f;
    requests.push_back(p);
  }
  std::vector<testing::Single> alone;
  for (const auto& r : requests) alone.push_back(run_alone(m, r));

  // 20 blocks of 4 tokens: the longest request alone needs 15.
  Engine s(m, test_tokenizer(),
              {.kv_blocks = 20, .block_size = 4, .max_running = 6, .step_token_budget = 16, .max_context = 256});
  Recorder rec(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_TRUE(s.submit(requests[i], rec.sink(i)));
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(rec[i].tokens[0], alone[i].tokens) << "request " << i;
    EXPECT_EQ(rec[i].text[0], alone[i].text) << "request " << i;
    EXPECT_EQ(rec[i].finished_events[0], 1);
    EXPECT_EQ(rec[i].finished[0].finish_reason, "length");
    EXPECT_EQ(rec[i].finished[0].completion_tokens, 20);
  }
  EXPECT_GT(s.stats().preemptions_total, 0);
  EXPECT_EQ(s.stats().completion_tokens_total, 6 * 20);
  expect_all_free(s);
}

// n = 3 from one prompt: choice i equals a single run with seed + i. Choices 1 and 2 share the
// prompt's whole blocks (20 of its 23 tokens) and each prefills the 3-token tail into a block of its
// own; a prompt shorter than a block shares nothing.
TEST_P(EngineFixture, ChoicesShareThePromptAndMatchSeededSingleRuns) {
  models::Model& m = model();
  RequestParams p = sampled(make_prompt(23, 7), 10, 7);
  p.n = 3;
  RequestParams short_prompt = sampled(make_prompt(3, 8), 10, 90);
  short_prompt.n = 2;
  std::vector<testing::Single> alone, alone_short;
  for (int32_t c = 0; c < 3; ++c) alone.push_back(run_alone(m, p, c));
  for (int32_t c = 0; c < 2; ++c) alone_short.push_back(run_alone(m, short_prompt, c));

  Recorder rec(2);
  int64_t most_blocks = 0;
  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 8, .max_context = 64});
  ASSERT_TRUE(s.submit(p, rec.sink(0, 3, [&](const Event&) {
    most_blocks = std::max(most_blocks, s.stats().kv_blocks_used);
  })));
  ASSERT_TRUE(rec.wait());
  // 23 + 10 tokens, the last never cached: at most 5 shared blocks + 4 of each choice's own (not 3 × 9).
  EXPECT_GE(most_blocks, 8);
  EXPECT_LE(most_blocks, 5 + 3 * 4);
  ASSERT_TRUE(s.submit(short_prompt, rec.sink(1, 2)));
  ASSERT_TRUE(rec.wait());
  for (int32_t c = 0; c < 3; ++c) {
    EXPECT_EQ(rec[0].tokens[c], alone[c].tokens) << "choice " << c;
    EXPECT_EQ(rec[0].text[c], alone[c].text) << "choice " << c;
    EXPECT_EQ(rec[0].finished_events[c], 1);
    EXPECT_EQ(rec[0].finished[c].prompt_tokens, 23);
    EXPECT_EQ(rec[0].finished[c].cached_prompt_tokens, c == 0 ? 0 : 20);
    EXPECT_EQ(rec[0].finished[c].completion_tokens, 10);
  }
  EXPECT_NE(rec[0].tokens[0], rec[0].tokens[1]) << "the choices should differ (seeds differ)";
  for (int32_t c = 0; c < 2; ++c) {
    EXPECT_EQ(rec[1].tokens[c], alone_short[c].tokens) << "short prompt, choice " << c;
    EXPECT_EQ(rec[1].finished[c].cached_prompt_tokens, 0);
  }
  EXPECT_EQ(s.stats().prompt_tokens_total, 23 + 3);
  expect_all_free(s);
}

// A busy batch with n > 1 and a small pool: shared blocks survive the preemption of one of their
// sharers, and every choice still matches its single run.
TEST_P(EngineFixture, SharedPrefixSurvivesPreemption) {
  models::Model& m = model();
  std::vector<RequestParams> requests;
  for (int i = 0; i < 3; ++i) {
    RequestParams p = sampled(make_prompt(18 + 5 * i, 300 + i), 14, 11 * i);
    p.n = 2;
    requests.push_back(p);
  }
  std::vector<std::vector<testing::Single>> alone(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    for (int32_t c = 0; c < 2; ++c) alone[i].push_back(run_alone(m, requests[i], c));
  Engine s(m, test_tokenizer(),
              {.kv_blocks = 16, .block_size = 4, .max_running = 6, .step_token_budget = 12, .max_context = 64});
  Recorder rec(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_TRUE(s.submit(requests[i], rec.sink(i, 2)));
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < requests.size(); ++i)
    for (int32_t c = 0; c < 2; ++c) {
      EXPECT_EQ(rec[i].tokens[c], alone[i][c].tokens) << "request " << i << " choice " << c;
      EXPECT_EQ(rec[i].finished_events[c], 1);
    }
  EXPECT_GT(s.stats().preemptions_total, 0);
  expect_all_free(s);
}

// The prefix cache: a request that shares whole blocks with an earlier one (its prompt, or a prompt
// and part of what it generated) starts from them, reports them as cached and gives the tokens of a
// cold run; finished requests leave their blocks cached but free. qwen3_5 keeps recurrent state: it
// starts only from a checkpoint of it, and c, which leaves a's path where a kept none, computes its
// prompt whole but keeps one at that junction, which d then starts from. With the cache off nothing
// is reused.
TEST_P(EngineFixture, PrefixCacheReusesWholeSharedBlocks) {
  models::Model& m = model();
  const std::vector<int32_t> a = make_prompt(30, 500);
  std::vector<int32_t> b = a, c(a.begin(), a.begin() + 17), d(a.begin(), a.begin() + 18);
  for (int32_t t : make_prompt(9, 600)) b.push_back(t);
  for (int32_t t : make_prompt(6, 700)) c.push_back(t);
  for (int32_t t : make_prompt(7, 800)) d.push_back(t);
  const std::vector<RequestParams> requests = {greedy(a, 8), greedy(b, 8), greedy(c, 8), greedy(b, 8), greedy(d, 8)};
  std::vector<testing::Single> alone;
  for (const auto& r : requests) alone.push_back(run_alone(m, r));
  for (const bool caching : {true, false}) {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 128, .prefix_caching = caching});
    Recorder rec(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {  // one after another: each finds the last ones' blocks
      ASSERT_TRUE(s.submit(requests[i], rec.sink(i)));
      ASSERT_TRUE(rec.wait());
    }
    // b: a's 7 whole prompt blocks (its 8th mixes a's prompt with what a generated); c: the 4 whole
    // blocks of its 17 tokens of a; b again: all but its last token's block (9 of 39 tokens' 10); d:
    // the 4 whole blocks of its 18 tokens of a.
    const std::vector<int32_t> cached =
        !caching ? std::vector<int32_t>(5, 0) : recurrent() ? std::vector{0, 28, 0, 36, 16} : std::vector{0, 28, 16, 36, 16};
    int32_t reused = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(rec[i].tokens[0], alone[i].tokens) << "request " << i << (caching ? "" : " (cache off)");
      EXPECT_EQ(rec[i].finished[0].cached_prompt_tokens, cached[i]) << "request " << i;
      reused += cached[i];
    }
    const EngineStats st = s.stats();
    EXPECT_EQ(st.prefix_reused_tokens_total, reused);
    EXPECT_EQ(st.prefix_hits_total, caching ? 4 - recurrent() : 0);
    EXPECT_EQ(st.kv_blocks_cached > 0, caching);
    EXPECT_EQ(st.state_checkpoints_cached > 0, caching && recurrent());
    expect_all_free(s);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, EngineFixture, ::testing::Values("qwen3", "qwen3_5"));

// Seeded sampling (temperature 0.8, top_p 0.9, with and without penalties, top_k, min_p) gives the same
// tokens alone and inside a busy batch.
TEST(Engine, SeededSamplingIgnoresTheBatch) {
  models::Model& m = fixture_model("qwen3_5");
  std::vector<RequestParams> requests;
  for (int i = 0; i < 8; ++i) {
    RequestParams p = sampled(make_prompt(5 + 7 * i, 200 + i), 16, 1234 + i);
    if (i == 1) p.sampling.presence_penalty = 0.7f;
    if (i == 2) p.sampling.top_k = 20;
    if (i == 3) p.sampling.min_p = 0.05f;
    if (i == 4) p.sampling.temperature = 1.3f;
    requests.push_back(p);
  }
  std::vector<testing::Single> alone;
  for (const auto& r : requests) alone.push_back(run_alone(m, r));
  Engine s(m, test_tokenizer(), {.block_size = 8, .max_running = 8, .step_token_budget = 40, .max_context = 128});
  // Alone in the scheduler first, then all at once.
  Recorder solo(1);
  ASSERT_TRUE(s.submit(requests[0], solo.sink(0)));
  ASSERT_TRUE(solo.wait());
  EXPECT_EQ(solo[0].tokens[0], alone[0].tokens);
  Recorder rec(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_TRUE(s.submit(requests[i], rec.sink(i)));
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(rec[i].tokens[0], alone[i].tokens) << "request " << i;
  expect_all_free(s);
}

// 12 concurrent requests; a third are cancelled mid-stream, two from their own sink and two from
// another thread (one of them with n = 2). No delta follows a cancel, each choice gets exactly one
// finished event, the others complete, and every block and slot is free afterwards.
TEST(Engine, CancellationFreesEverything) {
  models::Model& m = fixture_model("qwen3_5");
  constexpr int kRequests = 12, kMaxTokens = 40;
  Recorder rec(kRequests);
  std::atomic<uint64_t> ids[kRequests] = {};
  std::atomic<bool> cancel_issued[kRequests] = {};
  std::atomic<int> deltas_after_cancel{0};
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> want_cancel;  // requests whose sink waits for the other thread's cancel
  bool released[kRequests] = {};
  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 16, .max_context = 128});

  for (int i = 0; i < kRequests; ++i) {
    RequestParams p = greedy(make_prompt(6 + i, 500 + i), kMaxTokens);
    const bool from_sink = i == 0 || i == 6, from_thread = i == 3 || i == 9;
    if (i == 9) p.n = 2;
    auto deltas = std::make_shared<int>(0);
    // Counts the last choice's deltas: the cancel then comes after this step's events for every choice.
    auto hook = [&, i, from_sink, from_thread, deltas, last = p.n - 1](const Event& e) {
      if (e.kind != Event::Kind::delta) return;
      if (cancel_issued[i]) ++deltas_after_cancel;
      if (e.choice != last || ++*deltas != 3) return;
      if (from_sink) {
        while (ids[i] == 0) std::this_thread::yield();  // submit() may not have returned yet
        s.cancel(ids[i]);
        cancel_issued[i] = true;
      } else if (from_thread) {
        std::unique_lock lock(mu);
        want_cancel.push_back(i);
        cv.notify_all();
        cv.wait(lock, [&] { return released[i]; });
      }
    };
    auto id = s.submit(p, rec.sink(i, p.n, hook));
    ASSERT_TRUE(id);
    ids[i] = *id;
  }
  std::thread canceller([&] {
    for (int done = 0; done < 2; ++done) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !want_cancel.empty(); });
      const int i = want_cancel.back();
      want_cancel.pop_back();
      while (ids[i] == 0) std::this_thread::yield();
      s.cancel(ids[i]);
      cancel_issued[i] = true;
      released[i] = true;
      cv.notify_all();
    }
  });
  ASSERT_TRUE(rec.wait());
  canceller.join();
  for (int i = 0; i < kRequests; ++i) {
    const bool cancelled = i % 3 == 0;
    for (size_t c = 0; c < rec[i].finished.size(); ++c) {
      EXPECT_EQ(rec[i].finished_events[c], 1) << "request " << i;
      EXPECT_EQ(rec[i].finished[c].finish_reason, cancelled ? "cancelled" : "length") << "request " << i;
      if (!cancelled) {
        EXPECT_EQ(rec[i].tokens[c].size(), size_t{kMaxTokens});
      }
    }
    EXPECT_EQ(rec[i].events_after_finish, 0);
  }
  EXPECT_EQ(deltas_after_cancel, 0);
  s.cancel(ids[1]);    // finished: ignored
  s.cancel(123456);    // unknown: ignored
  expect_all_free(s);
}

// The queue refuses beyond max_waiting (the server's 429) while the scheduler is busy; invalid params
// and options throw with a message that names the field.
TEST(Engine, QueueLimitAndInvalidParams) {
  models::Model& m = fixture_model("qwen3");
  std::mutex mu;
  std::condition_variable cv;
  bool blocked = false, release = false;
  Recorder rec(3);
  Engine s(m, test_tokenizer(), {.kv_blocks = 64, .block_size = 4, .max_running = 1, .max_waiting = 2});
  // Request 0's sink holds the output thread at its first token, and the model thread (two steps on)
  // with it, so request 0 keeps the one running place and nothing leaves the queue.
  ASSERT_TRUE(s.submit(greedy({1, 2, 3}, 40), rec.sink(0, 1, [&](const Event& e) {
    if (e.kind != Event::Kind::delta) return;
    std::unique_lock lock(mu);
    if (blocked) return;
    blocked = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  })));
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return blocked; });
  }
  EXPECT_TRUE(s.submit(greedy({4, 5}, 4), rec.sink(1)));
  EXPECT_TRUE(s.submit(greedy({6}, 4), rec.sink(2)));
  EXPECT_FALSE(s.submit(greedy({7}, 4), [](const Event&) { ADD_FAILURE() << "a refused request got an event"; }));
  EXPECT_EQ(s.stats().waiting, 2);
  EXPECT_EQ(s.stats().running, 1);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rec[i].finished[0].finish_reason, "length");

  auto expect_error = [&](RequestParams p, const std::string& what) {
    try {
      s.submit(std::move(p), [](const Event&) {});
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  expect_error(greedy({}, 4), "prompt is empty");
  expect_error(greedy({1, 512}, 4), "outside the vocabulary");
  expect_error(greedy({1, -1}, 4), "outside the vocabulary");
  expect_error(greedy({1}, 0), "max_tokens");
  expect_error(greedy(make_prompt(4096, 1), 1), "context limit");
  RequestParams p = greedy({1}, 4);
  p.n = 0;
  expect_error(p, "n must be");
  p.n = 2;  // max_running is 1
  expect_error(p, "n must be");
  p = greedy({1}, 4);
  p.top_logprobs = 21;
  expect_error(p, "top_logprobs");
  p = greedy({1}, 4);
  p.sampling.temperature = -1;
  expect_error(p, "temperature");
  p.sampling.temperature = NAN;
  expect_error(p, "temperature");
  p = greedy({1}, 4);
  p.sampling.top_p = 0;
  expect_error(p, "top_p");
  p = greedy({1}, 4);
  p.stop = {"x", ""};
  expect_error(p, "stop string is empty");
  // 64 blocks of 4 tokens hold 256: this request could never fit.
  expect_error(greedy(make_prompt(200, 2), 100), "more than the whole cache");
  EXPECT_THROW(s.submit(greedy({1}, 4), nullptr), Error);

  auto bad_options = [&](EngineOptions o, const std::string& what) {
    try {
      Engine bad(m, test_tokenizer(), o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
  };
  bad_options({.max_running = 64, .step_token_budget = 32}, "step_token_budget");
  bad_options({.block_size = 0}, "block_size");
  bad_options({.max_context = 100000}, "max_context");
  expect_all_free(s);
}

// Logprobs are the log-softmax of the raw logits (before penalties and temperature), with the top-N
// alternatives, most likely first: checked against prompt_logits over prompt + generated tokens.
TEST(Engine, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  models::Model& m = fixture_model("qwen3");
  RequestParams p = sampled(make_prompt(9, 42), 8, 5);
  p.sampling.repetition_penalty = 1.5f;
  p.sampling.temperature = 1.7f;
  p.top_logprobs = 5;
  RequestParams none = greedy(make_prompt(9, 43), 3);
  Recorder rec(2);
  {
    Engine s(m, test_tokenizer(), {.max_running = 4, .max_context = 64});
    ASSERT_TRUE(s.submit(p, rec.sink(0)));
    ASSERT_TRUE(s.submit(none, rec.sink(1)));
    ASSERT_TRUE(rec.wait());
  }
  const auto& tokens = rec[0].tokens[0];
  const auto& lps = rec[0].logprobs[0];
  ASSERT_EQ(tokens.size(), 8u);
  ASSERT_EQ(lps.size(), 8u);
  EXPECT_TRUE(rec[1].logprobs[0].empty());
  std::vector<int32_t> context = p.prompt;
  context.insert(context.end(), tokens.begin(), tokens.end() - 1);
  Tensor logits = models::prompt_logits(m, context, {});
  const int64_t V = logits.dim(1);
  for (size_t k = 0; k < tokens.size(); ++k) {
    const float* row = logits.ptr<float>() + (p.prompt.size() - 1 + k) * V;
    double total = 0;
    for (int64_t v = 0; v < V; ++v) total += std::exp(static_cast<double>(row[v]));
    auto direct = [&](int32_t id) { return row[id] - std::log(total); };
    EXPECT_EQ(lps[k].token, tokens[k]);
    EXPECT_NEAR(lps[k].logprob, direct(tokens[k]), 1e-3) << "token " << k;
    ASSERT_EQ(lps[k].top.size(), 5u);
    std::vector<float> sorted(row, row + V);
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_NEAR(lps[k].top[j].second, direct(lps[k].top[j].first), 1e-3) << "token " << k << " top " << j;
      EXPECT_NEAR(lps[k].top[j].second, sorted[j] - std::log(total), 1e-3) << "token " << k << " top " << j;
    }
  }
}

// Prompt logprobs are the log-softmax of the prompt's own logits (prompt_logits), rank included, for
// every prompt token after the first, in each choice's first event: with prefill chunks that cross
// blocks, a cached copy of the prompt (which they do not reuse), n = 2 and a request beside them that
// samples as it would alone. On qwen3 (attention) and qwen3_5 (recurrent state, checkpoints).
TEST_P(EngineFixture, PromptLogprobsAreTheLogSoftmaxOfThePromptLogits) {
  models::Model& m = model();
  const std::vector<int32_t> prompt = make_prompt(45, 9);
  Tensor logits = models::prompt_logits(m, prompt, {});
  const int64_t V = logits.dim(1);
  RequestParams first = greedy(prompt, 2), p = greedy(prompt, 3), beside = sampled(make_prompt(30, 3), 6, 11);
  p.prompt_logprobs = 3;
  p.n = 2;
  Recorder rec(3);
  {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .step_token_budget = 16, .max_context = 128});
    ASSERT_TRUE(s.submit(first, rec.sink(0)));
    ASSERT_TRUE(rec.wait());
    ASSERT_TRUE(s.submit(p, rec.sink(1, 2)));
    ASSERT_TRUE(s.submit(beside, rec.sink(2)));
    ASSERT_TRUE(rec.wait());
    expect_all_free(s);
  }
  EXPECT_TRUE(rec[0].prompt_logprobs[0].empty());
  EXPECT_TRUE(rec[2].prompt_logprobs[0].empty());
  EXPECT_EQ(rec[2].tokens[0], run_alone(m, beside).tokens);
  for (int32_t c = 0; c < 2; ++c) {
    SCOPED_TRACE("choice " + std::to_string(c));
    EXPECT_EQ(rec[1].prompt_logprob_events[c], 1);
    EXPECT_EQ(rec[1].finished[c].cached_prompt_tokens, 0) << "a prompt for its logprobs is computed whole";
    const auto& lps = rec[1].prompt_logprobs[c];
    ASSERT_EQ(lps.size(), prompt.size() - 1);
    for (size_t k = 0; k + 1 < prompt.size(); ++k) {
      const float* row = logits.ptr<float>() + static_cast<int64_t>(k) * V;
      double total = 0;
      int32_t rank = 1;
      for (int64_t v = 0; v < V; ++v) {
        total += std::exp(static_cast<double>(row[v]));
        rank += row[v] > row[prompt[k + 1]];
      }
      EXPECT_EQ(lps[k].token, prompt[k + 1]);
      EXPECT_NEAR(lps[k].logprob, row[prompt[k + 1]] - std::log(total), 1e-3) << "position " << k;
      EXPECT_EQ(lps[k].rank, rank) << "position " << k;
      ASSERT_EQ(lps[k].top.size(), 3u);
      EXPECT_EQ(lps[k].top[0].first, std::max_element(row, row + V) - row) << "position " << k;
    }
  }
}

// The host tier: a prompt whose blocks (and, with state, checkpoints) other requests pushed out of a
// small device pool comes back from host memory, and gives the tokens and logprobs of its first run.
TEST_P(EngineFixture, HostTierBringsEvictedPrefixesBack) {
  models::Model& m = model();
  RequestParams first = greedy(make_prompt(41, 21), 4);
  first.top_logprobs = 2;
  std::vector<Event> runs;
  EngineStats stats;
  {
    Engine s(m, test_tokenizer(),
             {.kv_blocks = 24, .block_size = 4, .max_running = 2, .max_context = 96, .host_cache_gb = 0.002});
    ASSERT_GT(s.options().host_blocks, 40);
    EXPECT_EQ(s.options().host_checkpoints > 0, recurrent());
    Recorder rec(5);
    ASSERT_TRUE(s.submit(first, rec.sink(0)));
    ASSERT_TRUE(rec.wait());
    for (size_t i = 1; i <= 3; ++i) {
      ASSERT_TRUE(s.submit(greedy(make_prompt(41, static_cast<uint32_t>(100 + i)), 4), rec.sink(i)));
      ASSERT_TRUE(rec.wait());
    }
    EXPECT_GT(s.stats().host_blocks_cached, 0);
    ASSERT_TRUE(s.submit(first, rec.sink(4)));
    ASSERT_TRUE(rec.wait());
    stats = s.stats();
    expect_all_free(s);
    EXPECT_EQ(rec[4].tokens[0], rec[0].tokens[0]);
    EXPECT_EQ(rec[0].tokens[0], run_alone(m, first).tokens);
    ASSERT_EQ(rec[4].logprobs[0].size(), rec[0].logprobs[0].size());
    for (size_t k = 0; k < rec[0].logprobs[0].size(); ++k)
      EXPECT_NEAR(rec[4].logprobs[0][k].logprob, rec[0].logprobs[0][k].logprob, 1e-4) << "token " << k;
    EXPECT_EQ(rec[4].finished[0].cached_prompt_tokens, 40) << "every whole block before the last token";
  }
  EXPECT_GE(stats.host_loaded_blocks_total, 8);
  if (recurrent()) {
    EXPECT_GE(stats.host_loaded_checkpoints_total, 1);
  }
}

// stop_ids end a choice without emitting the id; stop strings end it with the text before the match
// (as engine::generate does); max_tokens and the context limit end it with "length".
TEST(Engine, StopIdsStopStringsAndLength) {
  models::Model& m = fixture_model("qwen3");
  const std::vector<int32_t> prompt = make_prompt(11, 77);
  RequestParams base = greedy(prompt, 24);
  const testing::Single full = run_alone(m, base);
  ASSERT_EQ(full.tokens.size(), 24u);
  // A stop id: the first token (from the third on) not seen before in the output.
  size_t k = 2;
  while (k < 20 && std::find(full.tokens.begin(), full.tokens.begin() + k, full.tokens[k]) != full.tokens.begin() + k) ++k;
  ASSERT_LT(k, 20u);
  RequestParams by_id = base;
  by_id.stop_ids = {9999, full.tokens[k]};
  // A stop string: three bytes from the middle of the text, first occurring there.
  size_t at = full.text.size() / 2;
  while (at < full.text.size() && (full.text[at] & 0xC0) == 0x80) ++at;
  std::string stop = full.text.substr(at, 3);
  at = full.text.find(stop);
  ASSERT_GT(at, 0u);
  RequestParams by_string = base;
  by_string.stop = {"no such text", stop};
  const testing::Single alone_string = run_alone(m, by_string);

  Recorder rec(4);
  {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 16});
    ASSERT_TRUE(s.submit(base, rec.sink(0)));
    ASSERT_TRUE(rec.wait());
  }
  // base at max_context 16: the context limit ends it after 5 tokens.
  EXPECT_EQ(rec[0].finished[0].finish_reason, "length");
  EXPECT_EQ(rec[0].tokens[0], std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 5));
  EXPECT_EQ(rec[0].finished[0].completion_tokens, 5);
  {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 128});
    ASSERT_TRUE(s.submit(by_id, rec.sink(1)));
    ASSERT_TRUE(s.submit(by_string, rec.sink(2)));
    RequestParams short_run = base;
    short_run.max_tokens = 7;
    ASSERT_TRUE(s.submit(short_run, rec.sink(3)));
    ASSERT_TRUE(rec.wait());
    expect_all_free(s);
  }
  EXPECT_EQ(rec[1].finished[0].finish_reason, "stop");
  EXPECT_EQ(rec[1].tokens[0], std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + k));
  EXPECT_EQ(rec[1].text[0], test_tokenizer().decode(rec[1].tokens[0]));
  EXPECT_EQ(rec[1].finished[0].completion_tokens, static_cast<int64_t>(k + 1)) << "the stop id is counted";

  EXPECT_EQ(rec[2].finished[0].finish_reason, "stop");
  EXPECT_EQ(rec[2].text[0], full.text.substr(0, at));
  EXPECT_EQ(rec[2].text[0], alone_string.text);
  EXPECT_EQ(alone_string.finish_reason, "stop");
  EXPECT_LT(rec[2].tokens[0].size(), full.tokens.size());

  EXPECT_EQ(rec[3].finished[0].finish_reason, "length");
  EXPECT_EQ(rec[3].tokens[0], std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 7));
}

// Ops that throw when a poisoned token reaches the embedding: a stand-in for a bug inside a step.
class PoisonOps : public Ops {
 public:
  PoisonOps(Ops& inner, int32_t poison) : inner_(inner), poison_(poison) {}
  std::string_view name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  Tensor alloc(DType dtype, std::vector<int64_t> shape) override { return inner_.alloc(dtype, std::move(shape)); }
  void embedding(const Tensor& ids, const Weight& table, Tensor& out) override {
    for (int64_t i = 0; i < ids.numel(); ++i)
      if (ids.ptr<int32_t>()[i] == poison_) fail("poisoned token {} reached the embedding", poison_);
    inner_.embedding(ids, table, out);
  }
  void linear(const Tensor& x, const Weight& w, Tensor& y) override { inner_.linear(x, w, y); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override { inner_.rms_norm(x, w, eps, y); }
  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) override {
    inner_.add_rms_norm(x, delta, w, eps, y);
  }
  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& y) override {
    inner_.rms_norm_gated(x, z, w, eps, y);
  }
  void l2_norm(const Tensor& x, float eps, float scale, Tensor& y) override { inner_.l2_norm(x, eps, scale, y); }
  void rope(Tensor& x, const Tensor& positions, const RopeParams& params) override {
    inner_.rope(x, positions, params);
  }
  void rms_norm_rope(Tensor& x, const Tensor& w, float eps, const Tensor& positions,
                     const RopeParams& params) override {
    inner_.rms_norm_rope(x, w, eps, positions, params);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override { inner_.silu_mul(gate, up, out); }
  void sigmoid_mul(Tensor& x, const Tensor& gate) override { inner_.sigmoid_mul(x, gate); }
  void add(Tensor& x, const Tensor& y) override { inner_.add(x, y); }
  void kv_store(const Tensor& k, const Tensor& v, const AttentionLayout& layout, KvPool& pool) override {
    inner_.kv_store(k, v, layout, pool);
  }
  void attention(const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
                 Tensor& out) override {
    inner_.attention(q, pool, layout, scale, out);
  }
  void moe_route(const Tensor& logits, bool renormalize, Tensor& ids, Tensor& weights) override {
    inner_.moe_route(logits, renormalize, ids, weights);
  }
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Weight& gate, const Weight& up,
                   const Weight& down, Tensor& out) override {
    inner_.moe_experts(x, ids, weights, gate, up, down, out);
  }
  void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g,
                 Tensor& beta) override {
    inner_.gdn_gates(a, b, A_log, dt_bias, g, beta);
  }
  void conv1d_causal(const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                     Tensor& out) override {
    inner_.conv1d_causal(x, w, layout, conv_state, out);
  }
  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const SeqLayout& layout, Tensor& state, Tensor& out, GdnAlgorithm algorithm) override {
    inner_.gated_delta_rule(q, k, v, g, beta, layout, state, out, algorithm);
  }
  void sample(const Tensor& logits, const std::vector<SamplingParams>& params,
              const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
              std::vector<int32_t>& out) override {
    inner_.sample(logits, params, history, step, out);
  }
  void mask_logits(Tensor& logits, const Tensor& rows, const Tensor& allowed) override {
    inner_.mask_logits(logits, rows, allowed);
  }

 private:
  Ops& inner_;
  int32_t poison_;
};

// A backend that says it records steps (as CUDA with graphs does) over the CPU one: the engine then
// pads decode steps to its ladder of batch sizes and records them at start-up. It notes every step key
// and refuses, as the CUDA backend does, two sequences of one batch on one state slot.
class RecordingOps final : public PoisonOps {
 public:
  explicit RecordingOps(Ops& inner) : PoisonOps(inner, -1) {}
  bool records_steps() const override { return true; }
  void begin_step(const std::string& key) override {
    std::lock_guard lock(mu_);
    keys_.push_back(key);
  }
  void conv1d_causal(const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                     Tensor& out) override {
    std::vector<int32_t> slots = layout.state_slot;
    std::sort(slots.begin(), slots.end());
    if (std::adjacent_find(slots.begin(), slots.end()) != slots.end()) fail("two sequences of one batch share a slot");
    PoisonOps::conv1d_causal(x, w, layout, conv_state, out);
  }
  std::vector<std::string> keys() {
    std::lock_guard lock(mu_);
    return keys_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> keys_;
};

// Decode steps padded up to the recorded batch sizes (1, 2, 4, 8, 10 here: 5 decodes run as 8) give each
// request the tokens of its run alone, the padding rows on slots of their own; every decode step while
// serving replays a key recorded at start-up.
// min_tokens: stop ids are masked out and stop strings not matched before that many completion
// tokens; include_stop_str keeps the matched stop string in the text.
// logit_bias at -100 bans ids, at 100 allows only those; the stop string that ended a choice is named.
TEST(Engine, LogitBiasBansAndRestrictsIds) {
  models::Model& m = fixture_model("qwen3");
  const std::vector<int32_t> prompt = make_prompt(11, 77);
  RequestParams base = greedy(prompt, 16);
  const testing::Single full = run_alone(m, base);
  ASSERT_EQ(full.tokens.size(), 16u);
  RequestParams banned = base;
  banned.banned_tokens = {full.tokens[0], full.tokens[1], full.tokens[2]};
  RequestParams only = base;
  only.exclusive_tokens = {5, 9, 40};
  only.banned_tokens = {9};
  RequestParams by_string = base;
  const std::string stop = full.text.substr(2, 2);
  by_string.stop = {"\x01never", stop};

  Recorder rec(3);
  {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 128});
    ASSERT_TRUE(s.submit(banned, rec.sink(0)));
    ASSERT_TRUE(s.submit(only, rec.sink(1)));
    ASSERT_TRUE(s.submit(by_string, rec.sink(2)));
    ASSERT_TRUE(rec.wait());
    expect_all_free(s);
  }
  ASSERT_FALSE(rec[0].tokens[0].empty());
  for (const int32_t t : rec[0].tokens[0])
    EXPECT_EQ(std::count(banned.banned_tokens.begin(), banned.banned_tokens.end(), t), 0) << t;
  ASSERT_EQ(rec[1].tokens[0].size(), 16u);  // no stop id is allowed, so it runs to max_tokens
  for (const int32_t t : rec[1].tokens[0]) EXPECT_TRUE(t == 5 || t == 40) << t;
  EXPECT_EQ(rec[2].finished[0].finish_reason, "stop");
  EXPECT_EQ(rec[2].finished[0].stop_string, stop);
  EXPECT_EQ(rec[0].finished[0].stop_string, "");

  RequestParams bad = base;
  bad.banned_tokens = {1 << 30};
  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 128});
  EXPECT_THROW(s.submit(bad, rec.sink(0)), Error);
}

TEST(Engine, MinTokensAndIncludedStopStrings) {
  models::Model& m = fixture_model("qwen3");
  const std::vector<int32_t> prompt = make_prompt(11, 77);
  RequestParams base = greedy(prompt, 24);
  const testing::Single full = run_alone(m, base);
  ASSERT_EQ(full.tokens.size(), 24u);
  // Every id of the first four tokens stops the choice at once, unless min_tokens holds it.
  RequestParams early = base;
  early.stop_ids = std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + 4);
  RequestParams held = early;
  held.min_tokens = 10;
  // A stop string that first occurs in the first tokens' text, and the same with min_tokens past it.
  std::string stop = full.text.substr(2, 2);
  RequestParams by_string = base;
  by_string.stop = {stop};
  by_string.include_stop_str = true;
  RequestParams string_held = by_string;
  string_held.min_tokens = 20;

  Recorder rec(4);
  {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 128});
    ASSERT_TRUE(s.submit(early, rec.sink(0)));
    ASSERT_TRUE(s.submit(held, rec.sink(1)));
    ASSERT_TRUE(s.submit(by_string, rec.sink(2)));
    ASSERT_TRUE(s.submit(string_held, rec.sink(3)));
    ASSERT_TRUE(rec.wait());
    expect_all_free(s);
  }
  EXPECT_EQ(rec[0].finished[0].finish_reason, "stop");
  EXPECT_EQ(rec[0].tokens[0], std::vector<int32_t>{});  // the first token is a stop id
  ASSERT_GE(rec[1].tokens[0].size(), 10u);
  for (size_t i = 0; i < 10; ++i)
    EXPECT_EQ(std::count(early.stop_ids.begin(), early.stop_ids.end(), rec[1].tokens[0][i]), 0) << "token " << i;
  // With the stop string kept: the text up to and including its first match.
  EXPECT_EQ(rec[2].finished[0].finish_reason, "stop");
  EXPECT_EQ(rec[2].text[0], full.text.substr(0, full.text.find(stop) + stop.size()));
  // Not matched in the first 20 tokens' text: the choice runs on past it.
  ASSERT_GE(rec[3].tokens[0].size(), 20u);
  EXPECT_EQ(rec[3].text[0].substr(0, 6), full.text.substr(0, 6));

  RequestParams bad = base;
  bad.min_tokens = 25;
  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 128});
  EXPECT_THROW(s.submit(bad, rec.sink(0)), Error);
}

TEST(Engine, PaddedDecodeStepsGiveTheTokensOfUnpaddedRuns) {
  models::Checkpoint checkpoint = models::open_checkpoint(testing::kGolden / "qwen3_5");
  std::unique_ptr<Ops> cpu = make_cpu_ops(global_thread_pool());
  RecordingOps ops(*cpu);
  models::Model m(checkpoint, ops);
  std::vector<RequestParams> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(sampled(make_prompt(3 + 4 * i, 700 + i), 6 + 3 * i, 40 + i));
  std::vector<testing::Single> alone;
  for (const auto& r : requests) alone.push_back(run_alone(fixture_model("qwen3_5"), r));

  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 10, .max_context = 64});
  const std::vector<std::string> recorded = ops.keys();
  EXPECT_EQ(recorded.size(), 2u * 5) << "batch sizes 1, 2, 4, 8, 10 at one width, each run twice";
  Recorder rec(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_TRUE(s.submit(requests[i], rec.sink(i)));
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(rec[i].tokens[0], alone[i].tokens) << "request " << i;
    EXPECT_EQ(rec[i].finished[0].finish_reason, "length");
  }
  const std::vector<std::string> all = ops.keys();
  ASSERT_GT(all.size(), recorded.size()) << "decode steps ran keyed";
  for (size_t k = recorded.size(); k < all.size(); ++k)
    EXPECT_NE(std::find(recorded.begin(), recorded.end(), all[k]), recorded.end()) << all[k] << " was not recorded";
  expect_all_free(s);
}

// A step that throws ends the requests in it with "error" and the reason; a sink that throws ends
// only its own request. The scheduler thread lives on: the next requests complete.
TEST(Engine, FailuresEndOnlyTheirRequests) {
  models::Checkpoint checkpoint = models::open_checkpoint(testing::kGolden / "qwen3_5");
  std::unique_ptr<Ops> cpu = make_cpu_ops(global_thread_pool());
  PoisonOps ops(*cpu, 499);
  models::Model m(checkpoint, ops);
  Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 4, .max_context = 64});

  Recorder poisoned(1);
  ASSERT_TRUE(s.submit(greedy({1, 2, 499, 3}, 8), poisoned.sink(0)));
  ASSERT_TRUE(poisoned.wait());
  EXPECT_EQ(poisoned[0].finished[0].finish_reason, "error");
  EXPECT_THAT(poisoned[0].finished[0].error, HasSubstr("poisoned token 499"));
  EXPECT_EQ(poisoned[0].finished_events[0], 1);
  expect_all_free(s);

  Recorder rec(2);
  ASSERT_TRUE(s.submit(greedy({5, 6, 7}, 8), [record = rec.sink(0)](const Event& e) {
    record(e);
    if (e.kind == Event::Kind::delta) throw std::runtime_error("client went away");
  }));
  ASSERT_TRUE(s.submit(greedy({8, 9, 10}, 8), rec.sink(1)));
  ASSERT_TRUE(rec.wait());
  EXPECT_EQ(rec[0].finished[0].finish_reason, "error");
  EXPECT_THAT(rec[0].finished[0].error, HasSubstr("client went away"));
  EXPECT_EQ(rec[0].deltas, 1) << "no deltas after the sink threw";
  EXPECT_EQ(rec[0].finished_events[0], 1);
  EXPECT_EQ(rec[1].finished[0].finish_reason, "length");
  EXPECT_EQ(rec[1].tokens[0].size(), 8u);
  expect_all_free(s);
}

// The destructor ends every pending request with exactly one finished event per choice.
TEST(Engine, DestructorFinishesPendingRequests) {
  models::Model& m = fixture_model("qwen3_5");
  Recorder rec(6);
  {
    Engine s(m, test_tokenizer(), {.block_size = 4, .max_running = 2, .max_context = 512});
    for (size_t i = 0; i < 6; ++i) {
      RequestParams p = greedy(make_prompt(30, static_cast<uint32_t>(i)), 400);
      p.n = i == 5 ? 2 : 1;
      ASSERT_TRUE(s.submit(p, rec.sink(i, p.n)));
    }
  }
  ASSERT_TRUE(rec.wait());
  for (size_t i = 0; i < 6; ++i)
    for (size_t c = 0; c < rec[i].finished.size(); ++c) {
      EXPECT_EQ(rec[i].finished_events[c], 1);
      EXPECT_EQ(rec[i].finished[c].finish_reason, "cancelled");
    }
}

}  // namespace
}  // namespace qinfer::engine
