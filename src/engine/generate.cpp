#include "engine/generate.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>

#include "core/error.h"
#include "engine/engine.h"

namespace qinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<int32_t> stop_ids(const std::filesystem::path& model_dir, const io::ModelConfig& config,
                              const tokenizer::Tokenizer& tokenizer) {
  std::set<int32_t> ids;
  for (int64_t id : config.tokens.eos) ids.insert(static_cast<int32_t>(id));
  const auto generation_config = model_dir / "generation_config.json";
  if (std::filesystem::exists(generation_config)) {
    const io::json g = io::read_json_file(generation_config);
    if (auto it = g.find("eos_token_id"); it != g.end()) {
      if (it->is_number_integer()) ids.insert(it->get<int32_t>());
      else if (it->is_array())
        for (const auto& id : *it)
          if (id.is_number_integer()) ids.insert(id.get<int32_t>());
    }
  }
  if (!tokenizer.config().eos_token.empty())
    if (auto id = tokenizer.token_to_id(tokenizer.config().eos_token)) ids.insert(*id);
  return {ids.begin(), ids.end()};
}

GenerationResult generate(models::Runner& model, const tokenizer::Tokenizer& tokenizer,
                          const std::vector<int32_t>& prompt, const GenerationOptions& options,
                          const std::function<void(std::string_view)>& on_text) {
  QINFER_CHECK(!prompt.empty(), "the prompt is empty");
  QINFER_CHECK(options.max_tokens > 0, "max_tokens must be positive, got {}", options.max_tokens);
  const int64_t positions = model.config().max_position_embeddings;
  QINFER_CHECK(static_cast<int64_t>(prompt.size()) < positions, "the prompt has {} tokens; this model reads at most {}",
               prompt.size(), positions);
  // One sequence: a pool that holds exactly it, prefilled 512 tokens a step (activations stay bounded).
  EngineOptions o;
  o.max_running = 1;
  o.max_waiting = 1;
  o.step_token_budget = 512;
  o.max_context = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + options.max_tokens, positions);
  o.kv_blocks = (o.max_context + o.block_size - 1) / o.block_size;
  Engine engine(model, tokenizer, o);

  RequestParams p;
  p.prompt = prompt;
  p.sampling = options.sampling;
  p.max_tokens = options.max_tokens;
  p.stop = options.stop;
  p.stop_ids = options.stop_ids;
  p.constraint = options.constraint;
  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::mutex mu;
  std::condition_variable done;
  std::optional<Event> finished;
  const auto start = Clock::now();
  std::optional<Clock::time_point> first_token;
  const std::optional<uint64_t> id = engine.submit(std::move(p), [&](const Event& e) {
    if (e.kind == Event::Kind::delta) {
      if (!first_token) first_token = Clock::now();
      result.tokens.insert(result.tokens.end(), e.tokens.begin(), e.tokens.end());
      if (!e.text.empty()) on_text(e.text);
      return;
    }
    std::lock_guard lock(mu);
    finished = e;
    done.notify_all();
  });
  QINFER_CHECK(id.has_value(), "generate: the engine refused the request");
  std::unique_lock lock(mu);
  bool cancelled = false;
  while (!done.wait_for(lock, std::chrono::milliseconds(20), [&] { return finished.has_value(); }))
    if (!cancelled && options.cancel && options.cancel->load()) {
      engine.cancel(*id);
      cancelled = true;
    }
  QINFER_CHECK(finished->finish_reason != "error", "generation failed: {}", finished->error);
  const auto end = Clock::now();
  result.finish_reason = finished->finish_reason;
  result.prefill_seconds = seconds(first_token.value_or(end) - start);
  result.decode_seconds = seconds(end - first_token.value_or(end));
  return result;
}

}  // namespace qinfer::engine
