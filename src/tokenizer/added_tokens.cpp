#include "tokenizer/added_tokens.h"

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace qinfer::tokenizer {
namespace {

// Rust regex `\w`: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      // Join_Control, and the symbols that are Other_Alphabetic (circled and squared letters).
      return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
             (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
  }
}

// Start of the code point that ends at `end` (text is valid UTF-8, end > 0).
size_t previous_start(std::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

char32_t code_point_before(std::string_view text, size_t end) {
  size_t i = previous_start(text, end);
  return next_code_point(text, i);
}

char32_t code_point_at(std::string_view text, size_t i) { return next_code_point(text, i); }

}  // namespace

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenPattern> patterns) : patterns_(std::move(patterns)) {
  terminal_.push_back(-1);
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const std::string& text = patterns_[p].text;
    if (text.empty()) continue;
    starts_[static_cast<uint8_t>(text[0])] = true;
    int32_t node = 0;
    for (char ch : text) {
      const uint64_t key = uint64_t(node) << 8 | static_cast<uint8_t>(ch);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(p);  // the first of duplicates wins
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  auto it = edges_.find(uint64_t(node) << 8 | byte);
  return it == edges_.end() ? -1 : it->second;
}

void AddedTokenMatcher::find(std::string_view text, std::vector<Match>& matches) const {
  size_t taken = 0;  // end of the previous match, stripped whitespace included
  for (size_t i = 0; i < text.size();) {
    if (!starts_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t j = i; j < text.size();) {
      node = child(node, static_cast<uint8_t>(text[j++]));
      if (node < 0) break;
      if (terminal_[node] >= 0) best = terminal_[node], best_end = j;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedTokenPattern& p = patterns_[best];
    size_t start = i, end = best_end;
    i = best_end;  // matching resumes after this one even when single_word rejects it, as in HF
    if (p.single_word && ((start > 0 && is_word_char(code_point_before(text, start))) ||
                          (end < text.size() && is_word_char(code_point_at(text, end)))))
      continue;
    if (p.lstrip) {
      while (start > taken && is_white_space(code_point_before(text, start))) start = previous_start(text, start);
    }
    if (p.rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!is_white_space(next_code_point(text, next))) break;
        end = next;
      }
    }
    matches.push_back({start, end, p.id});
    taken = i = end;
  }
}

}  // namespace qinfer::tokenizer
