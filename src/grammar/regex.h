#pragma once
// Regular expressions (JSON Schema `pattern`, vLLM `guided_regex`) compiled into a Grammar. The match
// is always the whole string: `^` at the start and `$` at the end are accepted and change nothing.
#include <string_view>

#include "grammar/grammar.h"

namespace qinfer::grammar {

// The element (a byte set or a new rule of `g`) matching exactly the strings the pattern matches in
// full. The pattern is UTF-8 and matches code points: `.` and classes match a whole UTF-8 character
// (`.` any but \n), \d \w \s are JavaScript's (ASCII digits and word characters, Unicode spaces).
// Groups (capturing, (?:...), (?P<name>...), (?<name>...)), |, * + ? {m} {m,} {m,n} {,n} (lazy `?`
// suffixes too: the language is the same) and the usual escapes are supported. Throws Error naming
// the construct and its byte offset for what a grammar cannot match (backreferences, lookaround, word
// boundaries, anchors inside the pattern) and for malformed patterns.
Element compile_regex(Grammar& g, std::string_view pattern);

// A grammar whose root matches the pattern.
Grammar regex_grammar(std::string_view pattern);

}  // namespace qinfer::grammar
