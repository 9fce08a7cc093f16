#include "engine/text_stream.h"

#include <algorithm>

namespace qinfer::engine {

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop)
    : decoder_(tokenizer), stop_(std::move(stop)) {}

std::string TextStream::push(int32_t token) {
  pending_ += decoder_.push(token);
  size_t end = std::string::npos;  // the earliest match of any stop string
  for (const std::string& s : stop_) end = std::min(end, pending_.find(s));
  if (end != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, end);
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
