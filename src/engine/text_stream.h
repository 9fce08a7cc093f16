#pragma once
// Generated ids to final text, shared by generate() and the scheduler: UTF-8-complete chunks
// (tokenizer::StreamDecoder), cut before the first stop string, holding back any tail that may still
// grow into one.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qinfer::engine {

class TextStream {
 public:
  // `include_stop`: a matched stop string ends the text rather than being cut from it.
  TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop, bool include_stop = false);

  // The text that became final with this token. When it completes a stop string, stopped() turns
  // true and the text ends right before the match (or with it); push no further tokens then.
  // `may_stop` false (before min_tokens): stop strings are not looked for, and no text waits on them.
  std::string push(int32_t token, bool may_stop = true);
  // The held-back rest (and any unfinished UTF-8 bytes, as U+FFFD) when the stream ends without a
  // stop string: at max_tokens, the context limit or a stop id.
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that stopped it

 private:
  tokenizer::StreamDecoder decoder_;
  std::vector<std::string> stop_;
  bool include_stop_;
  std::string pending_;  // decoded text not yet final (may begin a stop string)
  bool stopped_ = false;
  std::string matched_;
};

// Length of the longest suffix of `text` that is a proper prefix of one of `needles` (stop strings,
// tags of the streaming parsers): bytes that must wait for the next chunk before they can be emitted.
template <typename Needles>
size_t held_back(std::string_view text, const Needles& needles) {
  size_t hold = 0;
  for (std::string_view n : needles)
    for (size_t len = std::min(n.size() - 1, text.size()); len > hold; --len)
      if (text.substr(text.size() - len) == n.substr(0, len)) {
        hold = len;
        break;
      }
  return hold;
}
inline size_t held_back(std::string_view text, std::initializer_list<std::string_view> needles) {
  return held_back<std::initializer_list<std::string_view>>(text, needles);
}

}  // namespace qinfer::engine
