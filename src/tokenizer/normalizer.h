#pragma once
// Unicode NFC (tokenizer.json's `normalizer: NFC`), through utf8proc.
#include <string>
#include <string_view>

namespace qinfer::tokenizer {

// `text` must be valid UTF-8. Only the stretches that can change go through utf8proc: most text
// (ASCII, Latin-1, CJK, Hangul, kana) is already NFC.
std::string nfc(std::string_view text);

}  // namespace qinfer::tokenizer
