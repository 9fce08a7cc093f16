#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "core/error.h"
#include "engine/text_stream.h"

namespace qinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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

Tensor text_logits(Ops& ops, const Tensor& logits, const tokenizer::Tokenizer& tokenizer) {
  const int64_t rows = logits.dim(0), text = tokenizer.vocab_size();
  if (logits.dim(1) <= text) return logits;
  Tensor narrow = ops.alloc_output(DType::f32, {rows, text});
  ops.copy_columns(logits, 0, narrow, 0, text);
  return narrow;
}

GenerationResult generate(models::Runner& model, const tokenizer::Tokenizer& tokenizer,
                          const std::vector<int32_t>& prompt, const GenerationOptions& options,
                          const std::function<void(std::string_view)>& on_text) {
  QINFER_CHECK(!prompt.empty(), "the prompt is empty");
  QINFER_CHECK(options.max_tokens > 0, "max_tokens must be positive, got {}", options.max_tokens);
  const io::TextConfig& c = model.config();
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  QINFER_CHECK(static_cast<int64_t>(prompt.size()) < c.max_position_embeddings,
               "the prompt has {} tokens; this model reads at most {}", prompt.size(), c.max_position_embeddings);
  ModelCache cache = model.cache_for(std::min<int64_t>(total, c.max_position_embeddings));
  SequenceCache seq;
  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());

  // Prefill in chunks so activation memory stays bounded for long prompts.
  constexpr size_t kChunk = 512;
  auto start = Clock::now();
  Tensor logits;
  for (size_t begin = 0; begin < prompt.size(); begin += kChunk) {
    models::Batch batch;
    batch.sequences.push_back(
        {std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + std::min(prompt.size(), begin + kChunk)), &seq,
         false});
    logits = model.forward(batch, cache);
  }
  result.prefill_seconds = since(start);

  start = Clock::now();
  std::vector<std::vector<int32_t>> history = {prompt};
  TextStream stream(tokenizer, options.stop);
  result.finish_reason = "length";
  for (int32_t i = 0; i < options.max_tokens; ++i) {
    if (options.cancel && options.cancel->load()) {
      result.finish_reason = "cancelled";
      break;
    }
    std::vector<int32_t> next;
    model.ops().sample(text_logits(model.ops(), logits, tokenizer), {options.sampling}, history,
                       {static_cast<uint64_t>(i)}, next);
    const int32_t token = next[0];
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    result.tokens.push_back(token);
    history[0].push_back(token);
    if (const std::string text = stream.push(token); !text.empty()) on_text(text);
    if (stream.stopped()) {
      result.finish_reason = "stop";
      break;
    }
    if (i + 1 == options.max_tokens) break;
    models::Batch step;
    step.sequences.push_back({{token}, &seq, false});
    logits = model.forward(step, cache);
  }
  if (!stream.stopped())
    if (const std::string rest = stream.finish(); !rest.empty()) on_text(rest);
  result.decode_seconds = since(start);
  return result;
}

std::string ReasoningFilter::push(std::string_view text) {
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  pending_ += text;
  std::string out;
  while (true) {
    // The template and the model put up to two newlines right after the closing tag: not answer text.
    while (newlines_to_drop_ > 0 && !pending_.empty()) {
      if (pending_[0] != '\n') newlines_to_drop_ = 0;
      else pending_.erase(0, 1), --newlines_to_drop_;
    }
    const std::string_view tag = inside_ ? kClose : kOpen;
    const size_t at = pending_.find(tag);
    if (at == std::string::npos) break;
    if (!inside_) out += pending_.substr(0, at);
    pending_.erase(0, at + tag.size());
    inside_ = !inside_;
    if (!inside_) newlines_to_drop_ = 2;
  }
  // Keep back what might begin a tag.
  const std::string_view tag = inside_ ? kClose : kOpen;
  size_t hold = 0;
  for (size_t len = std::min(tag.size() - 1, pending_.size()); len > 0; --len)
    if (std::string_view(pending_).substr(pending_.size() - len) == tag.substr(0, len)) {
      hold = len;
      break;
    }
  if (!inside_) out += pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string ReasoningFilter::finish() {
  std::string out = inside_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

}  // namespace qinfer::engine
