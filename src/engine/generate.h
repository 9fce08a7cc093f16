#pragma once
// Text generation for one sequence: prefill, sample on the device, stream UTF-8-safe text, stop on
// end-of-turn tokens, stop strings or the token budget. The server's scheduler batches many of these;
// `qinfer run` and `qinfer chat` use this loop directly.
#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/sampling.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::engine {

struct GenerationOptions {
  SamplingParams sampling;
  int32_t max_tokens = 512;
  std::vector<std::string> stop;   // stop strings (not included in the output)
  std::vector<int32_t> stop_ids;   // end-of-turn / end-of-text ids (not included)
  const std::atomic<bool>* cancel = nullptr;  // set from a signal handler to end the answer early
};

// The logits rows sampling chooses from: the columns of ids the tokenizer has. Checkpoints round
// vocab_size up (Qwen3: 151936 rows for 151669 tokens); those padding rows are no text, and a model
// that has not learned to keep them low (random weights) would sample them. `logits` itself when it
// has no such columns.
Tensor text_logits(Ops& ops, const Tensor& logits, const tokenizer::Tokenizer& tokenizer);

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, the stop id excluded
  std::string finish_reason;    // "stop", "length" or "cancelled"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

// The ids that end a turn for a checkpoint: config.json's and generation_config.json's eos ids,
// and the tokenizer's eos token.
std::vector<int32_t> stop_ids(const std::filesystem::path& model_dir, const io::ModelConfig& config,
                              const tokenizer::Tokenizer& tokenizer);

// Streams text chunks to on_text as they become final (never a broken UTF-8 sequence, never a
// prefix of a stop string that may still complete).
GenerationResult generate(models::Runner& model, const tokenizer::Tokenizer& tokenizer,
                          const std::vector<int32_t>& prompt, const GenerationOptions& options,
                          const std::function<void(std::string_view)>& on_text);

// Hides <think>…</think> reasoning from a text stream (for display); `inside` starts true when the
// prompt already opened the block (Qwen3.5's generation prompt ends with "<think>\n").
class ReasoningFilter {
 public:
  explicit ReasoningFilter(bool inside = false) : inside_(inside) {}
  std::string push(std::string_view text);
  std::string finish();

 private:
  bool inside_;
  int newlines_to_drop_ = 0;
  std::string pending_;
};

}  // namespace qinfer::engine
