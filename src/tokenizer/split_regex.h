#pragma once
// The pre-tokenizer's split regex: an Oniguruma pattern read from tokenizer.json, run with PCRE2
// (UTF, Unicode properties, JIT).
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace qinfer::tokenizer {

// Rewrites the constructs whose meaning differs between Oniguruma (HF tokenizers) and PCRE2: `\s` and
// `\S` become White_Space (PCRE2's `\s` also takes U+180E). Throws for `\h \H \w \W \b \B`, which
// differ too and which no Qwen tokenizer uses. `where` names the field in errors.
std::string oniguruma_to_pcre2(std::string_view pattern, const std::string& where);

class SplitRegex {
 public:
  SplitRegex(const std::string& pattern, const std::string& where);
  SplitRegex(SplitRegex&& other) noexcept;
  SplitRegex& operator=(SplitRegex&&) = delete;
  SplitRegex(const SplitRegex&) = delete;
  ~SplitRegex();

  // Appends every match and every stretch between matches, in order (HF's `Isolated` split
  // behaviour); empty matches produce nothing. `text` must be valid UTF-8.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string where_;
};

}  // namespace qinfer::tokenizer
