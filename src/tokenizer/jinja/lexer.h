#pragma once
// Splits a template into tokens the way Jinja2's lexer does with trim_blocks and lstrip_blocks on:
// `{%- -%}` / `{{- -}}` / `{#- -#}` strip whitespace, `{%+` / `+%}` keep it, a block tag alone on a
// line takes its indentation and newline with it, comments vanish, {% raw %} becomes plain text.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer::jinja {

enum class TokenType { data, variable_begin, variable_end, block_begin, block_end, name, string, integer, floating,
                       op, eof };

struct Token {
  TokenType type;
  std::string text;  // data, name, operator, or the decoded string literal
  int line = 1;
  int64_t integer = 0;
  double floating = 0;
};

// Throws Error(syntax) with the line of the problem.
std::vector<Token> tokenize(std::string_view source);

}  // namespace qinfer::jinja
