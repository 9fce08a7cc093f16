#include "tokenizer/split_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace qinfer::tokenizer {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Per-thread match state: PCRE2 match data and a JIT stack larger than the 32 KiB default, so long
// whitespace runs under `\s+(?!\S)` cannot exhaust it.
class MatchState {
 public:
  MatchState() {
    data_ = pcre2_match_data_create(1, nullptr);  // only the whole match is read
    context_ = pcre2_match_context_create(nullptr);
    stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    QINFER_CHECK(data_ && context_ && stack_, "pre-tokenizer regex: out of memory for PCRE2 match state");
    pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

size_t utf8_length(uint8_t lead) { return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

}  // namespace

std::string oniguruma_to_pcre2(std::string_view pattern, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char next = pattern[++i];
    if (next == 'Q') {  // \Q...\E is literal text: copy it untouched
      const size_t end = pattern.find("\\E", i);
      const size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
      out += '\\';
      out.append(pattern.substr(i, stop - i));
      i = stop - 1;
    } else if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else if (std::string_view("hHwWbB").find(next) != std::string_view::npos) {
      fail("{}: `\\{}` means different things in Oniguruma (HF tokenizers) and PCRE2; qinfer does not "
           "support it in a split pattern", where, next);
    } else {
      out += '\\';
      out += next;
    }
  }
  return out;
}

SplitRegex::SplitRegex(const std::string& pattern, const std::string& where) : where_(where) {
  const std::string translated = oniguruma_to_pcre2(pattern, where);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                        PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  QINFER_CHECK(code_ != nullptr, "{}: cannot compile the regex {:?}: {} (at offset {} of the PCRE2 form {:?})",
               where, pattern, pcre2_message(error), offset, translated);
  // Without JIT support (an unusual PCRE2 build) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::SplitRegex(SplitRegex&& other) noexcept
    : code_(other.code_), jit_(other.jit_), where_(std::move(other.where_)) {
  other.code_ = nullptr;
}

SplitRegex::~SplitRegex() { pcre2_code_free(code_); }

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  MatchState& state = match_state();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t from = 0, emitted = 0;  // where the next search starts; end of what was appended
  while (from <= text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), from, 0, state.data(), state.context())
                        : pcre2_match(code_, subject, text.size(), from, PCRE2_NO_UTF_CHECK, state.data(),
                                      state.context());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    QINFER_CHECK(rc >= 0, "{}: matching failed on a {}-byte piece of text: {}", where_, text.size(), pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data());
    const size_t start = ovector[0], end = ovector[1];
    if (start > emitted) pieces.push_back(text.substr(emitted, start - emitted));
    emitted = start;
    if (end > start) {
      pieces.push_back(text.substr(start, end - start));
      emitted = from = end;
    } else {  // an empty match: search again one character further on
      if (start == text.size()) break;
      from = start + utf8_length(static_cast<uint8_t>(text[start]));
    }
  }
  if (emitted < text.size()) pieces.push_back(text.substr(emitted));
}

}  // namespace qinfer::tokenizer
