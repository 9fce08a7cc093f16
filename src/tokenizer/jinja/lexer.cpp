#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/pystr.h"

namespace qinfer::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80; }
bool is_name_char(unsigned char c) { return is_name_start(c) || is_digit(static_cast<char>(c)); }

// Jinja's own clean-up before lexing: \r\n and \r become \n, and one trailing newline goes.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : s_(std::move(source)) {
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Token> run() {
    bool line_starting = true;  // the previous match ended a line: lstrip_blocks may strip
    while (pos_ < s_.size()) {
      const size_t open = find_tag(pos_);
      if (open == std::string::npos) {
        emit_data(pos_, s_.substr(pos_));
        break;
      }
      const char kind = s_[open + 1];
      const char sign = open + 2 < s_.size() && (s_[open + 2] == '-' || s_[open + 2] == '+') ? s_[open + 2] : 0;
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(open, raw_end);
      emit_data(pos_, strip_before(s_.substr(pos_, open - pos_), sign, kind != '{', line_starting));
      if (raw) {
        line_starting = s_[raw_end - 1] == '\n';
        lex_raw(raw_end, line_starting);
        line_starting = s_[pos_ - 1] == '\n';
        continue;
      }
      pos_ = open + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        skip_comment(open);
      } else {
        tokens_.push_back({kind == '{' ? TokenType::variable_begin : TokenType::block_begin, "", line_of(open)});
        lex_tag(kind == '%');
      }
      line_starting = s_[pos_ - 1] == '\n';
    }
    tokens_.push_back({TokenType::eof, "", line_of(s_.size())});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t offset) const {
    return static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), offset) - newlines_.begin()) + 1;
  }

  [[noreturn]] void fail(size_t at, std::string message) const {
    throw Error(ErrorKind::syntax, std::move(message), "", line_of(at));
  }

  size_t find_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos && i + 1 < s_.size(); i = s_.find('{', i + 1))
      if (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#') return i;
    return std::string::npos;
  }

  // One Unicode whitespace character at `at` (Python's \s), or 0.
  size_t space_at(size_t at) const {
    if (at >= s_.size()) return 0;
    const auto b = static_cast<unsigned char>(s_[at]);
    if (b < 0x80) return py::is_space(b) ? 1 : 0;
    const size_t len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2;
    const std::u32string c = py::decode(std::string_view(s_).substr(at, len));
    return c.size() == 1 && py::is_space(c[0]) ? len : 0;
  }

  size_t skip_spaces(size_t at) const {
    while (size_t n = space_at(at)) at += n;
    return at;
  }

  bool starts(size_t at, std::string_view what) const { return std::string_view(s_).substr(at, what.size()) == what; }

  // Text before a tag: `-` strips all trailing whitespace; otherwise lstrip_blocks removes the
  // indentation of a block or comment tag that starts its line.
  std::string strip_before(std::string text, char sign, bool block_like, bool line_starting) const {
    if (sign == '-') return py::strip(text, std::nullopt, false, true);
    if (sign == '+' || !block_like) return text;
    const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (line_begin == 0 && !line_starting) return text;
    const std::string tail = text.substr(line_begin);
    if (!tail.empty() && py::is_all_space(tail)) text.resize(line_begin);
    return text;
  }

  void emit_data(size_t at, std::string text) {
    if (!text.empty()) tokens_.push_back({TokenType::data, std::move(text), line_of(at)});
  }

  // `{%-? raw -?%}`; raw_end receives where its text starts.
  bool match_raw_begin(size_t open, size_t& raw_end) const {
    size_t i = open + 2;
    if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) ++i;
    i = skip_spaces(i);
    if (!starts(i, "raw")) return false;
    i = skip_spaces(i + 3);
    if (starts(i, "-%}")) {
      raw_end = skip_spaces(i + 3);
      return true;
    }
    if (starts(i, "%}")) {
      raw_end = i + 2;  // Jinja applies no trim_blocks after {% raw %}
      return true;
    }
    return false;
  }

  void lex_raw(size_t start, bool line_starting) {
    for (size_t i = s_.find("{%", start); i != std::string::npos; i = s_.find("{%", i + 1)) {
      size_t j = i + 2;
      const char sign = j < s_.size() && (s_[j] == '-' || s_[j] == '+') ? s_[j] : 0;
      if (sign) ++j;
      j = skip_spaces(j);
      if (!starts(j, "endraw")) continue;
      j = skip_spaces(j + 6);
      size_t end = 0;
      if (starts(j, "+%}")) end = j + 3;
      else if (starts(j, "-%}")) end = skip_spaces(j + 3);
      else if (starts(j, "%}")) end = j + 2 + (starts(j + 2, "\n") ? 1 : 0);
      else continue;
      emit_data(start, strip_before(s_.substr(start, i - start), sign, true, line_starting));
      pos_ = end;
      return;
    }
    fail(start, "missing {% endraw %} for a {% raw %} block");
  }

  void skip_comment(size_t open) {
    for (size_t i = pos_; i + 1 < s_.size(); ++i) {
      if ((s_[i] == '-' || s_[i] == '+') && starts(i + 1, "#}")) {
        pos_ = s_[i] == '-' ? skip_spaces(i + 3) : i + 3;
        return;
      }
      if (starts(i, "#}")) {
        pos_ = i + 2 + (starts(i + 2, "\n") ? 1 : 0);
        return;
      }
    }
    fail(open, "missing end of comment tag '#}'");
  }

  // Tokens inside {{ }} or {% %} up to and including the closing delimiter.
  void lex_tag(bool block) {
    std::vector<char> brackets;
    const size_t tag_start = pos_;
    while (true) {
      if (pos_ >= s_.size()) fail(tag_start, fmt::format("unexpected end of template: missing '{}'", block ? "%}" : "}}"));
      if (brackets.empty()) {
        if (block) {
          if (starts(pos_, "+%}")) {
            pos_ += 3;
            break;
          }
          if (starts(pos_, "-%}")) {
            pos_ = skip_spaces(pos_ + 3);
            break;
          }
          if (starts(pos_, "%}")) {
            pos_ += 2 + (starts(pos_ + 2, "\n") ? 1 : 0);
            break;
          }
        } else {
          if (starts(pos_, "-}}")) {
            pos_ = skip_spaces(pos_ + 3);
            break;
          }
          if (starts(pos_, "}}")) {
            pos_ += 2;
            break;
          }
        }
      }
      if (size_t n = space_at(pos_)) {
        pos_ += n;
        continue;
      }
      const int line = line_of(pos_);
      const char c = s_[pos_];
      if (is_digit(c)) {
        lex_number(line);
      } else if (is_name_start(static_cast<unsigned char>(c))) {
        const size_t begin = pos_;
        while (pos_ < s_.size() && is_name_char(static_cast<unsigned char>(s_[pos_])) && !space_at(pos_)) ++pos_;
        tokens_.push_back({TokenType::name, s_.substr(begin, pos_ - begin), line});
      } else if (c == '\'' || c == '"') {
        lex_string(line);
      } else {
        lex_operator(line, brackets);
      }
    }
    tokens_.push_back({block ? TokenType::block_end : TokenType::variable_end, "", line_of(pos_ - 1)});
  }

  // Digits with single underscores between them, as in Python literals.
  size_t digits_end(size_t at, bool (*digit)(char)) const {
    if (at >= s_.size() || !digit(s_[at])) return at;
    size_t i = at + 1;
    while (i < s_.size()) {
      if (digit(s_[i])) ++i;
      else if (s_[i] == '_' && i + 1 < s_.size() && digit(s_[i + 1])) i += 2;
      else break;
    }
    return i;
  }

  void lex_number(int line) {
    const size_t begin = pos_;
    auto clean = [&](size_t end) {
      std::string t = s_.substr(begin, end - begin);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      return t;
    };
    // Float: digits, then a fraction and/or an exponent; never right after a '.' (x.0.1 is two items).
    const bool after_dot = begin > 0 && s_[begin - 1] == '.';
    size_t i = digits_end(begin, is_digit);
    size_t end = i;
    bool is_float = false;
    if (!after_dot) {
      if (i < s_.size() && s_[i] == '.' && i + 1 < s_.size() && is_digit(s_[i + 1])) {
        end = digits_end(i + 1, is_digit);
        is_float = true;
      }
      size_t e = end;
      if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
        size_t k = e + 1;
        if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
        if (k < s_.size() && is_digit(s_[k])) {
          end = digits_end(k, is_digit);
          is_float = true;
        }
      }
    }
    if (is_float) {
      pos_ = end;
      Token t{TokenType::floating, clean(end), line};
      t.floating = std::strtod(t.text.c_str(), nullptr);
      tokens_.push_back(std::move(t));
      return;
    }
    // Integers: 0x / 0o / 0b prefixes, or decimal without leading zeros (a lone run of zeros is 0).
    int base = 10;
    size_t body = begin;
    if (s_[begin] == '0' && begin + 1 < s_.size()) {
      const char p = static_cast<char>(s_[begin + 1] | 0x20);
      auto hex = [](char ch) { return is_digit(ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f'); };
      auto oct = [](char ch) { return ch >= '0' && ch <= '7'; };
      auto bin = [](char ch) { return ch == '0' || ch == '1'; };
      bool (*digit)(char) = p == 'x' ? +hex : p == 'o' ? +oct : p == 'b' ? +bin : nullptr;
      if (digit) {
        size_t k = begin + 2;
        if (k < s_.size() && s_[k] == '_') ++k;
        const size_t stop = digits_end(k, digit);
        if (stop > k) {
          base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
          body = begin + 2;
          end = stop;
        }
      }
      if (base == 10) {
        end = begin + 1;
        while (end < s_.size() && (s_[end] == '0' || (s_[end] == '_' && end + 1 < s_.size() && s_[end + 1] == '0'))) ++end;
      }
    }
    pos_ = end;
    std::string digits = s_.substr(body, end - body);
    digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
    Token t{TokenType::integer, clean(end), line};
    errno = 0;
    t.integer = std::strtoll(digits.c_str(), nullptr, base);
    if (errno == ERANGE) fail(begin, "integer literal too large");
    tokens_.push_back(std::move(t));
  }

  // Python's unicode-escape decoding of the literal's body.
  void lex_string(int line) {
    const char quote = s_[pos_];
    const size_t begin = pos_;
    std::string out;
    size_t i = pos_ + 1;
    auto hex_value = [&](size_t at, size_t n) -> std::optional<uint32_t> {
      if (at + n > s_.size()) return std::nullopt;
      uint32_t v = 0;
      for (size_t k = 0; k < n; ++k) {
        const char h = s_[at + k];
        const int d = is_digit(h) ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
        if (d < 0) return std::nullopt;
        v = v * 16 + static_cast<uint32_t>(d);
      }
      return v;
    };
    while (true) {
      if (i >= s_.size()) fail(begin, fmt::format("unterminated string literal (missing {})", quote));
      const char c = s_[i];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= s_.size()) fail(begin, "unterminated string literal");
      const char e = s_[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          auto v = hex_value(i, n);
          if (!v || *v > 0x10ffff || (*v >= 0xd800 && *v <= 0xdfff))
            fail(begin, fmt::format("invalid \\{} escape in string literal", e));
          out += py::encode(std::u32string(1, static_cast<char32_t>(*v)));
          i += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; ++k) v = v * 8 + (s_[i++] - '0');
            out += py::encode(std::u32string(1, static_cast<char32_t>(v)));
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // Jinja escapes non-ASCII as \xNN / \uNNNN before decoding, so "\é" yields those six characters.
            size_t len = 1;
            while (i - 1 + len < s_.size() && (static_cast<unsigned char>(s_[i - 1 + len]) & 0xc0) == 0x80) ++len;
            const std::u32string cp = py::decode(std::string_view(s_).substr(i - 1, len));
            const uint32_t v = cp.empty() ? 0xfffd : static_cast<uint32_t>(cp[0]);
            out += v <= 0xff ? fmt::format("\\x{:02x}", v) : v <= 0xffff ? fmt::format("\\u{:04x}", v)
                                                                          : fmt::format("\\U{:08x}", v);
            i += len - 1;
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    pos_ = i + 1;
    tokens_.push_back({TokenType::string, std::move(out), line});
  }

  void lex_operator(int line, std::vector<char>& brackets) {
    static constexpr std::string_view two[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : two) {
      if (starts(pos_, op)) {
        tokens_.push_back({TokenType::op, std::string(op), line});
        pos_ += 2;
        return;
      }
    }
    const char c = s_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      const std::u32string cp = py::decode(std::string_view(s_).substr(pos_, 4));
      fail(pos_, fmt::format("unexpected character {} in tag", py::repr(py::encode(cp.substr(0, 1)))));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(pos_, fmt::format("unexpected '{}'", c));
      if (brackets.back() != c) fail(pos_, fmt::format("unexpected '{}', expected '{}'", c, brackets.back()));
      brackets.pop_back();
    }
    tokens_.push_back({TokenType::op, std::string(1, c), line});
    ++pos_;
  }

  std::string s_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace qinfer::jinja
