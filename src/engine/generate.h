#pragma once
// One reply to one prompt, for `qinfer run` and `qinfer chat`: submits to an Engine of its own and
// waits, streaming the text as it becomes final. The same engine, scheduler and sampling as the server.
#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/sampling.h"
#include "grammar/mask.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::engine {

struct GenerationOptions {
  SamplingParams sampling;
  int32_t max_tokens = 512;
  std::vector<std::string> stop;   // stop strings (not included in the output)
  std::vector<int32_t> stop_ids;   // end-of-turn / end-of-text ids (not included)
  const std::atomic<bool>* cancel = nullptr;  // set from a signal handler to end the answer early
  std::shared_ptr<grammar::GrammarMasks> constraint;  // the output follows this grammar (null: free)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, the stop id excluded
  std::string finish_reason;    // "stop", "length" or "cancelled"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // submit to the first token, and after it
};

// The ids that end a turn for a checkpoint: config.json's and generation_config.json's eos ids,
// and the tokenizer's eos token.
std::vector<int32_t> stop_ids(const std::filesystem::path& model_dir, const io::ModelConfig& config,
                              const tokenizer::Tokenizer& tokenizer);

// Streams text chunks to on_text as they become final (never a broken UTF-8 sequence, never a
// prefix of a stop string that may still complete). on_text runs on the engine's output thread
// while this call waits. A failed step throws its error.
GenerationResult generate(models::Runner& model, const tokenizer::Tokenizer& tokenizer,
                          const std::vector<int32_t>& prompt, const GenerationOptions& options,
                          const std::function<void(std::string_view)>& on_text);

}  // namespace qinfer::engine
