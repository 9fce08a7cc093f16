#pragma once
// Byte-level BPE tokenizer read from HF `tokenizer.json` (+ `tokenizer_config.json`), the format Qwen
// checkpoints ship; ids match HF tokenizers. Encoding: added tokens are split out of the raw text,
// the rest is NFC-normalized, split by the regex from the file, mapped to bytes and merged by BPE.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/json.h"

namespace qinfer::tokenizer {

// One entry of tokenizer.json's `added_tokens` (or tokenizer_config.json's `added_tokens_decoder`).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;      // skipped by decode(skip_special_tokens)
  bool single_word = false;  // only matched where no word character touches it
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
  bool normalized = false;   // matched in the normalized text instead of the raw text
};

// What tokenizer_config.json (and chat_template.jinja) add; rendering the template happens elsewhere.
struct TokenizerConfig {
  std::string chat_template;  // empty when there is none
  // Special token strings; empty when unset.
  std::string bos_token, eos_token, pad_token, unk_token;
  std::vector<std::string> additional_special_tokens;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json and DIR/chat_template.jinja.
  static Tokenizer load(const std::filesystem::path& dir);
  // From parsed documents; the labels name them in errors. `config` may be null.
  static Tokenizer from_json(const io::json& tokenizer_json, const std::string& label,
                             const io::json* config = nullptr, const std::string& config_label = "");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be valid UTF-8 (an Error says where it is not). add_special_tokens applies the
  // post-processor's template (BOS/EOS); Qwen's adds nothing.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ill-formed UTF-8 in the joined token bytes becomes U+FFFD, as in HF. Throws for ids outside
  // [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The bytes a token stands for: part of a UTF-8 sequence for some byte-level tokens.
  std::string_view token_bytes(int32_t id) const;
  // An added token's content or a vocabulary entry as written in tokenizer.json ("Ġthe").
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  int32_t vocab_size() const;  // one past the largest id
  const std::vector<AddedToken>& added_tokens() const;
  const TokenizerConfig& config() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns generated ids into text as they arrive. Chunks never end inside a UTF-8 sequence: bytes of an
// unfinished character wait for the next token. The chunks of push() and finish() joined equal
// decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  // Emits what is held back (ill-formed bytes as U+FFFD) and starts over.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace qinfer::tokenizer
