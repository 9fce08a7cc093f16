#pragma once
// Jinja2's grammar (jinja2/parser.py) for the statements chat templates use: if/elif/else, for
// (with else, loop filter), set (incl. namespace attributes and blocks), macro, call, filter, with,
// break/continue (loopcontrols), raw, and transformers' {% generation %}.
#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace qinfer::jinja {

// Throws Error(syntax) naming the line.
ast::Body parse(std::string_view source);

}  // namespace qinfer::jinja
