#include "tokenizer/utf8.h"

namespace qinfer::tokenizer {
namespace {

// Length of the valid sequence starting at text[i], or 0 when it is invalid or cut short. With
// `subpart`, the length of the longest prefix of a valid sequence there instead (at least 1).
size_t sequence_length(std::string_view text, size_t i, size_t* subpart = nullptr) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  if (subpart) *subpart = 1;
  if (lead < 0x80) return 1;
  size_t length;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  else if (lead == 0xE0) length = 3, lo = 0xA0;
  else if (lead == 0xED) length = 3, hi = 0x9F;  // no surrogates
  else if (lead >= 0xE1 && lead <= 0xEF) length = 3;
  else if (lead == 0xF0) length = 4, lo = 0x90;
  else if (lead == 0xF4) length = 4, hi = 0x8F;  // nothing above U+10FFFF
  else if (lead >= 0xF1 && lead <= 0xF3) length = 4;
  else return 0;
  for (size_t k = 1; k < length; ++k) {
    if (i + k >= text.size()) return 0;
    const uint8_t b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) return 0;
    if (subpart) *subpart = k + 1;
  }
  return length;
}

}  // namespace

size_t valid_utf8_prefix(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = sequence_length(text, i);
    if (n == 0) break;
    i += n;
  }
  return i;
}

bool is_valid_utf8(std::string_view text) { return valid_utf8_prefix(text) == text.size(); }

size_t incomplete_utf8_suffix(std::string_view text) {
  // Walk back over at most 3 continuation bytes to a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 4 && back <= text.size(); ++back) {
    const uint8_t b = static_cast<uint8_t>(text[text.size() - back]);
    if ((b & 0xC0) == 0x80) continue;
    const size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(text[pos + k])); };
  const char32_t lead = byte(0);
  char32_t c;
  size_t length;
  if (lead < 0x80) {
    c = lead, length = 1;
  } else if (lead < 0xE0) {
    c = (lead & 0x1F) << 6 | (byte(1) & 0x3F), length = 2;
  } else if (lead < 0xF0) {
    c = (lead & 0x0F) << 12 | (byte(1) & 0x3F) << 6 | (byte(2) & 0x3F), length = 3;
  } else {
    c = (lead & 0x07) << 18 | (byte(1) & 0x3F) << 12 | (byte(2) & 0x3F) << 6 | (byte(3) & 0x3F), length = 4;
  }
  pos += length;
  return c;
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t subpart = 1;
    if (const size_t n = sequence_length(bytes, i, &subpart)) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the whole maximal subpart
      i += subpart;
    }
  }
  return out;
}

}  // namespace qinfer::tokenizer
