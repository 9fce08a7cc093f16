#pragma once
// Finds added tokens (special tokens, <think>, ...) in text the way HF tokenizers' AddedVocabulary
// does: leftmost-longest matches of their contents, then the single_word / lstrip / rstrip rules.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qinfer::tokenizer {

struct AddedTokenPattern {
  std::string text;  // what is matched (the normalized content for `normalized` tokens)
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false;
};

class AddedTokenMatcher {
 public:
  struct Match {
    size_t start, end;  // byte range in the text, including whitespace taken by lstrip / rstrip
    int32_t id;
  };

  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedTokenPattern> patterns);
  bool empty() const { return patterns_.empty(); }
  // Non-overlapping matches in order of position; `text` must be valid UTF-8.
  void find(std::string_view text, std::vector<Match>& matches) const;

 private:
  int32_t child(int32_t node, uint8_t byte) const;
  // The pattern ending at each trie node (-1 for none); node 0 is the root.
  std::vector<int32_t> terminal_;
  std::unordered_map<uint64_t, int32_t> edges_;  // node << 8 | byte -> node
  bool starts_[256] = {};                        // bytes a pattern can begin with
  std::vector<AddedTokenPattern> patterns_;
};

// Unicode White_Space (what `\s` means to HF's Rust regexes).
bool is_white_space(char32_t c);

}  // namespace qinfer::tokenizer
