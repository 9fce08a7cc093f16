#pragma once
// What the HTTP layer needs from the engine. In production this is the continuous-batching
// Scheduler (SchedulerGenerator); tests may script it to produce outputs a random-weight model
// cannot be made to write (a streamed tool call, a stalled stream).
#include <cstdint>
#include <optional>

#include "engine/scheduler.h"

namespace qinfer::server {

class Generator {
 public:
  virtual ~Generator() = default;
  // As engine::Scheduler::submit: nullopt when the queue is full, qinfer::Error for bad params.
  virtual std::optional<uint64_t> submit(engine::RequestParams params, engine::EventSink sink) = 0;
  virtual void cancel(uint64_t id) = 0;
  virtual engine::SchedulerStats stats() const = 0;
};

class SchedulerGenerator final : public Generator {
 public:
  explicit SchedulerGenerator(engine::Scheduler& scheduler) : scheduler_(scheduler) {}
  std::optional<uint64_t> submit(engine::RequestParams params, engine::EventSink sink) override {
    return scheduler_.submit(std::move(params), std::move(sink));
  }
  void cancel(uint64_t id) override { scheduler_.cancel(id); }
  engine::SchedulerStats stats() const override { return scheduler_.stats(); }

 private:
  engine::Scheduler& scheduler_;
};

}  // namespace qinfer::server
