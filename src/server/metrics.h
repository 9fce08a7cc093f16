#pragma once
// Prometheus metrics of the server (text exposition format 0.0.4): latency histograms the server
// measures itself, and the engine's gauges and counters read at scrape time.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace qinfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  void render(std::string& out, std::string_view name, std::string_view help) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  Histogram time_to_first_token, inter_token_latency, request_latency;

  void count_request(std::string_view endpoint, int status);
  void count_finish(std::string_view reason);
  void stream_opened() {
    std::lock_guard l(mutex_);
    ++open_streams_;
  }
  void stream_closed() {
    std::lock_guard l(mutex_);
    --open_streams_;
  }

  std::string render(const engine::EngineStats& stats) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_;
  int64_t open_streams_ = 0;
};

}  // namespace qinfer::server
