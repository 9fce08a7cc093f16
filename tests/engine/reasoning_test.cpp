// The reasoning splitter: Qwen3 writes <think> itself, Qwen3.5's prompt opens it; tags and the
// newlines around them are layout; the same split whatever the chunking.
#include "engine/reasoning.h"

#include <gtest/gtest.h>

namespace qinfer::engine {
namespace {

std::pair<std::string, std::string> split(bool inside, const std::vector<std::string>& chunks,
                                          bool tool_calls = false, bool leading_only = false) {
  ReasoningSplitter s(inside, tool_calls, leading_only);
  std::string reasoning, content;
  for (const std::string& c : chunks) {
    auto p = s.push(c);
    reasoning += p.reasoning;
    content += p.content;
  }
  auto p = s.finish();
  return {reasoning + p.reasoning, content + p.content};
}

void expect_every_split(bool inside, const std::string& text, const std::string& reasoning, const std::string& content,
                        bool tool_calls = false, bool leading_only = false) {
  const std::pair<std::string, std::string> expected = {reasoning, content};
  EXPECT_EQ(split(inside, {text}, tool_calls, leading_only), expected);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    ASSERT_EQ(split(inside, {text.substr(0, cut), text.substr(cut)}, tool_calls, leading_only), expected)
        << "split at " << cut;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(split(inside, bytes, tool_calls, leading_only), expected);
}

TEST(ReasoningSplitter, Qwen3WritesTheWholeBlock) {
  expect_every_split(false, "<think>\nLet me think.\nStep 2.\n</think>\n\nThe answer is 4.", "Let me think.\nStep 2.",
                     "The answer is 4.");
}

TEST(ReasoningSplitter, Qwen35PromptOpenedTheBlock) {
  expect_every_split(true, "I should greet.\n</think>\n\nHello!", "I should greet.", "Hello!");
  // Thinking disabled in the template: the prompt closed an empty block, all output is content.
  expect_every_split(false, "Hello!\n\nBye", "", "Hello!\n\nBye");
}

// Constrained answers: only a leading block is reasoning; "<think>" later is the answer's text.
TEST(ReasoningSplitter, LeadingOnlyKeepsLaterTagsAsContent) {
  expect_every_split(false, "<think>\nhmm\n</think>\n\n{\"s\": \"a<think>b\"}", "hmm", "{\"s\": \"a<think>b\"}", false,
                     true);
  expect_every_split(false, "{\"s\": \"<think>x</think>\"}", "", "{\"s\": \"<think>x</think>\"}", false, true);
  expect_every_split(true, "plan\n</think>\n\n[\"<think>\"]", "plan", "[\"<think>\"]", false, true);
  expect_every_split(false, "\n<think>r</think>ok", "r", "\nok", false, true);  // blanks before it are kept
  expect_every_split(false, "<thin", "", "<thin", false, true);
}

TEST(ReasoningSplitter, UnclosedBlockStaysReasoning) {
  expect_every_split(true, "still thinking </thi", "still thinking </thi", "");
  expect_every_split(false, "<think>\nabc", "abc", "");
}

TEST(ReasoningSplitter, TextThatOnlyLooksLikeATag) {
  expect_every_split(false, "a <thin b <think", "", "a <thin b <think");
  expect_every_split(false, "x<think>y</think>z", "y", "xz");
}

TEST(ReasoningSplitter, ToolCallEndsReasoningWhenAsked) {
  expect_every_split(true, "plan\n<tool_call>\n{}", "plan", "<tool_call>\n{}", /*tool_calls=*/true);
  expect_every_split(true, "plan\n<tool_call>\n{}", "plan\n<tool_call>\n{}", "", /*tool_calls=*/false);
}

TEST(ReasoningSplitter, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think>old</think> ... <think>\n"));
}

}  // namespace
}  // namespace qinfer::engine
