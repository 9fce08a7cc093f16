#pragma once
// JSON Schema and JSON mode compiled to a Grammar (OpenAI response_format json_schema / json_object,
// vLLM guided_json): every text the grammar accepts is JSON that validates against the schema.
//
// Supported: type (one name or a list), enum and const (values written as compact JSON), properties
// with required (declared order, each optional property present or absent), additionalProperties
// (false, true or a schema: such properties follow the declared ones), items, prefixItems (and
// draft 4-7 array items with additionalItems), minItems / maxItems, minLength / maxLength (code
// points, an escape counting as the character it stands for), pattern (regex.h, matched in full),
// format (date, time, date-time, uuid, email, ipv4, ipv6), minimum / maximum / exclusiveMinimum /
// exclusiveMaximum (exact, for integers and numbers), anyOf / oneOf (as alternatives), allOf (merged
// into one schema), $ref inside the document ("#", "#/$defs/...", "#/definitions/...", any JSON
// pointer, recursion included) and OpenAPI's nullable. Annotations (title, description, default,
// examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, x-...) are ignored. Every other
// keyword throws Error naming it and its JSON pointer: a request the server refuses, never a
// silently unconstrained answer.
//
// What the grammar allows is a subset of what the schema allows, chosen so that the model cannot
// write forever and every text is easy to parse:
// - numbers have at most kMaxIntegerDigits integer digits (more where a bound needs them), at most
//   kMaxFractionDigits fraction digits, at most kMaxExponentDigits exponent digits, and no exponent
//   when the number has bounds;
// - whitespace between tokens is bounded (JsonSchemaOptions::any_whitespace);
// - strings with a pattern or a format hold only characters that need no escape (no ", \ or
//   control characters), so that the pattern sees the characters the string holds;
// - keys of additional properties are written without escapes when properties are declared, so
//   that none of them repeats a declared name;
// - declared properties are written once each, in the schema's order, additional ones after them
//   (two additional properties may still share a key: a grammar cannot remember the keys written);
// - a schema without "type" yields the kinds its keywords constrain ({"minLength": 2}: a string),
//   not the values of other kinds that would satisfy it vacuously;
// - oneOf is generated as anyOf: its alternatives should not overlap (a discriminated union);
// - maxLength / maxItems past the minimum plus kMaxJsonCount are lowered to that.
// Refused although the keyword is supported: enum / const beside other assertions, pattern or
// format beside minLength / maxLength, pattern beside format, anyOf beside oneOf, allOf members
// that set the same keyword differently (except required, type, properties and the min / max
// counts and bounds, which combine exactly), bounds past 10^17 on their closed side.
#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "io/json.h"

namespace qinfer::grammar {

inline constexpr int kMaxJsonWhitespace = 32;  // characters of whitespace between two tokens
inline constexpr int kMaxIntegerDigits = 15;
inline constexpr int kMaxFractionDigits = 15;
inline constexpr int kMaxExponentDigits = 3;
inline constexpr int64_t kMaxJsonCount = 10000;  // of bounded string lengths and array sizes

struct JsonSchemaOptions {
  // false: tokens written compactly, with at most one space after ',' and ':' (what JSON.stringify
  // and Python's json.dumps write). true: up to kMaxJsonWhitespace characters of [ \t\n\r] around
  // every token, so pretty-printed JSON (up to that indentation) is accepted.
  bool any_whitespace = false;
  // OpenAI strict mode: an object schema without "additionalProperties" allows no other properties.
  bool strict = false;
};

// The schema's property order is kept (the order the model writes them in): pass ordered_json, as
// the server parses requests. Throws Error for what is not supported and for invalid schemas.
// `pointer`: the schema inside the document to compile (its $refs resolve against the document).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {},
                            const std::string& pointer = "#");
// The same, with properties in nlohmann::json's (alphabetical) key order.
Grammar json_schema_grammar(const io::json& schema, const JsonSchemaOptions& options = {});

// JSON mode: any JSON object (options.strict does not apply: it would leave only {}).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

// A key as a JSON pointer reference token (RFC 6901: "~" -> "~0", "/" -> "~1").
std::string json_pointer_token(std::string_view key);

}  // namespace qinfer::grammar
