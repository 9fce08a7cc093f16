#include "tokenizer/jinja/pystr.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja/limits.h"
#include "tokenizer/utf8.h"

namespace qinfer::jinja::py {
namespace {

utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_upper_char(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LU; }
bool is_lower_char(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LL; }
bool is_title_char(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LT; }

// The full (one-to-many) mappings from SpecialCasing.txt that CPython applies and utf8proc's simple
// mappings miss; only the ones a prompt plausibly contains.
void append_upper(std::u32string& out, char32_t c) {
  switch (c) {
    case U'ß': out += U"SS"; return;
    case U'ﬀ': out += U"FF"; return;
    case U'ﬁ': out += U"FI"; return;
    case U'ﬂ': out += U"FL"; return;
    case U'ﬃ': out += U"FFI"; return;
    case U'ﬄ': out += U"FFL"; return;
    case U'ﬅ': case U'ﬆ': out += U"ST"; return;
    default: out += static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
  }
}

void append_lower(std::u32string& out, char32_t c) {
  if (c == U'İ') {
    out += U"i\u0307";
    return;
  }
  out += static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

void append_title(std::u32string& out, char32_t c) {
  if (c == U'ß') {
    out += U"Ss";
    return;
  }
  out += static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

bool in_set(char32_t c, const std::u32string& set) { return set.find(c) != std::u32string::npos; }

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

template <typename Pred>
bool all_chars(std::string_view s, Pred pred) {
  std::u32string t = decode(s);
  if (t.empty()) return false;
  return std::all_of(t.begin(), t.end(), pred);
}

}  // namespace

// Scans count against the render's step budget: a loop over a long string must not stall it.
std::u32string decode(std::string_view s) {
  count_scan(s.size());
  ensure_bytes(s.size() * sizeof(char32_t));  // the copy is four times the text
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out += static_cast<char32_t>(b);
      ++i;
      continue;
    }
    const int extra = b >= 0xf0 ? 3 : b >= 0xe0 ? 2 : b >= 0xc0 ? 1 : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= s.size()) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    char32_t c = b & (0x3f >> extra);
    bool ok = true;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char cb = static_cast<unsigned char>(s[i + k]);
      if ((cb & 0xc0) != 0x80) {
        ok = false;
        break;
      }
      c = (c << 6) | (cb & 0x3f);
    }
    if (!ok) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += c;
    i += extra + 1;
  }
  return out;
}

std::string encode(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) tokenizer::append_utf8(out, c);
  return out;
}

size_t length(std::string_view s) {
  count_scan(s.size());
  size_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xc0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool is_cased(char32_t c) { return is_upper_char(c) || is_lower_char(c) || is_title_char(c); }

std::string upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode(s)) append_upper(out, c);
  return encode(out);
}

std::string lower(std::string_view s) {
  std::u32string out;
  for (char32_t c : decode(s)) append_lower(out, c);
  return encode(out);
}

std::string title(std::string_view s) {
  std::u32string out;
  bool previous_cased = false;
  for (char32_t c : decode(s)) {
    if (previous_cased) append_lower(out, c);
    else append_title(out, c);
    previous_cased = is_cased(c);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string text = decode(s), out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (i == 0) append_title(out, text[i]);
    else append_lower(out, text[i]);
  }
  return encode(out);
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string text = decode(s);
  const std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? in_set(c, set) : is_space(c); };
  size_t begin = 0, end = text.size();
  if (left)
    while (begin < end && strippable(text[begin])) ++begin;
  if (right)
    while (end > begin && strippable(text[end - 1])) --end;
  return encode(std::u32string_view(text).substr(begin, end - begin));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    count_scan(s.size());
    // Separator splits work on bytes: UTF-8 is self-synchronizing, so byte matches are character matches.
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t hit = s.find(*sep, pos);
        if (hit == std::string_view::npos) break;
        parts.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      parts.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        if (end < sep->size()) break;
        const size_t hit = s.rfind(*sep, end - sep->size());
        if (hit == std::string_view::npos) break;
        parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
        end = hit;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  std::u32string text = decode(s);
  const size_t n = text.size();
  if (!from_right) {
    size_t i = 0;
    while (i < n) {
      while (i < n && is_space(text[i])) ++i;
      if (i == n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(encode(std::u32string_view(text).substr(i)));
        break;
      }
      size_t j = i;
      while (j < n && !is_space(text[j])) ++j;
      parts.push_back(encode(std::u32string_view(text).substr(i, j - i)));
      i = j;
    }
  } else {
    size_t i = n;
    while (i > 0) {
      while (i > 0 && is_space(text[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(encode(std::u32string_view(text).substr(0, i)));
        break;
      }
      size_t j = i;
      while (j > 0 && !is_space(text[j - 1])) --j;
      parts.push_back(encode(std::u32string_view(text).substr(j, i - j)));
      i = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string text = decode(s);
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (!is_line_break(text[i])) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (text[i] == '\r' && eol < text.size() && text[eol] == '\n') ++eol;
    lines.push_back(encode(std::u32string_view(text).substr(start, (keepends ? eol : i) - start)));
    start = i = eol;
  }
  if (start < text.size()) lines.push_back(encode(std::u32string_view(text).substr(start)));
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement before every character and at the end.
    std::u32string text = decode(s);
    const uint64_t inserts = count < 0 ? text.size() + 1 : std::min<uint64_t>(count, text.size() + 1);
    ensure_bytes(s.size() + inserts * with.size());
    int64_t done = 0;
    for (char32_t c : text) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      tokenizer::append_utf8(out, c);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  count_scan(s.size());
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    ensure_bytes(out.size() + (hit - pos) + with.size());
    out += s.substr(pos, hit - pos);
    out += with;
    pos = hit + old.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
  count_scan(s.size());
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool from_right) {
  count_scan(s.size());
  const size_t hit = from_right ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, hit)));
}

bool is_lower(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (is_upper_char(c) || is_title_char(c)) return false;
    cased = cased || is_lower_char(c);
  }
  return cased;
}

bool is_upper(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (is_lower_char(c) || is_title_char(c)) return false;
    cased = cased || is_upper_char(c);
  }
  return cased;
}

bool is_digit(std::string_view s) {
  return all_chars(s, [](char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; });
}

bool is_alpha(std::string_view s) {
  return all_chars(s, [](char32_t c) {
    const auto k = category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
  });
}

bool is_alnum(std::string_view s) {
  return all_chars(s, [](char32_t c) {
    const auto k = category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
  });
}

bool is_all_space(std::string_view s) { return all_chars(s, is_space); }

std::string repr(std::string_view s) {
  count_scan(s.size());
  // Quotes are ASCII, and UTF-8 never hides an ASCII byte inside a character: bytes can be searched.
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out += quote;
  auto append = [&](char32_t c) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c < 0x7f || is_printable(c)) {
      tokenizer::append_utf8(out, c);
    } else if (c <= 0xff) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c <= 0xffff) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    }
  };
  // ASCII byte by byte; each run of other bytes decoded on its own (a character never spans runs).
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      for (; j < s.size() && static_cast<unsigned char>(s[j]) < 0x80; ++j) {
        const char c = s[j];
        if (c >= 0x20 && c < 0x7f && c != quote && c != '\\') out += c;
        else append(static_cast<char32_t>(c));
      }
    } else {
      while (j < s.size() && static_cast<unsigned char>(s[j]) >= 0x80) ++j;
      for (char32_t c : decode(s.substr(i, j - i))) append(c);
    }
    i = j;
  }
  out += quote;
  return out;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then CPython's layout: positional for exponents in [-4, 16).
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  (void)ec;
  std::string sci(buf, end);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char ch : mantissa)
    if (ch != '.') digits += ch;
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  return fmt::format("{}{}e{}{:02d}", sign, out, exponent < 0 ? '-' : '+', std::abs(exponent));
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<int64_t> slice_indices(int64_t size, std::optional<int64_t> start, std::optional<int64_t> stop,
                                   std::optional<int64_t> step) {
  const int64_t st = step.value_or(1);
  // The caller rejects a zero step with Python's message.
  auto adjust = [&](std::optional<int64_t> v, int64_t if_missing) {
    if (!v) return if_missing;
    int64_t x = *v;
    if (x < 0) {
      x += size;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= size) {
      x = st < 0 ? size - 1 : size;
    }
    return x;
  };
  const int64_t first = adjust(start, st < 0 ? size - 1 : 0);
  const int64_t last = adjust(stop, st < 0 ? -1 : size);
  const uint64_t span = st > 0 ? (last > first ? last - first : 0) : (first > last ? first - last : 0);
  const uint64_t stride = st > 0 ? static_cast<uint64_t>(st) : 0 - static_cast<uint64_t>(st);
  const uint64_t count = span == 0 ? 0 : (span - 1) / stride + 1;
  ensure_bytes(count * sizeof(int64_t));
  std::vector<int64_t> out;
  out.reserve(count);
  if (st > 0)
    for (int64_t i = first; i < last; i += st) out.push_back(i);
  else
    for (int64_t i = first; i > last; i += st) out.push_back(i);
  return out;
}

}  // namespace qinfer::jinja::py
