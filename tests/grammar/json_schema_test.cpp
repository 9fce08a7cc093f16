// json_schema_grammar / json_object_grammar: the corpus of schemas in fixtures/grammar/schemas.json
// (each valid text accepted, compact and pretty-printed, each invalid one refused, and no proper
// prefix of a value accepted), and the refusal of every keyword the grammar cannot honour.
#include "grammar/json_schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "grammar/matcher.h"
#include "grammar_test_util.h"

namespace qinfer::grammar {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> compile(const Json& schema, const JsonSchemaOptions& options = {}) {
  return std::make_shared<CompiledGrammar>(json_schema_grammar(schema, options));
}

using testing::matches;

// The whole text is accepted, and before its end the matcher accepts only where whitespace is all
// that is left (a number's prefixes are numbers too, so those are not checked).
::testing::AssertionResult accepts_exactly(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  Matcher m(g);
  const bool is_number = !text.empty() && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'));
  for (size_t i = 0; i < text.size(); ++i) {
    if (!is_number && m.accepting() && text.find_first_not_of(" \t\n\r", i) != std::string::npos)
      return ::testing::AssertionFailure() << "accepts the prefix '" << text.substr(0, i) << "'";
    if (!m.advance(static_cast<uint8_t>(text[i])))
      return ::testing::AssertionFailure() << "refuses byte " << i << " ('" << text.substr(0, i + 1) << "')";
  }
  if (!m.accepting()) return ::testing::AssertionFailure() << "does not accept the whole text";
  return ::testing::AssertionSuccess();
}

Json load_corpus() {
  std::ifstream in(QINFER_TEST_DATA "/grammar/schemas.json");
  EXPECT_TRUE(in.good()) << "cannot open " QINFER_TEST_DATA "/grammar/schemas.json";
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

int nesting(const Json& v) {
  int depth = 0;
  if (v.is_structured())
    for (const Json& c : v) depth = std::max(depth, nesting(c));
  return v.is_structured() ? depth + 1 : 0;
}

TEST(JsonSchema, Corpus) {
  const Json corpus = load_corpus();
  EXPECT_GE(corpus.size(), 100u);
  for (const Json& entry : corpus) {
    const std::string name = entry.at("name").get<std::string>();
    SCOPED_TRACE(name);
    JsonSchemaOptions options;
    if (entry.contains("options")) {
      options.any_whitespace = entry["options"].value("any_whitespace", false);
      options.strict = entry["options"].value("strict", false);
    }
    std::shared_ptr<const CompiledGrammar> g, g_any_ws;
    try {
      g = compile(entry.at("schema"), options);
      JsonSchemaOptions any_ws = options;
      any_ws.any_whitespace = true;
      g_any_ws = compile(entry.at("schema"), any_ws);
    } catch (const Error& e) {
      ADD_FAILURE() << "the schema is refused: " << e.what();
      continue;
    }
    for (const Json& valid : entry.at("valid")) {
      const std::string text = valid.get<std::string>();
      EXPECT_TRUE(accepts_exactly(g, text)) << text;
      // The same value compact, and pretty-printed where the whitespace allows (enum and const
      // values are their compact text only).
      const Json value = Json::parse(text, nullptr, false);
      if (value.is_discarded()) {
        ADD_FAILURE() << "a valid text that is not JSON: " << text;
        continue;
      }
      if (entry.value("compact_only", false)) continue;
      EXPECT_TRUE(accepts_exactly(g_any_ws, value.dump())) << value.dump();
      if (!options.any_whitespace) {
        EXPECT_TRUE(accepts_exactly(g, value.dump())) << value.dump();
      }
      if (2 * nesting(value) <= kMaxJsonWhitespace) {
        EXPECT_TRUE(accepts_exactly(g_any_ws, value.dump(2))) << value.dump(2);
      }
    }
    for (const Json& invalid : entry.at("invalid")) EXPECT_FALSE(matches(g, invalid.get<std::string>())) << invalid;
  }
}

TEST(JsonSchema, JsonObjectMode) {
  const auto g = std::make_shared<CompiledGrammar>(json_object_grammar());
  EXPECT_TRUE(matches(g, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, R"("a")"));
  EXPECT_FALSE(matches(g, R"({"a": 1)"));
  JsonSchemaOptions pretty;
  pretty.any_whitespace = true;
  const auto g_ws = std::make_shared<CompiledGrammar>(json_object_grammar(pretty));
  EXPECT_TRUE(matches(g_ws, "{\n  \"a\": [\n    1\n  ]\n}\n"));
  JsonSchemaOptions strict;
  strict.strict = true;
  EXPECT_TRUE(matches(std::make_shared<CompiledGrammar>(json_object_grammar(strict)), R"({"a":1})"));
}

TEST(JsonSchema, PropertyOrderOfOrderedJson) {
  // ordered_json keeps the schema's order; nlohmann::json sorts the keys.
  const std::string schema = R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
                                 "required": ["b", "a"], "additionalProperties": false})";
  const auto ordered = compile(Json::parse(schema));
  EXPECT_TRUE(matches(ordered, R"({"b":1,"a":2})"));
  EXPECT_FALSE(matches(ordered, R"({"a":2,"b":1})"));
  const auto sorted = std::make_shared<CompiledGrammar>(json_schema_grammar(io::json::parse(schema)));
  EXPECT_TRUE(matches(sorted, R"({"a":2,"b":1})"));
}

TEST(JsonSchema, WhitespaceAndNumbersAreBounded) {
  // The model cannot write forever: past the bounds nothing more is allowed.
  JsonSchemaOptions pretty;
  pretty.any_whitespace = true;
  Matcher ws(compile(Json::parse(R"({"type": "array"})"), pretty));
  EXPECT_TRUE(ws.advance("[" + std::string(kMaxJsonWhitespace, ' ')));
  EXPECT_FALSE(ws.advance(" "));
  Matcher digits(compile(Json::parse(R"({"type": "number"})")));
  EXPECT_TRUE(digits.advance(std::string(kMaxIntegerDigits, '9') + "." + std::string(kMaxFractionDigits, '9') + "e+" +
                             std::string(kMaxExponentDigits, '9')));
  EXPECT_TRUE(digits.accepting());
  EXPECT_FALSE(digits.can_continue());
}

TEST(JsonSchema, LongBoundedString) {
  const auto g = compile(Json::parse(R"({"type": "string", "maxLength": 5000})"));
  EXPECT_TRUE(matches(g, "\"" + std::string(5000, 'x') + "\""));
  EXPECT_FALSE(matches(g, "\"" + std::string(5001, 'x') + "\""));
}

std::string refusal(const std::string& schema, JsonSchemaOptions options = {}) {
  try {
    json_schema_grammar(Json::parse(schema), options);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(JsonSchema, RefusesUnsupportedKeywordsWithTheirPath) {
  EXPECT_EQ(refusal(R"({"properties": {"tags": {"type": "array", "uniqueItems": true}}})"),
            R"(json_schema: "uniqueItems" at /properties/tags is not supported)");
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type": "object", "patternProperties": {"^x": {}}})", R"("patternProperties" at the root)"},
      {R"({"type": "object", "dependentRequired": {"a": ["b"]}})", R"("dependentRequired" at the root)"},
      {R"({"dependencies": {"a": ["b"]}})", R"("dependencies" at the root)"},
      {R"({"if": {"type": "string"}, "then": {"minLength": 1}})", R"("if" at the root)"},
      {R"({"items": {"not": {"type": "null"}}})", R"("not" at /items)"},
      {R"({"type": "number", "multipleOf": 0.5})", R"("multipleOf" at the root)"},
      {R"({"type": "object", "minProperties": 1})", R"("minProperties" at the root)"},
      {R"({"type": "object", "maxProperties": 3})", R"("maxProperties" at the root)"},
      {R"({"type": "array", "contains": {"type": "integer"}})", R"("contains" at the root)"},
      {R"({"type": "object", "propertyNames": {"maxLength": 3}})", R"("propertyNames" at the root)"},
      {R"({"type": "object", "unevaluatedProperties": false})", R"("unevaluatedProperties" at the root)"},
      {R"({"$defs": {"a": {"$dynamicRef": "#x"}}, "$ref": "#/$defs/a"})", R"("$dynamicRef" at /$defs/a)"},
      {R"({"prefixItems": [{"type": "string"}, {"frobnicate": 1}]})", R"("frobnicate" at /prefixItems/1)"},
      {R"({"anyOf": [{"type": "string"}, {"type": "array", "uniqueItems": true}]})", R"("uniqueItems" at /anyOf/1)"},
      {R"({"properties": {"a/b": {"properties": {"c~d": {"not": {}}}}}})",
       R"("not" at /properties/a~1b/properties/c~0d)"},
  };
  for (const auto& [schema, message] : cases) {
    const std::string error = refusal(schema);
    EXPECT_THAT(error, HasSubstr(message)) << schema;
    EXPECT_THAT(error, HasSubstr("is not supported")) << schema;
    EXPECT_THAT(error, HasSubstr("json_schema: ")) << schema;
  }
}

TEST(JsonSchema, RefusesWhatItCannotHonour) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"$ref": "other.json#/a"})", R"("$ref" "other.json#/a" at the root is not supported)"},
      {R"({"$ref": "#anchor"})", "not anchors"},
      {R"({"properties": {"a": {"$ref": "#/$defs/missing"}}})",
       R"("$ref" "#/$defs/missing" at /properties/a refers to nothing)"},
      {R"({"type": "string", "format": "uri"})", R"("format" "uri" at the root is not supported)"},
      {R"({"type": "string", "pattern": "^a+$", "maxLength": 3})", R"("maxLength" together with "pattern")"},
      {R"({"type": "string", "format": "date", "minLength": 3})", R"("minLength" together with "format")"},
      {R"({"type": "string", "format": "date", "pattern": "^2"})", R"("format" together with "pattern")"},
      {R"({"enum": ["a", "bb"], "maxLength": 1})", R"("maxLength" together with "enum")"},
      {R"({"const": 3, "minimum": 1})", R"("minimum" together with "const")"},
      {R"({"anyOf": [{}], "oneOf": [{}]})", R"("oneOf" together with "anyOf")"},
      {R"({"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]})", R"("pattern" in more than one schema of the "allOf")"},
      {R"({"allOf": [{"items": {}}, {"prefixItems": [{}]}]})", R"("items" and "prefixItems" in different schemas)"},
      {R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "types with nothing in common"},
      {R"({"allOf": [{"$ref": "#"}, {"type": "object"}]})", "refer to each other in a cycle"},
      {R"({"allOf": [{"$ref": "#"}]})", "the schema cannot be generated"},
      {R"({"type": "integer", "minimum": 1e30})", R"("minimum" at the root is beyond the supported range)"},
      {R"({"type": "number", "maximum": -1e30})", R"("maximum" at the root is beyond the supported range)"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer is within the bounds at the root"},
      {R"({"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 5})", "no integer is within the bounds"},
      {R"({"type": "number", "exclusiveMinimum": 1.5, "maximum": 1.5})", "no number is within the bounds"},
      {R"({"type": "string", "minLength": 5, "maxLength": 4})", "no string at the root has at least 5 and at most 4"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "no array at the root has at least 3 and at most 2"},
      {R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})", "no array at the root"},
      {R"({"type": "array", "minItems": 20000})", R"("minItems" at the root is larger than 10000)"},
      {R"({"type": "string", "minLength": 20000})", R"("minLength" at the root is larger than 10000)"},
      {R"x({"type": "string", "pattern": "a(?=b)"})x", R"("pattern" at the root: )"},
      {R"({"type": "string", "pattern": "^\"+$"})", "matches no string without characters that need escaping"},
      {R"({"properties": {"x": false}, "required": ["x"]})", R"(the required property "x" at /properties/x is false)"},
      {R"({"required": ["x"], "additionalProperties": false})", R"(the required property "x" at the root is not in)"},
      {R"({"properties": {"a": false}})", "(accepted)"},
      {"false", "the schema at the root is false"},
      {R"({"items": 3})", R"("items" at the root must be a schema)"},
      {R"({"type": "strin"})", R"("type" at the root has "strin")"},
      {R"({"minLength": "3"})", R"("minLength" at the root must be a non-negative integer)"},
      {R"({"maximum": "3"})", R"("maximum" at the root must be a number)"},
      {R"({"enum": []})", R"("enum" at the root must be a non-empty array)"},
      {R"({"type": "string", "enum": [1, 2]})",
       R"(no value of "enum" / "const" at the root is of the schema's "type")"},
      {R"({"required": "a"})", R"("required" at the root must be an array of strings)"},
      {R"({"$ref": "#"})", "the schema cannot be generated"},
      {R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})", "left-recursive"},
  };
  for (const auto& [schema, message] : cases) EXPECT_THAT(refusal(schema), HasSubstr(message)) << schema;
  // Strict mode: required names outside "properties" need additionalProperties.
  JsonSchemaOptions strict;
  strict.strict = true;
  EXPECT_THAT(refusal(R"({"type": "object", "required": ["id"]})", strict), HasSubstr(R"(required property "id")"));
}

}  // namespace
}  // namespace qinfer::grammar
