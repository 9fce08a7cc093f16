// ChatTemplate: finding a model's template, the context transformers gives it, request
// validation with field-naming errors, and the request normalizations servers apply.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>

#include "jinja/jinja_test_util.h"
#include "tokenizer/chat_template.h"

namespace qinfer::tokenizer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using testing::jinja_data_dir;
using testing::read_file_bytes;

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("qinfer-chat-template-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  fs::path path_;
};

std::string render(const std::string& source, const json& request, const json& config = json::object()) {
  return ChatTemplate(source, "test.jinja", config).render(request);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const qinfer::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

const json kHello = json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");

TEST(ChatTemplate, ContextMatchesTransformers) {
  const std::string source =
      "{{ messages | length }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ bos_token }}|"
      "{{ eos_token }}|{{ pad_token }}|{{ enable_thinking is defined }}|{{ additional_special_tokens | length }}";
  const json config = json::parse(R"({"bos_token": null, "eos_token": "<|im_end|>",
      "pad_token": {"content": "<|endoftext|>", "lstrip": false}, "additional_special_tokens": ["<a>", {"content": "<b>"}]})");
  EXPECT_EQ(render(source, kHello, config), "1|None|None|True||<|im_end|>|<|endoftext|>|False|2");
  json request = kHello;
  request["chat_template_kwargs"] = {{"enable_thinking", false}, {"eos_token", "override"}};
  request["add_generation_prompt"] = false;
  request["tools"] = json::array();
  EXPECT_EQ(render(source, request, config), "1|[]|None|False||override|<|endoftext|>|True|2");
}

TEST(ChatTemplate, GlobalsRaiseExceptionAndStrftimeNow) {
  try {
    render("ok\n{{ raise_exception('bad request: ' ~ messages[0].role) }}", kHello);
    FAIL() << "no error";
  } catch (const jinja::Error& e) {
    EXPECT_EQ(e.kind(), jinja::ErrorKind::raised);
    EXPECT_EQ(e.message(), "bad request: user");
    EXPECT_EQ(e.line(), 2);
    EXPECT_STREQ(e.what(), "test.jinja:2: bad request: user");
  }
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}", kHello), std::to_string(1900 + local.tm_year));
}

TEST(ChatTemplate, NormalizesContentAndToolArguments) {
  const json request = json::parse(R"({"messages": [
      {"role": "user", "content": null},
      {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [true]}"}},
        {"type": "function", "function": {"name": "g", "arguments": ""}},
        {"type": "function", "function": {"name": "h", "arguments": {"x": null}}}]}]})");
  const std::string source =
      "{% for m in messages %}[{{ m.content is string }}{{ m.content | length }}]{% endfor %}"
      "{% for c in messages[1].tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}";
  EXPECT_EQ(render(source, request), R"([True0][True0]{"b": 1, "a": [true]};{};{"x": null};)");
}

TEST(ChatTemplate, RequestErrorsNameTheField) {
  const std::string t = "{{ messages }}";
  auto err = [&](const char* request) { return error_of([&] { render(t, json::parse(request)); }); };
  EXPECT_EQ(err(R"([])"), "request: expected a JSON object, got array");
  EXPECT_EQ(err(R"({})"), "request: missing \"messages\"");
  EXPECT_EQ(err(R"({"messages": {}})"), "request: messages: expected an array, got object");
  EXPECT_EQ(err(R"({"messages": []})"), "request: messages: must not be empty");
  EXPECT_EQ(err(R"({"messages": ["hi"]})"), "request: messages[0]: expected an object, got string");
  EXPECT_EQ(err(R"({"messages": [{"content": "x"}]})"), "request: messages[0].role: expected a string, got nothing");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": 5}]})"),
            "request: messages[0].content: expected a string or an array of content parts, got number");
  EXPECT_NE(err(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]})")
                .find("request: messages[0].tool_calls[0].function.arguments: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})"),
            "request: tools: expected an array, got object");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"})"),
            "request: add_generation_prompt: expected true or false, got string");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})"),
            "request: chat_template_kwargs: expected an object, got array");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}})"),
            "request: chat_template_kwargs.messages: set it as a top-level request field instead");
  EXPECT_NE(err(R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})")
                .find("cannot both be true"),
            std::string::npos);
}

TEST(ChatTemplate, ContinueFinalMessageCutsAfterTheLastText) {
  const std::string t = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}";
  const json request = json::parse(R"({"messages": [{"role": "user", "content": "hi"},
      {"role": "assistant", "content": "Once upon  "}], "add_generation_prompt": false, "continue_final_message": true})");
  EXPECT_EQ(render(t, request), "<user>hi</user><assistant>Once upon");
}

TEST(ChatTemplate, FromModelDirPrefersChatTemplateJinja) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": "config:{{ messages[0].content }}", "eos_token": "<e>"})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).render(kHello), "config:hi");
  dir.write("chat_template.jinja", "file:{{ messages[0].content }}{{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).render(kHello), "file:hi<e>");  // one trailing newline dropped
}

TEST(ChatTemplate, FromModelDirReadsProcessorTemplateAndNamedTemplates) {
  TempDir processor;
  processor.write("chat_template.json", R"({"chat_template": "vl:{{ messages | length }}"})");
  EXPECT_EQ(ChatTemplate::from_model_dir(processor.path()).render(kHello), "vl:1");

  TempDir named;
  named.write("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "plain"},
      {"name": "tool_use", "template": "tools:{{ tools | length }}"}]})");
  const ChatTemplate t = ChatTemplate::from_model_dir(named.path());
  EXPECT_EQ(t.render(kHello), "plain");
  json with_tools = kHello;
  with_tools["tools"] = json::array({json::object()});
  EXPECT_EQ(t.render(with_tools), "tools:1");
}

TEST(ChatTemplate, FromModelDirErrors) {
  TempDir empty;
  EXPECT_NE(error_of([&] { ChatTemplate::from_model_dir(empty.path()); }).find("no chat template"), std::string::npos);
  TempDir broken;
  broken.write("tokenizer_config.json", "{not json");
  EXPECT_NE(error_of([&] { ChatTemplate::from_model_dir(broken.path()); }).find("not valid JSON"), std::string::npos);
  TempDir bad_template;
  bad_template.write("chat_template.jinja", "line 1\n{% if x %}\nno end");
  const std::string e = error_of([&] { ChatTemplate::from_model_dir(bad_template.path()); });
  EXPECT_NE(e.find("chat_template.jinja:"), std::string::npos) << e;
  EXPECT_NE(e.find("'if' on line 2"), std::string::npos) << e;
  TempDir not_utf8;
  not_utf8.write("chat_template.jinja", "\xff\xfe");
  EXPECT_NE(error_of([&] { ChatTemplate::from_model_dir(not_utf8.path()); }).find("not valid UTF-8"), std::string::npos);
}

TEST(ChatTemplate, Qwen3TemplateFromItsTokenizerConfig) {
  // The real Qwen3 template: thinking off, one user turn.
  json config = testing::read_ordered_json(jinja_data_dir() / "tokenizer_config.json");
  config["chat_template"] = read_file_bytes(jinja_data_dir() / "qwen3.jinja");
  TempDir dir;
  dir.write("tokenizer_config.json", config.dump());
  json request = kHello;
  request["chat_template_kwargs"] = {{"enable_thinking", false}};
  EXPECT_EQ(ChatTemplate::from_model_dir(dir.path()).render(request),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace qinfer::tokenizer
