#pragma once
// What the HTTP layer needs from the engine. In production this is engine::Engine (EngineGenerator);
// tests may script it to produce outputs a random-weight model cannot be made to write (a streamed
// tool call, a stalled stream).
#include <cstdint>
#include <optional>

#include "engine/engine.h"

namespace qinfer::server {

class Generator {
 public:
  virtual ~Generator() = default;
  // As engine::Engine::submit: nullopt when the queue is full, qinfer::Error for bad params.
  virtual std::optional<uint64_t> submit(engine::RequestParams params, engine::EventSink sink) = 0;
  virtual void cancel(uint64_t id) = 0;
  virtual engine::EngineStats stats() const = 0;
};

class EngineGenerator final : public Generator {
 public:
  explicit EngineGenerator(engine::Engine& engine) : engine_(engine) {}
  std::optional<uint64_t> submit(engine::RequestParams params, engine::EventSink sink) override {
    return engine_.submit(std::move(params), std::move(sink));
  }
  void cancel(uint64_t id) override { engine_.cancel(id); }
  engine::EngineStats stats() const override { return engine_.stats(); }

 private:
  engine::Engine& engine_;
};

}  // namespace qinfer::server
