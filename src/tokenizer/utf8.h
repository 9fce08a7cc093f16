#pragma once
// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and input validation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qinfer::tokenizer {

// Length of the longest prefix of `text` that is complete, valid UTF-8 (no overlongs, no surrogates,
// nothing above U+10FFFF). A valid string returns text.size().
size_t valid_utf8_prefix(std::string_view text);
bool is_valid_utf8(std::string_view text);
// Bytes at the end of `text` that start a UTF-8 sequence not yet complete (0..3): what a streaming
// decoder must hold back until the next token arrives.
size_t incomplete_utf8_suffix(std::string_view text);
// Appends the UTF-8 encoding of a code point (must be a valid scalar value).
void append_utf8(std::string& out, char32_t code_point);
// Decodes the code point at text[pos] and advances pos past it; text must be valid UTF-8 there.
char32_t next_code_point(std::string_view text, size_t& pos);
// The bytes as text, each maximal ill-formed subsequence replaced by U+FFFD: what HF decode, Python's
// errors='replace' and the WHATWG TextDecoder produce.
std::string to_valid_utf8(std::string_view bytes);

}  // namespace qinfer::tokenizer
