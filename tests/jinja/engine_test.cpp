// Unit tests of the template engine: Python value formatting, whitespace control, scoping,
// undefined behaviour, error messages with line numbers, the sandbox, and resource limits.
// (Broad feature parity with Python Jinja2 is in parity_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "tokenizer/jinja/pystr.h"
#include "tokenizer/jinja/template.h"

namespace qinfer::jinja {
namespace {

std::string render(std::string_view source, const std::string& context = "{}") {
  return Template(source, "t.jinja").render(Value::from_json(nlohmann::ordered_json::parse(context)).as_dict());
}

std::optional<Error> render_error(std::string_view source, const std::string& context = "{}") {
  try {
    const std::string out = render(source, context);
    ADD_FAILURE() << "rendered without error: " << out;
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

TEST(PythonFormatting, FloatReprIsShortestRoundTripInPythonLayout) {
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},           {1.0, "1.0"},         {2.5, "2.5"},       {100.0, "100.0"},
      {1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {1e22, "1e+22"},     {0.0001, "0.0001"},
      {0.00001, "1e-05"},     {-0.0, "-0.0"},       {1.5e-7, "1.5e-07"}, {123456789012345678.0, "1.2345678901234568e+17"},
      {5e-324, "5e-324"},     {1.7976931348623157e308, "1.7976931348623157e+308"},
      {0.1 + 0.2, "0.30000000000000004"}, {NAN, "nan"}, {INFINITY, "inf"}, {-INFINITY, "-inf"},
  };
  for (const auto& [v, expected] : cases) EXPECT_EQ(py::float_repr(v), expected) << v;
}

TEST(PythonFormatting, StrAndReprOfContainers) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.0] }}"), "[1, 'a', None, True, 1.0]");
  EXPECT_EQ(render("{{ {'k': 'v', 'n': [1, (2,)]} }}"), "{'k': 'v', 'n': [1, (2,)]}");
  EXPECT_EQ(render("{{ (1, 2) }}|{{ () }}|{{ none }}|{{ false }}"), "(1, 2)|()|None|False");
  EXPECT_EQ(render("{{ x }}", R"({"x": {"b": 1, "a": 2}})"), "{'b': 1, 'a': 2}");  // insertion order kept
}

TEST(PythonFormatting, StringReprQuotesAndEscapes) {
  EXPECT_EQ(py::repr("it's"), "\"it's\"");
  EXPECT_EQ(py::repr("a\"b'"), "'a\"b\\''");
  EXPECT_EQ(py::repr("tab\there\n"), "'tab\\there\\n'");
  EXPECT_EQ(py::repr("\x01\x7f"), "'\\x01\\x7f'");
  EXPECT_EQ(py::repr("é🌍"), "'é🌍'");
  EXPECT_EQ(py::repr("\u00a0\u200b"), "'\\xa0\\u200b'");  // Zs and Cf are not printable
}

TEST(PythonFormatting, JsonLikePythonJsonDumps) {
  const Value v = Value::from_json(nlohmann::ordered_json::parse(R"({"a": 1, "b": [1, 2.5, null, true], "é": "ü\n"})"));
  EXPECT_EQ(to_json(v), R"({"a": 1, "b": [1, 2.5, null, true], "é": "ü\n"})");
  JsonOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(to_json(Value("é🌍"), ascii), R"("\u00e9\ud83c\udf0d")");
  JsonOptions indented;
  indented.indent = "  ";
  indented.item_separator = ",";
  EXPECT_EQ(to_json(v, indented), "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"é\": \"ü\\n\"\n}");
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": {"k": [1, {"n": 1e100}]}})"), R"({"k": [1, {"n": 1e+100}]})");
}

TEST(Whitespace, TrimAndLstripBlocks) {
  EXPECT_EQ(render("<ul>\n  {% for x in [1, 2] %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>"),
            "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("x {# note #}\ny"), "x y");
  EXPECT_EQ(render("line\r\n{% if true %}\r\nok\r\n{% endif %}\n"), "line\nok\n");  // CRLF and last newline
}

TEST(Scoping, LoopBodiesDoNotLeakAndEachIterationStartsFresh) {
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}|{{ x }}"), "0102|0");
  EXPECT_EQ(render("{% if true %}{% set y = 1 %}{% endif %}{{ y }}"), "1");  // if has no scope
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
            "6");
  EXPECT_EQ(render("{% set b %}{% set inner = 1 %}x{% endset %}{{ b }}[{{ inner }}]"), "x[]");
}

TEST(Scoping, MacrosSeeTheTemplateLevelNotTheCaller) {
  EXPECT_EQ(render("{% set g = 1 %}{% macro m() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ m() }}"), "2");
  EXPECT_EQ(render("{% macro m() %}[{{ i }}]{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}"), "[]");
  EXPECT_EQ(render("{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }}|{{ m(3, b=1) }}"), "3,6|3,1");
}

TEST(Loops, ElseRunsUnlessABodyCompletes) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1] %}{{ x }}{% else %}E{% endfor %}"), "1");
  EXPECT_EQ(render("{% for x in [1, 2] %}{{ x }}{% break %}{% else %}E{% endfor %}"), "1E");  // Jinja's quirk
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}"), "13");
}

TEST(Loops, LoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.revindex0 }}{{ loop.previtem }}{{ loop.nextitem }}"
                   "{{ 'F' if loop.first }}{{ 'L' if loop.last }}{{ loop.length }} {% endfor %}"),
            "12bF3 21ac3 30bL3 ");
  EXPECT_EQ(render("{% for x in [1, 1, 2] %}{{ loop.cycle('a', 'b') }}{{ loop.changed(x) }}{% endfor %}"),
            "aTruebFalseaTrue");
}

TEST(Undefined, PrintsEmptyAndFailsWhenUsedFurther) {
  EXPECT_EQ(render("[{{ missing }}][{{ d.nokey }}][{{ d.nokey is defined }}][{{ missing | default('x') }}]",
                   R"({"d": {}})"),
            "[][][False][x]");
  auto e = render_error("{{ missing.attr }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::undefined);
  EXPECT_EQ(e->message(), "'missing' is undefined");
  e = render_error("{{ d.a.b }}", R"({"d": {}})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "'dict object' has no attribute 'a'");
  e = render_error("{{ missing + 1 }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::undefined);
}

TEST(Errors, RuntimeErrorsNameTheTemplateLine) {
  auto e = render_error("line 1\n{% if true %}\n  {{ 1 + 'a' }}\n{% endif %}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->line(), 3);
  EXPECT_EQ(e->kind(), ErrorKind::type);
  EXPECT_STREQ(e->what(), "t.jinja:3: unsupported operand type(s) for +: 'int' and 'str'");
}

TEST(Errors, SyntaxErrorsNameTheLineAndTheOpenBlock) {
  auto e = render_error("{% for x in y %}\n{{ x }}\n");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::syntax);
  EXPECT_NE(std::string(e->what()).find("t.jinja:"), std::string::npos);
  EXPECT_NE(e->message().find("'for' on line 1"), std::string::npos) << e->message();
  EXPECT_NE(e->message().find("'endfor'"), std::string::npos) << e->message();

  e = render_error("{% if x %}\n\n{% endfor %}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->line(), 3);
  EXPECT_NE(e->message().find("'endfor'"), std::string::npos) << e->message();
  EXPECT_NE(e->message().find("'if' on line 1"), std::string::npos) << e->message();

  e = render_error("ok\n{{ x | no_such_filter }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->line(), 2);
  EXPECT_EQ(e->message(), "no filter named 'no_such_filter'");

  e = render_error("\n\n{{ 'unterminated }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->line(), 3);
  e = render_error("{{ (1 }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::syntax);
  e = render_error("{% include 'other.jinja' %}");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message().find("not supported"), std::string::npos);
}

TEST(Errors, MacroArgumentMistakes) {
  auto e = render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}"), "[]");  // missing args are undefined
}

TEST(Sandbox, NoAccessToInternals) {
  // Python's dunder attributes read as undefined; calling through them is a security error.
  EXPECT_EQ(render("[{{ ''.__class__ }}][{{ x.__dict__ }}][{{ range.__globals__ }}][{{ l.append }}]",
                   R"({"x": {}, "l": []})"),
            "[][][][]");
  for (const char* source : {"{{ ''.__class__.__mro__ }}", "{{ l.append(1) }}", "{{ x.update({'a': 1}) }}",
                             "{{ l.pop() }}", "{{ x.clear() }}"}) {
    auto e = render_error(source, R"({"x": {"a": 1}, "l": [1]})");
    ASSERT_TRUE(e) << source;
    EXPECT_EQ(e->kind(), ErrorKind::security) << source;
    EXPECT_NE(e->message().find("is unsafe"), std::string::npos) << e->message();
  }
}

TEST(Sandbox, ListsAndDictsCannotBeMutated) {
  // The values a template receives are shared with the caller; only namespaces change.
  const Value messages = Value::from_json(nlohmann::ordered_json::parse(R"([{"role": "user"}])"));
  Dict context;
  context.set(Value("messages"), messages);
  EXPECT_THROW(Template("{% set _ = messages.append(1) %}").render(context), Error);
  EXPECT_EQ(messages.as_list().size(), 1u);
}

TEST(Limits, RunawayTemplatesFailCleanly) {
  auto e = render_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::limit);
  e = render_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::syntax);
  e = render_error("{{ range(100001) | length }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::limit);
  e = render_error("{{ 'x' * 1000000000000 }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::limit);
  e = render_error("{{ 9223372036854775807 + 1 }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind(), ErrorKind::limit);
}

TEST(Markup, SafeStringsEscapeWhatTheyAreAddedTo) {
  EXPECT_EQ(render("{{ ('<b>' | safe) + '<i>' }}|{{ ('<b>' | safe) ~ '<i>' }}|{{ '<i>' | e }}"),
            "<b>&lt;i&gt;|<b><i>|&lt;i&gt;");
}

TEST(Lazy, GeneratorFiltersAreTruthyAndHaveNoLength) {
  EXPECT_EQ(render("{{ 'yes' if [] | select else 'no' }}|{{ [1, 2] | map('string') | join('-') }}"), "yes|1-2");
  auto e = render_error("{{ [1] | select | length }}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message(), "object of type 'generator' has no len()");
  EXPECT_EQ(render("{{ d.items() | list }}|{{ d.keys() }}", R"({"d": {"a": 1}})"), "[('a', 1)]|dict_keys(['a'])");
}

TEST(Statements, CallBlocksFilterBlocksWithAndGeneration) {
  EXPECT_EQ(render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}in{% endcall %}"), "[in]");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render("{% with a = 2 %}{{ a }}{% endwith %}[{{ a }}]"), "2[]");
  // transformers' {% generation %} marks assistant text for masks; it renders its body.
  EXPECT_EQ(render("{% generation %}text{% endgeneration %}"), "text");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Template, RendersAreIndependent) {
  Template t("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                   "t");
  Dict context;
  context.set(Value("messages"), Value(ValueList{Value(1), Value(2)}));
  EXPECT_EQ(t.render(context), "2");
  EXPECT_EQ(t.render(context), "2");
  Template moved = std::move(t);
  EXPECT_EQ(moved.render(context), "2");
}

TEST(Template, MacroClosuresAndCycles) {
  // A macro keeps the scope it was defined in; LeakSanitizer builds check the cycles are broken.
  // Like Jinja's Python closures, a macro sees the loop's current variables.
  EXPECT_EQ(render("{% set ns = namespace(m=none) %}{% for i in [1, 2] %}{% if ns.m %}{{ ns.m() }}{% endif %}"
                   "{% macro m() %}[{{ i }}]{% endmacro %}{% set ns.m = m %}{% endfor %}"),
            "[2]");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{% macro m() %}x{% endmacro %}{% set ns.m = m %}"
                   "{{ ns.me.m() }}{% for x in [1] %}{{ loop.changed(loop) }}{% endfor %}"),
            "xTrue");
}

TEST(Unicode, LengthsIndexesAndCaseAreByCodePoint) {
  EXPECT_EQ(render("{{ s | length }}|{{ s[1] }}|{{ s[::-1] }}|{{ s | upper }}|{{ 'straße' | upper }}",
                   R"({"s": "héllo🌍"})"),
            "6|é|🌍olléh|HÉLLO🌍|STRASSE");
  EXPECT_EQ(render("{{ '\u00a0x\u3000'.strip() }}|{{ 'a\u2028b'.splitlines() }}"), "x|['a', 'b']");
}

}  // namespace
}  // namespace qinfer::jinja
