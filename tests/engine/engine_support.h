#pragma once
// Shared pieces of the scheduler tests: the golden fixture models (loaded once), a small tokenizer
// that covers their 512 ids, single-sequence reference runs through engine::generate, and a thread-safe
// recorder of the events each request receives.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/generate.h"
#include "engine/engine.h"
#include "models/model.h"

namespace qinfer::engine::testing {

inline const std::filesystem::path kGolden = std::filesystem::path(QINFER_TEST_DATA) / "golden";

// The hand-made Qwen3.5-style tokenizer of the tokenizer tests: 656 vocabulary entries, so every id the
// fixtures' 512-token models can produce decodes.
inline const tokenizer::Tokenizer& test_tokenizer() {
  static const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(
      std::filesystem::path(QINFER_TEST_DATA).parent_path() / "tokenizer" / "data" / "qwen35_mini");
  return tok;
}

struct LoadedModel {
  models::Checkpoint checkpoint;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<models::Model> model;
};

// A golden fixture on the CPU backend, loaded once per process.
inline models::Model& fixture_model(const std::string& fixture) {
  static std::map<std::string, std::unique_ptr<LoadedModel>> loaded;
  auto& slot = loaded[fixture];
  if (!slot) {
    slot = std::make_unique<LoadedModel>(LoadedModel{models::open_checkpoint(kGolden / fixture), nullptr, nullptr});
    slot->ops = make_cpu_ops(global_thread_pool());
    slot->model = std::make_unique<models::Model>(slot->checkpoint, *slot->ops);
  }
  return *slot->model;
}

// Deterministic prompt ids below 500 (the fixtures' ordinary tokens).
inline std::vector<int32_t> make_prompt(int32_t length, uint32_t salt) {
  std::vector<int32_t> p;
  uint32_t x = 2166136261u ^ salt;
  for (int32_t i = 0; i < length; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(static_cast<int32_t>((x >> 8) % 500));
  }
  return p;
}

struct Single {
  std::vector<int32_t> tokens;
  std::string text, finish_reason;
};

// The request's choice `choice` run alone through engine::generate (seed + choice).
inline Single run_alone(models::Runner& model, const RequestParams& p, int32_t choice = 0) {
  GenerationOptions o;
  o.sampling = p.sampling;
  o.sampling.seed += static_cast<uint64_t>(choice);
  o.max_tokens = p.max_tokens;
  o.stop = p.stop;
  o.stop_ids = p.stop_ids;
  Single s;
  GenerationResult r = generate(model, test_tokenizer(), p.prompt, o, [&](std::string_view t) { s.text += t; });
  s.tokens = r.tokens;
  s.finish_reason = r.finish_reason;
  return s;
}

// What one request received.
struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per choice, all deltas joined
  std::vector<std::string> text;
  std::vector<std::vector<TokenLogprob>> logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_logprobs;  // per choice
  std::vector<int> prompt_logprob_events;                   // per choice: events that carried them
  std::vector<Event> finished;         // per choice
  std::vector<int> finished_events;    // per choice: must end up 1
  int deltas = 0;
  int events_after_finish = 0;
};

class Recorder {
 public:
  explicit Recorder(size_t requests) : outcomes_(requests) {}

  // A sink for request i with n choices; `hook` runs after the event is recorded, outside the lock.
  EventSink sink(size_t i, int32_t n = 1, std::function<void(const Event&)> hook = {}) {
    {
      std::lock_guard lock(mu_);
      Outcome& o = outcomes_.at(i);
      o.tokens.resize(n);
      o.text.resize(n);
      o.logprobs.resize(n);
      o.prompt_logprobs.resize(n);
      o.prompt_logprob_events.resize(n);
      o.finished.resize(n);
      o.finished_events.resize(n);
      expected_ += n;
    }
    return [this, i, hook](const Event& e) {
      record(i, e);
      if (hook) hook(e);
    };
  }

  void record(size_t i, const Event& e) {
    std::lock_guard lock(mu_);
    Outcome& o = outcomes_.at(i);
    const size_t c = static_cast<size_t>(e.choice);
    if (o.finished_events.at(c) > 0) ++o.events_after_finish;
    if (!e.prompt_logprobs.empty()) {
      o.prompt_logprobs[c] = e.prompt_logprobs;
      ++o.prompt_logprob_events[c];
    }
    if (e.kind == Event::Kind::delta) {
      ++o.deltas;
      o.tokens[c].insert(o.tokens[c].end(), e.tokens.begin(), e.tokens.end());
      o.text[c] += e.text;
      o.logprobs[c].insert(o.logprobs[c].end(), e.logprobs.begin(), e.logprobs.end());
    } else {
      o.finished[c] = e;
      ++o.finished_events[c];
      ++finished_;
      cv_.notify_all();
    }
  }

  // Waits (at most a minute) until every choice of every sink has finished.
  bool wait() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return finished_ >= expected_; });
  }

  Outcome& operator[](size_t i) { return outcomes_.at(i); }
  size_t size() const { return outcomes_.size(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Outcome> outcomes_;
  int expected_ = 0, finished_ = 0;
};

}  // namespace qinfer::engine::testing
