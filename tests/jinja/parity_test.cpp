// Byte-for-byte parity with Python Jinja2 as transformers configures it. The expected outputs were
// written by tools/jinja_reference.py; every (template, request) pair and every engine snippet is
// its own test case.
#include <gtest/gtest.h>

#include <algorithm>

#include "jinja/jinja_test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/template.h"

namespace qinfer {
namespace {

namespace fs = std::filesystem;
using testing::jinja_data_dir;
using testing::read_file_bytes;
using testing::read_ordered_json;

struct ChatCase {
  std::string template_name, request_name;
};

std::vector<ChatCase> chat_cases() {
  std::vector<fs::path> templates, requests;
  if (!fs::exists(jinja_data_dir() / "requests")) return {};
  for (const auto& e : fs::directory_iterator(jinja_data_dir()))
    if (e.path().extension() == ".jinja") templates.push_back(e.path());
  for (const auto& e : fs::directory_iterator(jinja_data_dir() / "requests")) requests.push_back(e.path());
  std::sort(templates.begin(), templates.end());
  std::sort(requests.begin(), requests.end());
  std::vector<ChatCase> cases;
  for (const auto& t : templates)
    for (const auto& r : requests) cases.push_back({t.stem().string(), r.stem().string()});
  return cases;
}

void PrintTo(const ChatCase& c, std::ostream* os) { *os << c.template_name << " x " << c.request_name; }

class ChatTemplateParity : public ::testing::TestWithParam<ChatCase> {};

TEST_P(ChatTemplateParity, MatchesPythonJinja) {
  const ChatCase& c = GetParam();
  const fs::path dir = jinja_data_dir();
  const tokenizer::ChatTemplate chat(read_file_bytes(dir / (c.template_name + ".jinja")), c.template_name + ".jinja",
                                     read_ordered_json(dir / "tokenizer_config.json"));
  const auto request = read_ordered_json(dir / "requests" / (c.request_name + ".json"));
  const fs::path stem = dir / "expected" / (c.template_name + "__" + c.request_name);
  if (fs::exists(stem.string() + ".txt")) {
    const std::string expected = read_file_bytes(stem.string() + ".txt");
    EXPECT_EQ(chat.render(request), expected);
    return;
  }
  ASSERT_TRUE(fs::exists(stem.string() + ".error")) << "no expected output for " << stem;
  const std::string python_error = read_file_bytes(stem.string() + ".error");
  try {
    const std::string prompt = chat.render(request);
    ADD_FAILURE() << "Python failed with " << python_error << "but we rendered:\n" << prompt;
  } catch (const jinja::Error& e) {
    // raise_exception() must come through as the template's own message.
    if (python_error.starts_with("TemplateRaised: ")) {
      EXPECT_EQ(e.kind(), jinja::ErrorKind::raised) << e.what();
      EXPECT_EQ(e.message() + "\n", python_error.substr(16));
    }
    EXPECT_GT(e.line(), 0) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatTemplateParity, ::testing::ValuesIn(chat_cases()),
                         [](const ::testing::TestParamInfo<ChatCase>& info) {
                           return info.param.template_name + "_" + info.param.request_name;
                         });

TEST(ChatTemplateParityData, CoversTheRequiredCases) {
  // The issue asks for >= 25 requests over two templates, with expected outputs for every pair.
  const auto cases = chat_cases();
  EXPECT_GE(cases.size(), 2u * 25u);
  size_t prompts = 0;
  for (const auto& c : cases)
    prompts += fs::exists(jinja_data_dir() / "expected" / (c.template_name + "__" + c.request_name + ".txt"));
  EXPECT_GE(prompts, cases.size() - 10);
}

// raise_exception as the reference script installs it (strftime_now is tested in chat_template_test).
jinja::Dict with_globals(const nlohmann::ordered_json& context) {
  jinja::Dict globals = jinja::Value::from_json(context).as_dict();
  globals.set(jinja::Value("raise_exception"),
              jinja::Value(std::make_shared<jinja::Function>(jinja::Function{
                  "raise_exception", [](jinja::CallArgs& a) -> jinja::Value {
                    throw jinja::Error(jinja::ErrorKind::raised, jinja::to_str(a.positional.at(0)));
                  }})));
  return globals;
}

struct Snippet {
  std::string name;
  nlohmann::ordered_json data;
};

const nlohmann::ordered_json& snippet_file() {
  static const auto file = read_ordered_json(jinja_data_dir() / "expected" / "snippets.json");
  return file;
}

std::vector<Snippet> snippets() {
  std::vector<Snippet> out;
  if (!snippet_file().is_object()) return out;
  for (const auto& s : snippet_file()["cases"]) out.push_back({s["name"].get<std::string>(), s});
  return out;
}

TEST(SnippetParityData, IsPresent) { EXPECT_GE(snippets().size(), 100u); }

void PrintTo(const Snippet& s, std::ostream* os) { *os << s.name; }

class SnippetParity : public ::testing::TestWithParam<Snippet> {};

TEST_P(SnippetParity, MatchesPythonJinja) {
  const auto& s = GetParam().data;
  const std::string source = s["template"].get<std::string>();
  const jinja::Dict globals = with_globals(snippet_file()["context"]);
  if (s.contains("output")) {
    try {
      EXPECT_EQ(jinja::Template(source, "snippet").render(globals), s["output"].get<std::string>()) << source;
    } catch (const jinja::Error& e) {
      ADD_FAILURE() << "unexpected error: " << e.what() << "\ntemplate: " << source;
    }
    return;
  }
  const std::string python = s["error"].get<std::string>();
  const std::string python_type = python.substr(0, python.find(':'));
  const std::string python_message = python.substr(python.find(':') + 2);
  try {
    const std::string out = jinja::Template(source, "snippet").render(globals);
    ADD_FAILURE() << "Python raised " << python << " but we rendered: " << out;
  } catch (const jinja::Error& e) {
    if (python_type == "TemplateSyntaxError" || python_type == "TemplateAssertionError") {
      EXPECT_EQ(e.kind(), jinja::ErrorKind::syntax) << e.what();
    } else {
      // Runtime errors carry Python's own message.
      EXPECT_EQ(e.message(), python_message) << python;
    }
    if (python_type == "TemplateRaised") {
      EXPECT_EQ(e.kind(), jinja::ErrorKind::raised);
    } else if (python_type == "UndefinedError") {
      EXPECT_EQ(e.kind(), jinja::ErrorKind::undefined);
    } else if (python_type == "SecurityError") {
      EXPECT_EQ(e.kind(), jinja::ErrorKind::security);
    }
    EXPECT_GT(e.line(), 0) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Engine, SnippetParity, ::testing::ValuesIn(snippets()),
                         [](const ::testing::TestParamInfo<Snippet>& info) { return info.param.name; });

// Seeded random templates (tools/jinja_reference.py): same output, or an error in both engines.
class RandomCorpus : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomCorpus, MatchesPythonJinja) {
  static const auto file = read_ordered_json(jinja_data_dir() / "expected" / "random.json");
  ASSERT_TRUE(file.is_object()) << "missing tests/jinja/data/expected/random.json";
  const jinja::Dict globals = with_globals(file["context"]);
  const auto& cases = file["cases"][GetParam()];
  ASSERT_GE(cases.size(), 100u);
  int mismatches = 0;
  for (const auto& c : cases) {
    const std::string source = c["template"].get<std::string>();
    std::string got;
    bool failed = false;
    try {
      got = jinja::Template(source, "random").render(globals);
    } catch (const jinja::Error& e) {
      failed = true;
      got = e.what();
    }
    const bool python_failed = c.contains("error");
    if (failed != python_failed || (!failed && got != c["output"].get<std::string>())) {
      if (++mismatches <= 5)
        ADD_FAILURE() << "template: " << source << "\nPython: " << (python_failed ? c["error"] : c["output"]).dump()
                      << "\nqinfer: " << got;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size();
}

INSTANTIATE_TEST_SUITE_P(Engine, RandomCorpus, ::testing::Values("whitespace", "expressions", "statements"));

}  // namespace
}  // namespace qinfer
