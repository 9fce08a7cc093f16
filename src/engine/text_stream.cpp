#include "engine/text_stream.h"

#include <algorithm>
#include <utility>

namespace qinfer::engine {

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop, bool include_stop)
    : decoder_(tokenizer), stop_(std::move(stop)), include_stop_(include_stop) {}

std::string TextStream::push(int32_t token, bool may_stop) {
  pending_ += decoder_.push(token);
  if (!may_stop) return std::exchange(pending_, {});
  size_t end = std::string::npos, length = 0;  // the earliest match of any stop string (the longest there)
  for (const std::string& s : stop_) {
    const size_t at = pending_.find(s);
    if (at < end || (at == end && at != std::string::npos && s.size() > length)) end = at, length = s.size();
  }
  if (end != std::string::npos) {
    stopped_ = true;
    matched_ = pending_.substr(end, length);
    std::string out = pending_.substr(0, include_stop_ ? end + length : end);
    pending_.clear();
    return out;
  }
  const size_t ready = pending_.size() - held_back(pending_, stop_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string TextStream::finish() {
  std::string out = std::move(pending_) + decoder_.finish();
  pending_.clear();
  return out;
}

}  // namespace qinfer::engine
