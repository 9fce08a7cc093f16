#include "engine/reasoning.h"

#include "engine/text_stream.h"

namespace qinfer::engine {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>", kToolCall = "<tool_call>";

void append_trimmed(std::string& out, std::string_view body) {
  // The newline before "</think>" belongs to the tag's layout, not to the reasoning.
  if (!body.empty() && body.back() == '\n') body.remove_suffix(1);
  out += body;
}

}  // namespace

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  return close == std::string_view::npos || close < open;
}

bool prompt_closes_reasoning(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(" \t\r\n");
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(kClose);
}

grammar::Reasoning answer_start(bool template_reasons, std::string_view prompt) {
  if (!template_reasons || prompt_closes_reasoning(prompt)) return grammar::Reasoning::none;
  return prompt_opens_reasoning(prompt) ? grammar::Reasoning::open : grammar::Reasoning::optional_block;
}

ReasoningSplitter::Pieces ReasoningSplitter::push(std::string_view text) {
  pending_ += text;
  Pieces out;
  while (!pending_.empty()) {
    if (inside_) {
      if (drop_newline_) {
        if (pending_[0] == '\n') pending_.erase(0, 1);
        drop_newline_ = false;
        continue;
      }
      const size_t close = pending_.find(kClose);
      const size_t call = tool_call_ends_ ? pending_.find(kToolCall) : std::string::npos;
      if (close != std::string::npos && (call == std::string::npos || close < call)) {
        append_trimmed(out.reasoning, std::string_view(pending_).substr(0, close));
        pending_.erase(0, close + kClose.size());
        inside_ = false;
        past_start_ = leading_only_;
        newlines_after_close_ = 2;
        continue;
      }
      if (call != std::string::npos) {
        append_trimmed(out.reasoning, std::string_view(pending_).substr(0, call));
        pending_.erase(0, call);  // the tag stays for the tool-call parser
        inside_ = false;
        continue;
      }
      const size_t hold = tool_call_ends_
                              ? held_back(pending_, {"\n</think>", kClose, "\n<tool_call>", kToolCall})
                              : held_back(pending_, {"\n</think>", kClose});
      out.reasoning += std::string_view(pending_).substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      break;
    }
    if (newlines_after_close_ > 0) {
      if (pending_[0] == '\n') {
        pending_.erase(0, 1);
        --newlines_after_close_;
        continue;
      }
      newlines_after_close_ = 0;
    }
    if (past_start_) {
      out.content += pending_;
      pending_.clear();
      break;
    }
    if (leading_only_) {
      // The block must open the output (after blank lines): anything else starts the content.
      const size_t first = pending_.find_first_not_of("\n ");
      if (first == std::string::npos) break;  // only blanks so far: wait
      if (!std::string_view(pending_).substr(first).starts_with(kOpen)) {
        if (!kOpen.starts_with(std::string_view(pending_).substr(first))) past_start_ = true;
        else break;  // a prefix of "<think>": wait for more
        continue;
      }
    }
    const size_t open = pending_.find(kOpen);
    if (open != std::string::npos) {
      out.content += std::string_view(pending_).substr(0, open);
      pending_.erase(0, open + kOpen.size());
      inside_ = true;
      drop_newline_ = true;
      continue;
    }
    const size_t hold = held_back(pending_, {kOpen});
    out.content += std::string_view(pending_).substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    break;
  }
  return out;
}

ReasoningSplitter::Pieces ReasoningSplitter::finish() {
  Pieces out;
  (inside_ ? out.reasoning : out.content) = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace qinfer::engine
