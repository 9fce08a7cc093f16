#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace qinfer::server {
namespace {

void gauge(std::string& out, std::string_view name, std::string_view type, std::string_view help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard lock(mutex_);
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
  std::lock_guard lock(mutex_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

Metrics::Metrics()
    : time_to_first_token(
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      inter_token_latency({0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                           0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1,    2.5}),
      request_latency({0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}) {}

void Metrics::count_request(std::string_view endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(endpoint), status}];
}

void Metrics::count_finish(std::string_view reason) {
  std::lock_guard lock(mutex_);
  ++finished_[std::string(reason)];
}

std::string Metrics::render(const engine::EngineStats& s) const {
  std::string out;
  time_to_first_token.render(out, "qinfer_time_to_first_token_seconds",
                             "Time from a request's arrival to its first generated token.");
  inter_token_latency.render(out, "qinfer_inter_token_latency_seconds",
                             "Time between consecutive generated tokens of one choice.");
  request_latency.render(out, "qinfer_request_latency_seconds", "Time from a request's arrival to its last token.");
  gauge(out, "qinfer_requests_running", "gauge", "Sequences being generated.", static_cast<double>(s.running));
  gauge(out, "qinfer_requests_waiting", "gauge", "Requests queued for admission.", static_cast<double>(s.waiting));
  gauge(out, "qinfer_kv_blocks_total", "gauge", "KV-cache blocks in the pool.", static_cast<double>(s.kv_blocks_total));
  gauge(out, "qinfer_kv_blocks_used", "gauge", "KV-cache blocks held by sequences.",
        static_cast<double>(s.kv_blocks_used));
  gauge(out, "qinfer_kv_blocks_cached", "gauge",
        "KV-cache blocks kept in the prefix cache (those no sequence holds are free, evicted when needed).",
        static_cast<double>(s.kv_blocks_cached));
  gauge(out, "qinfer_prefix_cache_reused_tokens_total", "counter",
        "Prompt tokens taken from the prefix cache instead of computed.",
        static_cast<double>(s.prefix_reused_tokens_total));
  gauge(out, "qinfer_prefix_cache_evictions_total", "counter", "Cached KV blocks evicted to make room.",
        static_cast<double>(s.prefix_evictions_total));
  gauge(out, "qinfer_prefix_cache_hits_total", "counter", "Admitted sequences that reused cached prompt tokens.",
        static_cast<double>(s.prefix_hits_total));
  gauge(out, "qinfer_prefix_cache_misses_total", "counter", "Admitted sequences that computed their prompt whole.",
        static_cast<double>(s.prefix_misses_total));
  gauge(out, "qinfer_computed_prompt_tokens_total", "counter",
        "Prompt tokens computed (prompt tokens less those reused from the prefix cache).",
        static_cast<double>(std::max<int64_t>(0, s.prompt_tokens_total - s.prefix_reused_tokens_total)));
  gauge(out, "qinfer_state_checkpoints_total", "gauge", "Checkpoint slots for recurrent state (hybrid models).",
        static_cast<double>(s.state_checkpoints_total));
  gauge(out, "qinfer_state_checkpoints_cached", "gauge", "Recurrent-state checkpoints attached to cached blocks.",
        static_cast<double>(s.state_checkpoints_cached));
  gauge(out, "qinfer_state_checkpoint_bytes", "gauge", "Bytes of the recurrent-state checkpoints attached to cached blocks.",
        s.state_checkpoint_bytes);
  gauge(out, "qinfer_host_cache_blocks_total", "gauge", "KV blocks the prefix cache's host tier has room for.",
        static_cast<double>(s.host_blocks_total));
  gauge(out, "qinfer_host_cache_blocks_cached", "gauge", "KV blocks held in the prefix cache's host tier.",
        static_cast<double>(s.host_blocks_cached));
  gauge(out, "qinfer_host_cache_checkpoints_total", "gauge",
        "Recurrent-state checkpoints the prefix cache's host tier has room for.",
        static_cast<double>(s.host_checkpoints_total));
  gauge(out, "qinfer_host_cache_checkpoints_cached", "gauge",
        "Recurrent-state checkpoints held in the prefix cache's host tier.", static_cast<double>(s.host_checkpoints_cached));
  gauge(out, "qinfer_host_cache_loaded_blocks_total", "counter",
        "KV blocks copied back from the host tier for requests that reused them.",
        static_cast<double>(s.host_loaded_blocks_total));
  gauge(out, "qinfer_host_cache_loaded_checkpoints_total", "counter",
        "Recurrent-state checkpoints copied back from the host tier for requests that reused them.",
        static_cast<double>(s.host_loaded_checkpoints_total));
  gauge(out, "qinfer_state_checkpoint_evictions_total", "counter",
        "Recurrent-state checkpoints evicted to make room for new ones.",
        static_cast<double>(s.state_checkpoint_evictions_total));
  gauge(out, "qinfer_kv_cache_usage_ratio", "gauge", "Fraction of KV-cache blocks in use.",
        s.kv_blocks_total > 0 ? static_cast<double>(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  gauge(out, "qinfer_state_slots_total", "gauge", "Recurrent-state slots.", static_cast<double>(s.state_slots_total));
  gauge(out, "qinfer_state_slots_used", "gauge", "Recurrent-state slots held by sequences.",
        static_cast<double>(s.state_slots_used));
  gauge(out, "qinfer_prompt_tokens_total", "counter", "Prompt tokens processed.",
        static_cast<double>(s.prompt_tokens_total));
  gauge(out, "qinfer_generation_tokens_total", "counter", "Tokens generated.",
        static_cast<double>(s.completion_tokens_total));
  gauge(out, "qinfer_preemptions_total", "counter", "Sequences preempted for lack of cache.",
        static_cast<double>(s.preemptions_total));
  gauge(out, "qinfer_engine_steps_total", "counter", "Model steps (forwards) the engine ran.",
        static_cast<double>(s.steps_total));
  gauge(out, "qinfer_engine_decode_steps_total", "counter", "Model steps of one-token decodes only (replayed graphs).",
        static_cast<double>(s.decode_steps_total));
  gauge(out, "qinfer_engine_host_seconds_total", "counter",
        "Model-thread time spent scheduling, building batches and postprocessing.", s.host_seconds_total);
  gauge(out, "qinfer_engine_forward_seconds_total", "counter", "Time in forwards and sampling, as the model thread waits for them.",
        s.forward_seconds_total);
  gauge(out, "qinfer_engine_device_seconds_total", "counter",
        "Of the forwards, the device's time from each step's first work to its last (GPU backends).",
        s.device_seconds_total);
  gauge(out, "qinfer_engine_recording_seconds", "gauge", "Time spent recording decode steps at start-up.",
        s.recording_seconds);
  std::lock_guard lock(mutex_);
  gauge(out, "qinfer_open_streams", "gauge", "SSE responses being written.", static_cast<double>(open_streams_));
  out +=
      "# HELP qinfer_http_requests_total HTTP requests by endpoint and status.\n"
      "# TYPE qinfer_http_requests_total counter\n";
  for (const auto& [key, count] : requests_)
    out +=
        fmt::format("qinfer_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  out +=
      "# HELP qinfer_choices_finished_total Finished choices by finish reason.\n"
      "# TYPE qinfer_choices_finished_total counter\n";
  for (const auto& [reason, count] : finished_)
    out += fmt::format("qinfer_choices_finished_total{{reason=\"{}\"}} {}\n", reason, count);
  return out;
}

}  // namespace qinfer::server
