#pragma once
// Splits streamed model output into reasoning (inside <think>…</think>) and answer content.
// Qwen3 models write "<think>\n…\n</think>\n\n" themselves; Qwen3.5 templates open the block in the
// prompt, so only "</think>" appears. Pieces are final when returned: a tag split across chunks is
// held back until it is complete or cannot be a tag any more. The server's chat output and
// `qinfer run` / `chat` (which show or hide the reasoning) both read model output through it.
#include <string>
#include <string_view>

#include "grammar/constraint.h"

namespace qinfer::engine {

// True when a rendered prompt leaves a <think> block open (Qwen3.5's generation prompt).
bool prompt_opens_reasoning(std::string_view prompt);
// True when a rendered prompt ends with a closed <think> block (enable_thinking false): the model
// answers at once.
bool prompt_closes_reasoning(std::string_view prompt);
// Where the answer a constraint covers starts, for a template that writes <think> blocks or not:
// after the reasoning the prompt opened, at once when the prompt closed it (enable_thinking false)
// or the template has none, else after a reasoning block the model may write.
grammar::Reasoning answer_start(bool template_reasons, std::string_view prompt);

class ReasoningSplitter {
 public:
  struct Pieces {
    std::string reasoning, content;
  };

  // `inside`: the prompt opened the block. `tool_call_ends_reasoning`: "<tool_call>" inside the
  // block ends it (models sometimes call a tool without closing their reasoning); the tag stays in
  // the content so the tool-call parser sees it.
  // `leading_only`: only a block at the start is reasoning; once content or a closed block has come,
  // "<think>" is text (a constrained answer may hold it inside a JSON string).
  explicit ReasoningSplitter(bool inside, bool tool_call_ends_reasoning = false, bool leading_only = false)
      : inside_(inside), tool_call_ends_(tool_call_ends_reasoning), leading_only_(leading_only) {}

  Pieces push(std::string_view text);
  // The rest at the end of the output (an unclosed block stays reasoning).
  Pieces finish();

 private:
  bool inside_;
  bool tool_call_ends_;
  bool leading_only_;
  bool past_start_ = false;  // with leading_only: content or a closed block came; no more blocks
  bool drop_newline_ = false;     // one "\n" right after <think>
  int newlines_after_close_ = 0;  // up to two "\n" right after </think>
  std::string pending_;
};

}  // namespace qinfer::engine
