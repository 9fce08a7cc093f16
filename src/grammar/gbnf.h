#pragma once
// GBNF, llama.cpp's grammar text, compiled to a Grammar: `name ::= alternatives` rules, "literals",
// [classes], `.`, ( ) groups, * + ? {m,n} repetition and # comments; the rule `root` is the root.
#include <string_view>

#include "grammar/grammar.h"

namespace qinfer::grammar {

// Literals and classes are over code points (as in llama.cpp): "é", "\u00e9" and [à-ÿ] match their
// UTF-8 bytes. A rule ends at a line break that is not inside parentheses; rules may be used before
// they are defined. Throws Error naming the line and column of what is wrong: an undefined rule, an
// unterminated literal or class, a bad escape, a missing `::=`, no `root`, left recursion, ...
Grammar parse_gbnf(std::string_view text);

}  // namespace qinfer::grammar
