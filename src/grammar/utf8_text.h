#pragma once
// Code points of grammar source text (GBNF, regular expressions): decoding the UTF-8 a pattern is
// written in, encoding the code points its escapes name, and set algebra on code-point classes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "tokenizer/utf8.h"

namespace qinfer::grammar::utf8 {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

inline bool is_surrogate(uint32_t c) { return c >= 0xD800 && c <= 0xDFFF; }

// Appends the UTF-8 encoding of a scalar value (not a surrogate, at most U+10FFFF).
inline void append(std::string& out, uint32_t c) { tokenizer::append_utf8(out, static_cast<char32_t>(c)); }

// Decodes the code point at text[pos] and advances pos past it; -1 (pos unchanged) when the bytes
// there are not well-formed UTF-8 (truncated, overlong, a surrogate, past U+10FFFF).
inline int64_t decode(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return text[pos++];
  const int n = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
  if (n == 0 || lead > 0xF4 || pos + n > text.size()) return -1;
  uint32_t c = lead & (0x7F >> n);
  for (int i = 1; i < n; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return -1;
    c = (c << 6) | (byte(pos + i) & 0x3F);
  }
  constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMinForLength[n] || c > kMaxCodePoint || is_surrogate(c)) return -1;
  pos += n;
  return c;
}

// The number of code points in text[begin, end): a column as an editor counts it.
inline size_t count_code_points(std::string_view text, size_t begin, size_t end) {
  size_t n = 0;
  for (size_t i = begin; i < end && i < text.size(); ++i) n += (static_cast<uint8_t>(text[i]) & 0xC0) != 0x80;
  return n;
}

// Sorted and merged, so that equal sets compare equal (and share one compiled class).
inline std::vector<CodePointRange> normalize(std::vector<CodePointRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<CodePointRange> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  return merged;
}

// Every code point U+0000..U+10FFFF not in `ranges` (normalized).
inline std::vector<CodePointRange> complement(const std::vector<CodePointRange>& ranges) {
  std::vector<CodePointRange> out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

}  // namespace qinfer::grammar::utf8
