#pragma once
// What the grammar tests share: whether a grammar matches a whole text, and whether building one
// fails with a message holding every expected part.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace qinfer::grammar::testing {

inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  return m.advance(text) && m.accepting();
}

inline bool matches(const Grammar& g, std::string_view text) {
  return matches(std::make_shared<const CompiledGrammar>(g), text);
}

// `build` throws an Error whose message holds every part; `what` names the input in failures.
inline ::testing::AssertionResult fails_with(const std::function<void()>& build, std::string_view what,
                                             std::initializer_list<std::string_view> parts) {
  std::string message;
  try {
    build();
    return ::testing::AssertionFailure() << "no error for: " << what;
  } catch (const Error& e) {
    message = e.what();
  }
  for (std::string_view part : parts)
    if (message.find(part) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << part << "\"";
  return ::testing::AssertionSuccess();
}

}  // namespace qinfer::grammar::testing
