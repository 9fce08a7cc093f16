#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace qinfer::tokenizer {
namespace {

// Characters that NFC leaves alone and that never combine with what precedes them (NFC_Quick_Check
// Yes, canonical combining class 0): everything below U+0300, kana, CJK ideographs (not the
// compatibility ones, which decompose), Hangul syllables.
bool inert(char32_t c) {
  return c < 0x300 || (c >= 0x3041 && c <= 0x3096) || (c >= 0x30A1 && c <= 0x30FA) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x20000 && c <= 0x2F7FF) ||
         (c >= 0x30000 && c <= 0x323AF);
}

void append_nfc(std::string& out, std::string_view text) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &result,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  QINFER_CHECK(n >= 0, "NFC normalization failed: {}", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  std::free(result);
}

}  // namespace

std::string nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t done = 0;      // text[0, done) is in `out`
  size_t previous = 0;  // start of the code point before `i`
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    if (const auto lead = static_cast<uint8_t>(text[i]); lead < 0xCC) {  // below U+0300: inert
      previous = start;
      i += lead < 0x80 ? 1 : 2;
      continue;
    }
    if (inert(next_code_point(text, i))) {
      previous = start;
      continue;
    }
    // A run of characters that may change, with the inert one before it, which they may combine with.
    const size_t run = start == 0 ? 0 : previous;
    size_t end = i;
    while (end < text.size()) {
      size_t next = end;
      if (inert(next_code_point(text, next))) break;
      end = next;
    }
    out.append(text.substr(done, run - done));
    append_nfc(out, text.substr(run, end - run));
    done = i = end;
  }
  out.append(text.substr(done));
  return out;
}

}  // namespace qinfer::tokenizer
