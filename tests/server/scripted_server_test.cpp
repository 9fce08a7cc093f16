// The HTTP layer end to end over real sockets, with a scripted generator standing in for the
// model where a random-weight model cannot be made to produce the case: streamed tool calls in
// both formats, reasoning, a client leaving mid-stream, errors during generation, shutdown. Also
// the malformed-request corpus, auth and the queue-full answer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "server/server.h"
#include "server_test_util.h"

namespace qinfer::server::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

const tokenizer::Tokenizer& mini_tokenizer() {
  static const tokenizer::Tokenizer t =
      tokenizer::Tokenizer::load(repo_root() / "tests" / "tokenizer" / "data" / "qwen35_mini");
  return t;
}

// A chat template from tests/jinja/data (qwen3.jinja: Hermes tool calls; qwen35_features.jinja: XML).
struct Template {
  explicit Template(const std::string& file)
      : source(read_file(repo_root() / "tests" / "jinja" / "data" / file)),
        chat(source, file, json::parse(read_file(repo_root() / "tests" / "jinja" / "data" / "tokenizer_config.json"))) {
  }
  // A template given as text (`name` stands for its file in errors).
  Template(const std::string& name, std::string text)
      : source(std::move(text)), chat(source, name) {}
  std::string source;
  tokenizer::ChatTemplate chat;
};

const Template& qwen3_template() {
  static const Template t("qwen3.jinja");
  return t;
}
const Template& qwen35_template() {
  static const Template t("qwen35_features.jinja");
  return t;
}

struct ScriptedServer {
  explicit ScriptedServer(const Template& tmpl = qwen3_template(), ServerOptions options = {}) {
    ServedModel model;
    model.name = "scripted";
    model.tokenizer = &mini_tokenizer();
    model.chat_template = &tmpl.chat;
    model.chat_template_source = tmpl.source;
    model.max_context = 4096;
    options.port = 0;
    options.max_body_bytes = 1 << 20;
    options.http_threads = 16;
    server = std::make_unique<Server>(options, model, generator);
    port = server->start();
  }
  HttpResponse post(const std::string& path, const json& body, const std::vector<std::string>& headers = {}) {
    return fetch(port, "POST", path, dump(body), headers);
  }
  ScriptedGenerator generator;
  std::unique_ptr<Server> server;
  int port = 0;
};

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
  "required": ["city"]}}}])");

json chat_body(bool stream) {
  json body = {{"model", "scripted"}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
  if (stream) body["stream"] = true;
  return body;
}

// What a client assembles from a chat stream, per choice.
struct Assembled {
  std::string role, reasoning, content, finish_reason;
  std::vector<json> calls;  // {id, name, arguments}
  bool done = false;
  json usage;
};

Assembled assemble(const std::string& body) {
  Assembled a;
  for (const json& p : sse_payloads(body)) {
    if (p == "[DONE]") {
      a.done = true;
      continue;
    }
    EXPECT_FALSE(a.done) << "data after [DONE]";
    if (p.contains("usage") && !p["usage"].is_null()) a.usage = p["usage"];
    if (p.contains("error")) ADD_FAILURE() << "error event: " << dump(p);
    if (!p.contains("choices") || p["choices"].empty()) continue;
    const json& choice = p["choices"][0];
    const json& d = choice["delta"];
    if (d.contains("role")) a.role = d["role"];
    if (d.contains("reasoning_content")) a.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) a.content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const json& c : d["tool_calls"]) {
        const size_t index = c["index"];
        if (c.contains("id")) {
          EXPECT_EQ(index, a.calls.size());
          a.calls.push_back({{"id", c["id"]}, {"name", c["function"]["name"]}, {"arguments", ""}});
        }
        EXPECT_LT(index, a.calls.size());
        if (index < a.calls.size())
          a.calls[index]["arguments"] =
              a.calls[index]["arguments"].get<std::string>() + c["function"]["arguments"].get<std::string>();
      }
    if (!choice["finish_reason"].is_null()) a.finish_reason = choice["finish_reason"];
  }
  return a;
}

// Splits text into pieces of `size` bytes (tags land across pieces).
std::vector<std::string> pieces(const std::string& text, size_t size) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size(); i += size) out.push_back(text.substr(i, size));
  return out;
}

TEST(ScriptedServer, StreamedHermesToolCall) {
  ScriptedServer s;
  const std::string output =
      "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
  s.generator.set_script({pieces(output, 5)});
  json body = chat_body(true);
  body["tools"] = kTools;
  body["stream_options"] = {{"include_usage", true}};
  const HttpResponse r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.header("content-type"), HasSubstr("text/event-stream"));
  const Assembled a = assemble(r.body);
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.role, "assistant");
  EXPECT_EQ(a.reasoning, "The user wants the weather.");
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0]["name"], "get_weather");
  EXPECT_EQ(json::parse(a.calls[0]["arguments"].get<std::string>()), (json{{"city", "Paris"}, {"days", 2}}));
  EXPECT_TRUE(a.calls[0]["id"].get<std::string>().starts_with("call_"));
  EXPECT_EQ(a.finish_reason, "tool_calls");
  ASSERT_TRUE(a.usage.is_object());
  EXPECT_EQ(a.usage["completion_tokens"], static_cast<int>(pieces(output, 5).size()));
  // The tools went into the prompt the model saw (Qwen3's template lists them in <tools>).
  const auto submitted = s.generator.submitted();
  ASSERT_EQ(submitted.size(), 1u);
  EXPECT_THAT(mini_tokenizer().decode(submitted[0].prompt), HasSubstr("\"name\": \"get_weather\""));
}

TEST(ScriptedServer, XmlToolCallsAndReasoningNonStreaming) {
  ScriptedServer s(qwen35_template());
  // Qwen3.5: the prompt opened <think>; two calls in one turn.
  const std::string output =
      "Two lookups.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
  s.generator.set_script({pieces(output, 3)});
  json body = chat_body(false);
  body["tools"] = kTools;
  const HttpResponse r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.body_json();
  const json& message = j["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "Two lookups.");
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            (json{{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(json::parse(message["tool_calls"][1]["function"]["arguments"].get<std::string>()),
            (json{{"city", "Rome"}}));
  EXPECT_NE(message["tool_calls"][0]["id"], message["tool_calls"][1]["id"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  // And streamed, byte by byte.
  s.generator.set_script({pieces(output, 1)});
  body["stream"] = true;
  const Assembled a = assemble(s.post("/v1/chat/completions", body).body);
  EXPECT_EQ(a.reasoning, "Two lookups.");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_EQ(json::parse(a.calls[1]["arguments"].get<std::string>()), (json{{"city", "Rome"}}));
  EXPECT_EQ(a.finish_reason, "tool_calls");
}

// Whether the request's constraint allows the whole text (as the engine would run it).
bool constraint_allows(const engine::RequestParams& p, std::string_view text) {
  if (!p.constraint) return true;
  grammar::Matcher m(p.constraint->grammar());
  return m.advance(text) && m.accepting();
}

TEST(ScriptedServer, ToolChoiceConstrainsTheAnswer) {
  ScriptedServer s(qwen35_template());
  const std::string oslo =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
  const std::string reasoning = "The user wants the weather.\n</think>\n\n";
  s.generator.set_script({{reasoning + oslo}});
  json body = chat_body(false);
  body["tools"] = kTools;
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  HttpResponse r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  // The prompt is the template's (reasoning left open); the grammar makes the answer the named call.
  const engine::RequestParams named = s.generator.submitted().back();
  EXPECT_TRUE(mini_tokenizer().decode(named.prompt).ends_with("<think>\n"));
  EXPECT_TRUE(constraint_allows(named, reasoning + oslo));
  EXPECT_FALSE(constraint_allows(named, reasoning + "Sunny."));
  EXPECT_FALSE(constraint_allows(named, reasoning + oslo + "\n" + oslo));  // one call
  const json message = r.body_json()["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "The user wants the weather.");
  const json call = message["tool_calls"][0];
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), (json{{"city", "Oslo"}}));

  body["tool_choice"] = "none";
  s.generator.set_script({{"Sunny."}});
  r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(mini_tokenizer().decode(s.generator.submitted().back().prompt), ::testing::Not(HasSubstr("get_weather")));
  EXPECT_EQ(s.generator.submitted().back().constraint, nullptr);
  EXPECT_EQ(r.body_json()["choices"][0]["message"]["reasoning_content"], "Sunny.");  // the block never closed

  body["tool_choice"] = "required";
  s.generator.set_script({{reasoning + oslo}});
  r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  const engine::RequestParams required = s.generator.submitted().back();
  EXPECT_TRUE(constraint_allows(required, reasoning + oslo + "\n" + oslo));
  EXPECT_FALSE(constraint_allows(required, reasoning + "Sunny."));
  EXPECT_EQ(r.body_json()["choices"][0]["finish_reason"], "tool_calls");

  body["tool_choice"] = "auto";
  body["parallel_tool_calls"] = false;
  r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  const engine::RequestParams automatic = s.generator.submitted().back();
  EXPECT_TRUE(constraint_allows(automatic, reasoning + "Sunny."));
  EXPECT_TRUE(constraint_allows(automatic, reasoning + "Let me look.\n" + oslo));
  EXPECT_FALSE(constraint_allows(automatic, reasoning + oslo + "\n" + oslo));  // parallel_tool_calls false
  EXPECT_FALSE(constraint_allows(
      automatic, reasoning + "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"));  // undeclared

  // A strict tool whose schema the grammar cannot follow is refused, naming it.
  body["tools"][0]["function"]["strict"] = true;
  body["tools"][0]["function"]["parameters"]["properties"]["city"]["pattern"] = "^[A-Z]";
  r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("tools[0].function.parameters"));
  EXPECT_THAT(r.body, HasSubstr("pattern"));
  body["tools"][0]["function"]["strict"] = "yes";
  r = s.post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("tools[0].function.strict"));
}

// vLLM's stop_token_ids, min_tokens and include_stop_str_in_output reach the engine (which applies
// them: tests/engine), and bad values are 400s naming them.
TEST(ScriptedServer, StopTokenIdsMinTokensAndIncludedStopStrings) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  json body = chat_body(false);
  body["stop_token_ids"] = {5, 7, 5};
  body["min_tokens"] = 3;
  body["max_tokens"] = 10;
  body["include_stop_str_in_output"] = true;
  ASSERT_EQ(s.post("/v1/chat/completions", body).status, 200);
  const engine::RequestParams p = s.generator.submitted().back();
  EXPECT_EQ(std::count(p.stop_ids.begin(), p.stop_ids.end(), 5), 1);
  EXPECT_EQ(std::count(p.stop_ids.begin(), p.stop_ids.end(), 7), 1);
  EXPECT_EQ(p.min_tokens, 3);
  EXPECT_TRUE(p.include_stop_str);
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"stop_token_ids", json{-1}}, {"stop_token_ids", json{999999}}, {"stop_token_ids", "5"},
           {"min_tokens", 11}, {"min_tokens", -1}, {"include_stop_str_in_output", "yes"}}) {
    json bad = body;
    bad[field] = value;
    const HttpResponse r = s.post("/v1/chat/completions", bad);
    EXPECT_EQ(r.status, 400) << field << " " << value.dump();
    EXPECT_THAT(r.body, HasSubstr(field)) << r.body;
  }
}

// Peer fields the server does not implement are 400s naming them, unless they ask for the default.
TEST(ScriptedServer, UnimplementedPeerFieldsAreRefusedUnlessDefault) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  const std::vector<std::pair<std::string, json>> refused = {
      {"use_beam_search", true},         {"length_penalty", 0.5},
      {"allowed_token_ids", {1, 2}},     {"bad_words", {"x"}},             {"logits_processors", {"p"}},
      {"truncate_prompt_tokens", 10},    {"skip_special_tokens", false},   {"spaces_between_special_tokens", false},
      {"priority", 1},                   {"prediction", {{"type", "content"}}}, {"audio", {{"voice", "x"}}},
      {"web_search_options", json::object({{"a", 1}})}, {"reasoning_effort", "low"}, {"store", true},
      {"metadata", {{"k", "v"}}},        {"modalities", {"text", "audio"}}, {"service_tier", "flex"}};
  for (const auto& [field, value] : refused) {
    json body = chat_body(false);
    body[field] = value;
    const HttpResponse r = s.post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_THAT(r.body, HasSubstr(field)) << r.body;
  }
  const std::vector<std::pair<std::string, json>> defaults = {
      {"use_beam_search", false}, {"length_penalty", 1}, {"allowed_token_ids", json::array()},
      {"skip_special_tokens", true}, {"priority", 0}, {"store", false}, {"modalities", {"text"}},
      {"service_tier", "auto"}, {"add_special_tokens", false}};
  json body = chat_body(false);
  for (const auto& [field, value] : defaults) body[field] = value;
  EXPECT_EQ(s.post("/v1/chat/completions", body).status, 200);
}

// vLLM's /tokenize and /detokenize: a prompt, or messages giving exactly the ids a chat request
// submits; ids back to text; errors naming the field; the API key guards them.
TEST(ScriptedServer, TokenizeAndDetokenize) {
  ScriptedServer s(qwen3_template());
  s.generator.set_script({{"ok"}});
  HttpResponse r = s.post("/tokenize", {{"prompt", "hello world"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<int32_t> ids = mini_tokenizer().encode("hello world", true);
  EXPECT_EQ(r.body_json()["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(r.body_json()["count"], ids.size());
  EXPECT_EQ(r.body_json()["max_model_len"], 4096);
  // Messages: the ids a chat completion with the same messages starts from.
  const json messages = chat_body(false)["messages"];
  ASSERT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200);
  r = s.post("/tokenize", {{"messages", messages}, {"model", "scripted"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body_json()["tokens"].get<std::vector<int32_t>>(), s.generator.submitted().back().prompt);
  r = s.post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body_json()["prompt"], "hello world");

  EXPECT_EQ(s.post("/detokenize", {{"tokens", {1, 9999999}}}).status, 400);
  EXPECT_EQ(s.post("/detokenize", {{"tokens", "abc"}}).status, 400);
  EXPECT_EQ(s.post("/tokenize", {{"prompt", "a"}, {"messages", messages}}).status, 400);
  EXPECT_EQ(s.post("/tokenize", json::object()).status, 400);
  EXPECT_EQ(s.post("/tokenize", {{"prompt", 5}}).status, 400);
  EXPECT_EQ(s.post("/tokenize", {{"prompt", "a"}, {"return_token_strs", true}}).status, 400);
  EXPECT_EQ(s.post("/tokenize", {{"prompt", "a"}, {"model", "gpt-4"}}).status, 404);

  ServerOptions guarded;
  guarded.api_key = "k";
  ScriptedServer g(qwen3_template(), guarded);
  EXPECT_EQ(g.post("/tokenize", {{"prompt", "a"}}).status, 401);
  EXPECT_EQ(g.post("/detokenize", {{"tokens", {1}}}).status, 401);
  EXPECT_EQ(g.post("/tokenize", {{"prompt", "a"}}, {"Authorization: Bearer k"}).status, 200);
}

// system_fingerprint: one value per served configuration, in responses and in every chunk.
TEST(ScriptedServer, SystemFingerprint) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  const json a = s.post("/v1/chat/completions", chat_body(false)).body_json();
  const json b = s.post("/v1/completions", {{"prompt", "hi"}}).body_json();
  ASSERT_TRUE(a["system_fingerprint"].is_string()) << a.dump();
  EXPECT_TRUE(a["system_fingerprint"].get<std::string>().starts_with("fp_"));
  EXPECT_EQ(a["system_fingerprint"], b["system_fingerprint"]);
  const HttpResponse streamed = s.post("/v1/chat/completions", chat_body(true));
  EXPECT_THAT(streamed.body, HasSubstr("\"system_fingerprint\":\"" + a["system_fingerprint"].get<std::string>()));
}

// Only application/json bodies are read: a browser's cross-site text/plain or form POST gets 415.
TEST(ScriptedServer, BodiesMustBeSentAsJson) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  const std::string body = dump(chat_body(false));
  auto post_as = [&](const std::string& content_type) {
    RawConnection c(s.port);
    std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (!content_type.empty()) request += "Content-Type: " + content_type + "\r\n";
    c.send(request + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    return parse_http(c.read_all());
  };
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""}) {
    const HttpResponse r = post_as(type);
    EXPECT_EQ(r.status, 415) << type;
    EXPECT_THAT(r.body, HasSubstr("application/json")) << r.body;
  }
  EXPECT_EQ(post_as("application/json").status, 200);
  EXPECT_EQ(post_as("Application/JSON; charset=utf-8").status, 200);
  EXPECT_EQ(fetch(s.port, "GET", "/health").status, 200);  // GETs carry no body
}

// A loopback server answers only loopback Host names (and those --allowed-hosts adds): a web page
// cannot reach it through DNS rebinding.
TEST(ScriptedServer, LoopbackServersCheckTheHostHeader) {
  auto get_with_host = [](int port, const std::string& host) {
    RawConnection c(port);
    c.send("GET /v1/models HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n");
    return parse_http(c.read_all());
  };
  ScriptedServer s;
  for (const std::string host : {"127.0.0.1", "localhost:8000", "LOCALHOST", "[::1]:80", "127.1.2.3:9"})
    EXPECT_EQ(get_with_host(s.port, host).status, 200) << host;
  for (const std::string host : {"evil.example", "127.evil.example", "localhost.evil.example:8000", "[::2]"}) {
    const HttpResponse r = get_with_host(s.port, host);
    EXPECT_EQ(r.status, 403) << host;
    EXPECT_THAT(r.body, HasSubstr("--allowed-hosts")) << r.body;
  }
  ServerOptions proxied;
  proxied.allowed_hosts = {"api.example.com"};
  ScriptedServer p(qwen3_template(), proxied);
  EXPECT_EQ(get_with_host(p.port, "api.example.com:443").status, 200);
  EXPECT_EQ(get_with_host(p.port, "localhost").status, 200);
  EXPECT_EQ(get_with_host(p.port, "other.example.com").status, 403);
  ServerOptions any;
  any.allowed_hosts = {"*"};
  ScriptedServer a(qwen3_template(), any);
  EXPECT_EQ(get_with_host(a.port, "anything.example").status, 200);
}

// Anthropic events: (name, data) in order.
std::vector<std::pair<std::string, json>> anthropic_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string e = body.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = e.find('\n');
    if (!e.starts_with("event: ") || nl == std::string::npos || e.compare(nl + 1, 6, "data: ") != 0) continue;
    out.emplace_back(e.substr(7, nl - 7), json::parse(e.substr(nl + 7), nullptr, false));
  }
  return out;
}

// /v1/messages: reasoning, then a tool call, streamed as Anthropic's events (thinking and tool_use
// blocks, input_json_delta) and whole as a message; the key may come as x-api-key.
TEST(ScriptedServer, AnthropicMessagesWithThinkingAndToolUse) {
  ServerOptions options;
  options.api_key = "k";
  ScriptedServer s(qwen3_template(), options);
  const std::string output =
      "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
  s.generator.set_script({pieces(output, 5)});
  const json body = {{"model", "scripted"}, {"max_tokens", 100},
                     {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                     {"tools", {{{"name", "get_weather"}, {"input_schema", kTools[0]["function"]["parameters"]}}}}};
  const HttpResponse whole = s.post("/v1/messages", body, {"x-api-key: k"});
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json m = whole.body_json();
  EXPECT_EQ(m["type"], "message");
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "The user wants the weather.");
  EXPECT_EQ(m["content"][1]["type"], "tool_use");
  EXPECT_EQ(m["content"][1]["name"], "get_weather");
  EXPECT_EQ(m["content"][1]["input"].dump(), R"({"city":"Paris","days":2})");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["usage"]["output_tokens"], static_cast<int>(pieces(output, 5).size()));

  json streamed = body;
  streamed["stream"] = true;
  const HttpResponse r = s.post("/v1/messages", streamed, {"x-api-key: k"});
  ASSERT_EQ(r.status, 200) << r.body;
  const auto events = anthropic_events(r.body);
  std::vector<std::string> names;
  std::string thinking, input;
  for (const auto& e : events) {
    names.push_back(e.first);
    EXPECT_EQ(e.second["type"], e.first);  // the event line names the data's type
    if (e.first == "content_block_delta" && e.second["delta"]["type"] == "thinking_delta")
      thinking += e.second["delta"]["thinking"].get<std::string>();
    if (e.first == "content_block_delta" && e.second["delta"]["type"] == "input_json_delta")
      input += e.second["delta"]["partial_json"].get<std::string>();
  }
  ASSERT_GE(names.size(), 8u);
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[1], "ping");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(events[names.size() - 2].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(thinking, "The user wants the weather.");
  EXPECT_EQ(json::parse(input), (json{{"city", "Paris"}, {"days", 2}}));
  int starts = 0;
  for (const auto& e : events)
    if (e.first == "content_block_start") {
      EXPECT_EQ(e.second["index"], starts++);
      if (starts == 2) {
        EXPECT_EQ(e.second["content_block"]["type"], "tool_use");
        EXPECT_EQ(e.second["content_block"]["name"], "get_weather");
      }
    }
  EXPECT_EQ(starts, 2);

  // Refusals in Anthropic's error shape, naming the field.
  json unknown = body;
  unknown["container"] = "c";
  const HttpResponse refused = s.post("/v1/messages", unknown, {"x-api-key: k"});
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.body_json()["type"], "error");
  EXPECT_EQ(refused.body_json()["error"]["type"], "invalid_request_error");
  EXPECT_THAT(refused.body_json()["error"]["message"].get<std::string>(), HasSubstr("container"));
  const HttpResponse unauthorized = s.post("/v1/messages", body, {"x-api-key: wrong"});
  EXPECT_EQ(unauthorized.status, 401);
  EXPECT_EQ(unauthorized.body_json()["error"]["type"], "authentication_error");
}

// vLLM's stop_reason: the stop string that ended a choice, null otherwise.
TEST(ScriptedServer, ChoicesNameTheStopStringThatEndedThem) {
  ScriptedServer s;
  s.generator.set_script({{"a"}});
  const json r = s.post("/v1/completions", json{{"prompt", "hi"}}).body_json();
  EXPECT_TRUE(r["choices"][0].contains("stop_reason"));
  EXPECT_TRUE(r["choices"][0]["stop_reason"].is_null());
}

// A chat template that would run for hours or fill memory is stopped by its render limits: a 400
// naming the template line, in about a second, and the server goes on.
TEST(ScriptedServer, RunawayTemplatesAre400NamingTheirLine) {
  const Template loops("chat_template.jinja", "{{ 'x' }}\n{% for i in range(100000) %}{% for j in range(100000) %}"
                                              "{% endfor %}{% endfor %}");
  const Template bomb("chat_template.jinja", "{% set ns = namespace(s='x') %}\n\n{% for i in range(64) %}"
                                             "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}");
  for (const Template* t : {&loops, &bomb}) {
    ScriptedServer s(*t);
    s.generator.set_script({{"fine"}});
    const auto start = std::chrono::steady_clock::now();
    const HttpResponse r = s.post("/v1/chat/completions", chat_body(false));
#if !defined(QINFER_SANITIZE)  // ~10x slower there
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
#endif
    EXPECT_EQ(r.status, 400) << r.body;
    const std::string message = r.body_json()["error"]["message"].get<std::string>();
    EXPECT_THAT(message, HasSubstr(t == &loops ? "chat_template.jinja:2" : "chat_template.jinja:3"));
    EXPECT_THAT(message, HasSubstr("limit ("));
    EXPECT_EQ(fetch(s.port, "GET", "/health").status, 200);
  }
}

// A client that gives up on a non-streamed request (a timeout) frees the sequence within a step,
// not at max_tokens; /metrics counts it as cancelled.
TEST(ScriptedServer, ClientLeavingANonStreamedRequestCancelsIt) {
  ScriptedServer s;
  s.generator.set_script({std::vector<std::string>(2000, "tok "), "stop", 5ms});
  auto c = std::make_unique<RawConnection>(s.port);
  c->send(http_request("POST", "/v1/completions", dump(json{{"prompt", "hi"}, {"max_tokens", 2000}})));
  const auto start = std::chrono::steady_clock::now();
  while (s.generator.running() == 0 && std::chrono::steady_clock::now() - start < 2s) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(s.generator.running(), 1);
  const auto left = std::chrono::steady_clock::now();
  c.reset();
  while (s.generator.running() > 0 && std::chrono::steady_clock::now() - left < 2s) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(s.generator.running(), 0);
  EXPECT_EQ(s.generator.cancels(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - left, 100ms);  // a step is 5 ms here
  EXPECT_THAT(fetch(s.port, "GET", "/metrics").body, HasSubstr("qinfer_choices_finished_total{reason=\"cancelled\"} 1"));
  s.generator.set_script({{"fine"}});
  EXPECT_EQ(s.post("/v1/completions", json{{"prompt", "hi"}}).status, 200);
}

// CORS is off unless --allowed-origins names the page's origin; then preflights are answered (before
// the API key, which a preflight never carries) and answers name the origin.
TEST(ScriptedServer, CrossOriginCallsOnlyFromAllowedOrigins) {
  ServerOptions options;
  options.allowed_origins = {"http://app.example:3000"};
  options.api_key = "k";
  ScriptedServer s(qwen3_template(), options);
  s.generator.set_script({{"hi"}});
  const HttpResponse preflight =
      fetch(s.port, "OPTIONS", "/v1/chat/completions", "",
            {"Origin: http://app.example:3000", "Access-Control-Request-Method: POST",
             "Access-Control-Request-Headers: authorization, content-type, x-stainless-os"});
  EXPECT_EQ(preflight.status, 204);
  EXPECT_EQ(preflight.header("access-control-allow-origin"), "http://app.example:3000");
  EXPECT_THAT(preflight.header("access-control-allow-methods"), HasSubstr("POST"));
  EXPECT_EQ(preflight.header("access-control-allow-headers"), "authorization, content-type, x-stainless-os");
  for (const bool stream : {false, true}) {
    const HttpResponse r = s.post("/v1/chat/completions", chat_body(stream),
                                  {"Origin: http://app.example:3000", "Authorization: Bearer k"});
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.header("access-control-allow-origin"), "http://app.example:3000");
    EXPECT_EQ(r.header("vary"), "Origin");
  }
  // An error keeps the header, so the page can read why.
  const HttpResponse denied = s.post("/v1/chat/completions", chat_body(false), {"Origin: http://app.example:3000"});
  EXPECT_EQ(denied.status, 401);
  EXPECT_EQ(denied.header("access-control-allow-origin"), "http://app.example:3000");
  // Another origin gets no CORS answer: the browser keeps the response from the page.
  const HttpResponse other = fetch(s.port, "OPTIONS", "/v1/chat/completions", "",
                                   {"Origin: http://evil.example", "Access-Control-Request-Method: POST"});
  EXPECT_NE(other.status, 204);
  EXPECT_EQ(other.header("access-control-allow-origin"), "");
  ScriptedServer off;
  EXPECT_EQ(fetch(off.port, "OPTIONS", "/v1/models", "",
                  {"Origin: http://app.example:3000", "Access-Control-Request-Method: GET"})
                .header("access-control-allow-origin"),
            "");
}

// The HTTP layer's own refusals carry the API's error body.
TEST(ScriptedServer, MalformedHttpGetsAnApiErrorBody) {
  ScriptedServer s;
  RawConnection c(s.port);
  c.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab");
  const HttpResponse r = parse_http(c.read_all());
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body_json()["error"]["message"], "the request has more than one Content-Length header");
  RawConnection big(s.port);
  big.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Transfer-Encoding: chunked\r\n\r\n");
  for (int i = 0; i < 20; ++i) big.send("10000\r\n" + std::string(0x10000, ' ') + "\r\n");  // 1.25 MiB > 1 MiB
  const HttpResponse too_big = parse_http(big.read_all());
  EXPECT_EQ(too_big.status, 413);
  EXPECT_THAT(too_big.body_json()["error"]["message"].get<std::string>(), HasSubstr("larger than this server accepts"));
}

TEST(ScriptedServer, ClientLeavingMidStreamCancelsItsRequest) {
  ScriptedServer s;
  s.generator.set_script({std::vector<std::string>(2000, "tok "), "stop", 5ms});
  RawConnection c(s.port);
  c.send(http_request("POST", "/v1/chat/completions", dump(chat_body(true))));
  const std::string seen = c.read_until([](const std::string& r) {
    size_t events = 0;
    for (size_t at = r.find("\"content\":\"tok \""); at != std::string::npos;
         at = r.find("\"content\":\"tok \"", at + 1))
      ++events;
    return events >= 3;
  });
  ASSERT_THAT(seen, HasSubstr("\"content\":\"tok \""));
  EXPECT_EQ(s.generator.running(), 1);
  c.close();
  const auto start = std::chrono::steady_clock::now();
  while (s.generator.running() > 0 && std::chrono::steady_clock::now() - start < 2s) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(s.generator.running(), 0);
  EXPECT_EQ(s.generator.cancels(), 1);
  // Well within a few token intervals (not at the end of the 10-second script).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
  // The server goes on serving.
  s.generator.set_script({{"fine"}});
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200);
}

TEST(ScriptedServer, GenerationErrorsReachTheClient) {
  ScriptedServer s;
  s.generator.set_script({{"partial"}, "error"});
  HttpResponse r = s.post("/v1/chat/completions", chat_body(false));
  EXPECT_EQ(r.status, 500);
  EXPECT_THAT(r.body_json()["error"]["message"].get<std::string>(), HasSubstr("scripted failure"));
  r = s.post("/v1/chat/completions", chat_body(true));
  EXPECT_EQ(r.status, 200);
  const std::vector<json> events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json& error = events[events.size() - 2];
  ASSERT_TRUE(error.contains("error")) << r.body;
  EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr("scripted failure"));
}

TEST(ScriptedServer, StoppingEndsOpenStreamsWithAReason) {
  ScriptedServer s;
  s.generator.set_script({std::vector<std::string>(5000, "x"), "stop", 2ms});
  RawConnection c(s.port);
  c.send(http_request("POST", "/v1/chat/completions", dump(chat_body(true))));
  c.read_until([](const std::string& r) { return r.find("\"content\":\"x\"") != std::string::npos; });
  std::thread stopper([&] { s.server->stop(); });
  const HttpResponse r = parse_http(c.read_all(5s));
  stopper.join();
  EXPECT_THAT(r.body, HasSubstr("shutting down"));
  EXPECT_THAT(r.body, HasSubstr("data: [DONE]"));
  EXPECT_EQ(s.generator.running(), 0);
}

TEST(ScriptedServer, CompletionsNAndLogprobs) {
  ScriptedServer s;
  s.generator.set_script({{"Hel", "lo"}, "length"});
  const HttpResponse r =
      s.post("/v1/completions", {{"prompt", {"a b", "c"}}, {"n", 2}, {"max_tokens", 2}, {"logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.body_json();
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 4u);  // 2 prompts x n 2
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "Hello");
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    EXPECT_EQ(j["choices"][i]["logprobs"]["tokens"].size(), 2u);
    EXPECT_EQ(j["choices"][i]["logprobs"]["top_logprobs"][0].size(), 1u);
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  const auto submitted = s.generator.submitted();
  ASSERT_EQ(submitted.size(), 2u);
  EXPECT_EQ(submitted[0].n, 2);
  EXPECT_EQ(submitted[0].max_tokens, 2);
  EXPECT_EQ(submitted[0].top_logprobs, 1);
}

TEST(ScriptedServer, ChatLogprobsAndSamplingReachTheGenerator) {
  ScriptedServer s;
  s.generator.set_script({{"a", "b"}});
  json body = chat_body(false);
  body.update({{"logprobs", true},
               {"top_logprobs", 2},
               {"temperature", 0.3},
               {"top_k", 5},
               {"seed", 11},
               {"stop", {"zz"}},
               {"max_completion_tokens", 7},
               {"chat_template_kwargs", {{"enable_thinking", false}}}});
  const HttpResponse r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json lp = r.body_json()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(lp[0]["bytes"].is_array());
  const engine::RequestParams p = s.generator.submitted().back();
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.3f);
  EXPECT_EQ(p.sampling.top_k, 5);
  EXPECT_EQ(p.sampling.seed, 11u);
  EXPECT_EQ(p.stop, std::vector<std::string>{"zz"});
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.top_logprobs, 2);
  // enable_thinking=false reached the template: Qwen3's closed empty think block ends the prompt.
  EXPECT_TRUE(mini_tokenizer().decode(p.prompt).ends_with("<think>\n\n</think>\n\n"));
}

// Bodies a server meets in the wild; each must get a 4xx with an error body, and the server must
// keep serving.
// JSON nested 100,000 deep inside a request's values (not only at its top) is a 400 naming the
// field, and the server goes on serving: nlohmann's recursive copy and dump would overflow the stack.
TEST(ScriptedServer, DeeplyNestedValuesAre400NamingTheirField) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::string call_messages =
      R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ")" +
      std::string(100000, '[') + R"("}}]}, {"role": "tool", "tool_call_id": "c", "content": "x"}])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{" + messages + R"(, "chat_template_kwargs": {"x": )" + deep + "}}", "chat_template_kwargs"},
      {"{" + messages + R"(, "documents": )" + deep + "}", "documents"},
      {"{" + messages + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"a": )" +
           deep + "}}}}",
       "response_format"},
      {"{" + messages + R"(, "guided_json": ")" + std::string(100000, '[') + "\"}", "guided_json"},
      {"{" + call_messages + "}", "messages[1].tool_calls[0].function.arguments"},
  };
  for (const auto& [body, field] : cases) {
    const HttpResponse r = fetch(s.port, "POST", "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_THAT(r.body, HasSubstr(field)) << r.body.substr(0, 300);
    EXPECT_THAT(r.body, HasSubstr("nested deeper than 128 levels")) << r.body.substr(0, 300);
  }
  const std::string ok = std::string(126, '[') + std::string(126, ']');  // 128 levels with the two objects
  EXPECT_EQ(fetch(s.port, "POST", "/v1/chat/completions", "{" + messages + R"(, "chat_template_kwargs": {"x": )" + ok + "}}").status,
            200);
}

TEST(ScriptedServer, MalformedRequestCorpus) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  const std::string big(2 << 20, 'a');
  const std::vector<std::pair<std::string, int>> corpus = {
      {"", 400},
      {"{", 400},
      {"not json", 400},
      {"[]", 400},
      {"null", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc0\xaf\"}]}", 400},
      {"{\"messages\": []}", 400},
      {"{\"messages\": {}}", 400},
      {"{\"messages\": [null]}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": {\"x\": 1}}]}", 400},
      {"{\"messages\": [{\"role\": 5, \"content\": \"a\"}]}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": -1}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": 1e400}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_tokens\": 100000000}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"n\": 100000}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"temperature\": NaN}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"temperature\": 1e308}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"seed\": 1.5}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"stop\": {}}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"tools\": \"all\"}", 400},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"model\": \"gpt-4\"}", 404},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(5000, 'a') + "\"}], \"max_tokens\": 4000}",
       400},  // context length
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"" + big + "\"}]}", 413},
      {std::string(100000, '['), 400},  // deep nesting
  };
  for (const auto& [body, status] : corpus) {
    const HttpResponse r = fetch(s.port, "POST", "/v1/chat/completions", body);
    EXPECT_EQ(r.status, status) << body.substr(0, 120);
    const json error = r.body_json();
    ASSERT_TRUE(error.is_object() && error.contains("error")) << body.substr(0, 120) << " -> " << r.body.substr(0, 200);
    EXPECT_TRUE(error["error"]["message"].is_string());
    EXPECT_TRUE(error["error"]["type"].is_string());
  }
  EXPECT_EQ(fetch(s.port, "POST", "/v1/completions", R"({"prompt": [1, 999999]})").status, 400);
  EXPECT_EQ(fetch(s.port, "POST", "/v1/completions", R"({"prompt": "a", "model": "x"})").body_json()["error"]["code"],
            "model_not_found");
  const HttpResponse missing = fetch(s.port, "GET", "/v1/nothing");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.body_json()["error"]["code"], "not_found");
  // Bytes that are not HTTP at all.
  RawConnection garbage(s.port);
  garbage.send(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) + "\r\n\r\n");
  EXPECT_THAT(garbage.read_until([](const std::string& r) { return r.find("\r\n\r\n") != std::string::npos; }, 3s),
              HasSubstr("400"));
  // Still serving.
  EXPECT_EQ(fetch(s.port, "GET", "/health").status, 200);
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200);
}

// Valid bodies with random bytes flipped, dropped, duplicated or cut: never a 5xx, never a crash.
TEST(ScriptedServer, MutatedBodiesNeverCrashIt) {
  ScriptedServer s;
  s.generator.set_script({{"ok"}});
  const std::vector<std::string> seeds = {
      dump({{"model", "scripted"},
            {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
            {"max_tokens", 3},
            {"tools", kTools},
            {"tool_choice", "auto"},
            {"stop", {"a", "b"}},
            {"logprobs", true},
            {"top_logprobs", 2}}),
      dump({{"messages",
             {{{"role", "system"}, {"content", "s"}},
              {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "t"}}}}},
              {{"role", "assistant"},
               {"content", nullptr},
               {"tool_calls",
                {{{"id", "c"},
                  {"type", "function"},
                  {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"x\"}"}}}}}}},
              {{"role", "tool"}, {"tool_call_id", "c"}, {"content", "r"}}}},
            {"n", 2},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}}),
  };
  std::mt19937 rng(1234);
  int requests = 0;
  for (int round = 0; round < 150; ++round) {
    std::string body = seeds[round % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 4) {
        case 0:
          body[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          body.erase(at, 1 + rng() % 8);
          break;
        case 2:
          body.insert(at, body.substr(at, 1 + rng() % 16));
          break;
        case 3:
          body.resize(at);
          break;
      }
    }
    const HttpResponse r = fetch(s.port, "POST", round % 3 == 2 ? "/v1/completions" : "/v1/chat/completions", body);
    ASSERT_GT(r.status, 0) << "no answer to: " << body;
    EXPECT_LT(r.status, 500) << body << " -> " << r.body;
    ++requests;
  }
  EXPECT_EQ(requests, 150);
  EXPECT_EQ(fetch(s.port, "GET", "/health").status, 200);
}

TEST(ScriptedServer, TemplateErrorsAre400WithTheTemplatesMessage) {
  ScriptedServer s(qwen35_template());
  const HttpResponse r =
      s.post("/v1/chat/completions", {{"messages", {{{"role", "assistant"}, {"content", "only me"}}}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body_json()["error"]["message"].get<std::string>(), HasSubstr("No user query found in messages."));
}

TEST(ScriptedServer, ApiKeyGuardsTheApi) {
  ServerOptions options;
  options.api_key = "sekrit";
  ScriptedServer s(qwen3_template(), options);
  s.generator.set_script({{"ok"}});
  HttpResponse r = s.post("/v1/chat/completions", chat_body(false));
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body_json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false), {"Authorization: Bearer sekrix"}).status, 401);
  EXPECT_EQ(fetch(s.port, "GET", "/v1/models").status, 401);
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false), {"Authorization: Bearer sekrit"}).status, 200);
  EXPECT_EQ(fetch(s.port, "GET", "/v1/models", "", {"Authorization: Bearer sekrit"}).body_json()["data"][0]["id"],
            "scripted");
  EXPECT_EQ(fetch(s.port, "GET", "/health").status, 200);  // monitoring stays open
}

TEST(ScriptedServer, FullQueueIs429WithRetryAfter) {
  ScriptedServer s;
  s.generator.refuse_all(true);
  const HttpResponse r = s.post("/v1/chat/completions", chat_body(false));
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.header("retry-after"), "1");
  EXPECT_EQ(r.body_json()["error"]["code"], "queue_full");
}

// Memory running out for one request answers 503 with Retry-After; the server goes on.
TEST(ScriptedServer, OutOfMemoryIs503AndTheServerGoesOn) {
  ScriptedServer s;
  s.generator.run_out_of_memory(true);
  for (const bool stream : {false, true}) {
    const HttpResponse r = s.post("/v1/chat/completions", chat_body(stream));
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.header("retry-after"), "1");
    EXPECT_THAT(r.body_json()["error"]["message"].get<std::string>(), HasSubstr("out of memory"));
  }
  s.generator.run_out_of_memory(false);
  s.generator.set_script({{"fine"}});
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body(false)).status, 200);
}

TEST(ScriptedServer, ModelsHealthAndMetrics) {
  ScriptedServer s;
  s.generator.set_script({{"a", "b", "c"}, "stop", 2ms});
  EXPECT_EQ(s.post("/v1/chat/completions", chat_body(true)).status, 200);
  const json models = fetch(s.port, "GET", "/v1/models").body_json();
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "scripted");
  EXPECT_EQ(models["data"][0]["max_model_len"], 4096);
  EXPECT_EQ(fetch(s.port, "GET", "/v1/models/scripted").status, 200);
  EXPECT_EQ(fetch(s.port, "GET", "/v1/models/other").status, 404);
  const json health = fetch(s.port, "GET", "/health").body_json();
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["kv_blocks_used"], 0);
  const HttpResponse metrics = fetch(s.port, "GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  for (const char* name : {"qinfer_time_to_first_token_seconds_count 1", "qinfer_inter_token_latency_seconds_count 2",
                           "qinfer_requests_running", "qinfer_requests_waiting", "qinfer_kv_blocks_used",
                           "qinfer_state_slots_used", "qinfer_prompt_tokens_total", "qinfer_generation_tokens_total",
                           "qinfer_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
                           "qinfer_choices_finished_total{reason=\"stop\"} 1", "qinfer_host_cache_blocks_cached",
                           "qinfer_host_cache_loaded_blocks_total", "qinfer_host_cache_checkpoints_cached"})
    EXPECT_THAT(metrics.body, HasSubstr(name));
}

}  // namespace
}  // namespace qinfer::server::testing
