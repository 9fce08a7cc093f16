// Request parsing: typed fields, OpenAI defaults, and errors that name the field.
#include "server/request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/responses.h"

namespace qinfer::server {
namespace {

using ::testing::HasSubstr;

SamplingParams defaults() {
  SamplingParams s;
  s.temperature = 0.6f;
  s.top_p = 0.95f;
  s.top_k = 20;
  return s;
}

ChatRequest chat(const std::string& body) { return parse_chat_request(parse_body(body), defaults()); }
CompletionRequest completion(const std::string& body) { return parse_completion_request(parse_body(body), defaults()); }

// The ApiError a body gets from `parse`.
template <typename F>
ApiError error_of(F parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return ApiError(0, "", "", "", "");
}

#define EXPECT_BAD(call, field, text)                    \
  do {                                                   \
    const ApiError e = error_of([&] { call; });          \
    EXPECT_EQ(e.status, 400);                            \
    EXPECT_EQ(e.type, "invalid_request_error");          \
    EXPECT_EQ(e.param, field);                           \
    EXPECT_THAT(std::string(e.what()), HasSubstr(text)); \
  } while (0)

TEST(ParseBody, RejectsWhatIsNotAJsonObject) {
  EXPECT_BAD(parse_body(""), "", "empty");
  EXPECT_BAD(parse_body("{\"messages\": ["), "", "not valid JSON");
  EXPECT_BAD(parse_body("[1, 2]"), "", "must be a JSON object");
  EXPECT_BAD(parse_body("{\"a\": \"\xff\xfe\"}"), "", "not valid JSON");      // ill-formed UTF-8
  EXPECT_BAD(parse_body("{\"a\": \"\xed\xa0\x80\"}"), "", "not valid JSON");  // an encoded surrogate
  EXPECT_TRUE(parse_body("{\"a\": \"caf\xc3\xa9\"}").is_object());
}

TEST(ChatRequest, FieldsAndDefaults) {
  ChatRequest r = chat(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(r.model, "m");
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.6f);  // the model's defaults when the request says nothing
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_EQ(r.top_logprobs, -1);
  EXPECT_EQ(r.tool_choice, ToolChoice::none);
  EXPECT_EQ(r.template_request["messages"][0]["content"], "hi");

  r = chat(R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "top_p": 0.5, "top_k": -1,
               "min_p": 0.1, "presence_penalty": -1.5, "frequency_penalty": 2, "repetition_penalty": 1.1,
               "seed": -7, "n": 3, "stop": "END", "max_tokens": 5, "max_completion_tokens": 9,
               "logprobs": true, "top_logprobs": 4, "stream": true, "stream_options": {"include_usage": true},
               "chat_template_kwargs": {"enable_thinking": false}, "user": "u", "logit_bias": {}})");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 2);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(int64_t{-7}));
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.template_request["chat_template_kwargs"]["enable_thinking"], false);
}

TEST(ChatRequest, ContentPartsAndRoles) {
  ChatRequest r = chat(R"({"messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}]})");
  const json& m = r.template_request["messages"];
  EXPECT_EQ(m[0]["role"], "system");
  EXPECT_EQ(m[1]["content"], "a\nb");
  EXPECT_EQ(m[2]["content"], "");
  EXPECT_EQ(m[2]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(m[3]["tool_call_id"], "c1");
}

TEST(ChatRequest, ErrorsNameTheField) {
  EXPECT_BAD(chat("{}"), "messages", "messages: required");
  EXPECT_BAD(chat(R"({"messages": []})"), "messages", "at least one message");
  EXPECT_BAD(chat(R"({"messages": "hi"})"), "messages", "expected an array of messages, got a string");
  EXPECT_BAD(chat(R"({"messages": [{"role": "user", "content": "a"}, 5]})"), "messages[1]",
             "messages[1]: expected an object, got an integer");
  EXPECT_BAD(chat(R"({"messages": [{"content": "a"}]})"), "messages[0].role", "required");
  EXPECT_BAD(chat(R"({"messages": [{"role": "wizard", "content": "a"}]})"), "messages[0].role", "\"wizard\"");
  EXPECT_BAD(chat(R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                   {"role": "user", "content": 5}]})"),
             "messages[2].content", "messages[2].content: expected a string or an array of content parts");
  EXPECT_BAD(chat(R"({"messages": [{"role": "user"}]})"), "messages[0].content", "required for a user message");
  EXPECT_BAD(chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})"),
             "messages[0].content[0].type", "not supported");
  EXPECT_BAD(chat(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function":
               {"name": "f", "arguments": "{oops"}}]}]})"),
             "messages[0].tool_calls[0].function.arguments", "not a JSON object");
  const std::string ok = R"("messages": [{"role": "user", "content": "a"}])";
  EXPECT_BAD(chat("{" + ok + R"(, "temperature": "hot"})"), "temperature",
             "temperature: expected a number, got a string");
  EXPECT_BAD(chat("{" + ok + R"(, "temperature": 7})"), "temperature", "at most 2");
  EXPECT_BAD(chat("{" + ok + R"(, "top_p": 0})"), "top_p", "above 0");
  EXPECT_BAD(chat("{" + ok + R"(, "n": 0})"), "n", "between 1 and 16");
  EXPECT_BAD(chat("{" + ok + R"(, "n": 1.5})"), "n", "expected an integer");
  EXPECT_BAD(chat("{" + ok + R"(, "max_tokens": 1e30})"), "max_tokens", "expected an integer");
  EXPECT_BAD(chat("{" + ok + R"(, "max_tokens": 99999999999999999999})"), "max_tokens", "");
  EXPECT_BAD(chat("{" + ok + R"(, "max_tokens": 0})"), "max_tokens", "at least 1");
  EXPECT_BAD(chat("{" + ok + R"(, "echo": true})"), "echo", "not supported on chat completions");
  EXPECT_BAD(chat("{" + ok + R"(, "prompt_logprobs": 21})"), "prompt_logprobs", "between 0 and 20");
  EXPECT_BAD(chat("{" + ok + R"(, "stop": [""]})"), "stop", "must not be empty");
  EXPECT_BAD(chat("{" + ok + R"(, "stop": [1]})"), "stop[0]", "expected a string");
  EXPECT_BAD(chat("{" + ok + R"(, "top_logprobs": 3})"), "top_logprobs", "needs logprobs");
  EXPECT_BAD(chat("{" + ok + R"(, "logprobs": true, "top_logprobs": 21})"), "top_logprobs", "between 0 and 20");
  EXPECT_BAD(chat("{" + ok + R"(, "stream_options": {"include_usage": true}})"), "stream_options", "stream is true");
  EXPECT_BAD(chat("{" + ok + R"(, "logit_bias": {"5": 1}})"), "logit_bias.5", "only -100");
  EXPECT_BAD(chat("{" + ok + R"(, "logit_bias": {"x": 100}})"), "logit_bias.x", "token id");
  EXPECT_BAD(chat("{" + ok + R"(, "logit_bias": {"5": -101}})"), "logit_bias.5", "");
  EXPECT_BAD(chat("{" + ok + R"(, "logit_bias": [5]})"), "logit_bias", "expected an object");
  {
    const ChatRequest biased = chat("{" + ok + R"(, "logit_bias": {"5": -100, "7": 100, "8": 100, "9": 0}})");
    EXPECT_EQ(biased.banned_tokens, std::vector<int32_t>{5});
    EXPECT_EQ(biased.exclusive_tokens, (std::vector<int32_t>{7, 8}));
  }
  EXPECT_BAD(chat("{" + ok + R"(, "response_format": {"type": "json_schema"}})"), "response_format.json_schema",
             "required");
  EXPECT_BAD(chat("{" + ok + R"(, "response_format": {"type": "xml"}})"), "response_format.type", "\"xml\"");
  EXPECT_BAD(chat("{" + ok + R"(, "guided_json": "{not json"})"), "guided_json", "not JSON");
  EXPECT_BAD(chat("{" + ok + R"(, "guided_choice": []})"), "guided_choice", "non-empty array");
  EXPECT_BAD(chat("{" + ok + R"(, "guided_choice": ["a", ""]})"), "guided_choice", "must not be empty");
  EXPECT_BAD(chat("{" + ok + R"(, "structured_outputs": {"structural_tag": {}}})"),
             "structured_outputs.structural_tag", "not supported");
  EXPECT_BAD(chat("{" + ok + R"(, "response_format": {"type": "json_object"}, "guided_regex": "a"})"), "guided_regex",
             "only one");
  EXPECT_BAD(chat("{" + ok + R"(, "model": 3})"), "model", "expected a string");
  EXPECT_BAD(chat("{" + ok + R"(, "chat_template_kwargs": []})"), "chat_template_kwargs", "expected an object");
  EXPECT_BAD(chat("{" + ok + R"(, "stream": "yes"})"), "stream", "expected true or false");
}

TEST(ChatRequest, StructuredOutputSources) {
  const std::string ok = R"("messages": [{"role": "user", "content": "a"}])";
  using Kind = grammar::ConstraintSpec::Kind;
  const auto chat = [](const std::string& body) { return parse_chat_request(json::parse(body), SamplingParams{}); };
  EXPECT_EQ(chat("{" + ok + "}").constraint.kind, Kind::none);
  EXPECT_EQ(chat("{" + ok + R"(, "response_format": {"type": "text"}})").constraint.kind, Kind::none);
  EXPECT_EQ(chat("{" + ok + R"(, "response_format": {"type": "json_object"}})").constraint.kind, Kind::json_object);
  const ChatRequest schema = chat("{" + ok +
                                  R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
                                     "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}})");
  EXPECT_EQ(schema.constraint.kind, Kind::json_schema);
  EXPECT_TRUE(schema.constraint.strict);
  EXPECT_EQ(schema.constraint_field, "response_format.json_schema.schema");
  EXPECT_EQ(schema.constraint.schema["properties"].begin().key(), "b");  // the client's property order
  const ChatRequest guided = chat("{" + ok + R"(, "guided_json": "{\"type\": \"integer\"}"})");
  EXPECT_EQ(guided.constraint.kind, Kind::json_schema);
  EXPECT_EQ(guided.constraint.schema["type"], "integer");
  const ChatRequest regex = chat("{" + ok + R"(, "structured_outputs": {"regex": "[a-z]+"}})");
  EXPECT_EQ(regex.constraint.kind, Kind::regex);
  EXPECT_EQ(regex.constraint.text, "[a-z]+");
  EXPECT_EQ(regex.constraint_field, "structured_outputs.regex");
  const ChatRequest choice = chat("{" + ok + R"(, "guided_choice": ["x", "y"]})");
  EXPECT_EQ(choice.constraint.choices, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(chat("{" + ok + R"(, "guided_grammar": "root ::= \"a\""})").constraint.kind, Kind::grammar);
  EXPECT_EQ(chat("{" + ok + R"(, "structured_outputs": {"json_object": true}})").constraint.kind, Kind::json_object);
}

TEST(ChatRequest, ToolsAndToolChoice) {
  const std::string messages = R"("messages": [{"role": "user", "content": "a"}])";
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
                   {"type": "function", "function": {"name": "get_date"}}])";
  ChatRequest r = chat("{" + messages + "," + tools + "}");
  EXPECT_EQ(r.tool_choice, ToolChoice::automatic);
  EXPECT_EQ(r.tools.size(), 2u);
  EXPECT_EQ(r.template_request["tools"].size(), 2u);
  r = chat("{" + messages + "," + tools + R"(, "tool_choice": "none"})");
  EXPECT_EQ(r.tool_choice, ToolChoice::none);
  EXPECT_FALSE(r.template_request.contains("tools"));  // the model is not told about tools it may not call
  r = chat("{" + messages + "," + tools + R"(, "tool_choice": "required"})");
  EXPECT_EQ(r.tool_choice, ToolChoice::required);
  r = chat("{" + messages + "," + tools +
           R"(, "tool_choice": {"type": "function", "function": {"name": "get_date"}}})");
  EXPECT_EQ(r.tool_choice, ToolChoice::named);
  EXPECT_EQ(r.tool_name, "get_date");

  EXPECT_BAD(
      chat("{" + messages + "," + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}}})"),
      "tool_choice.function.name", "no tool named \"nope\"");
  EXPECT_BAD(chat("{" + messages + R"(, "tool_choice": "required"})"), "tool_choice", "needs at least one tool");
  EXPECT_BAD(chat("{" + messages + "," + tools + R"(, "tool_choice": "sometimes"})"), "tool_choice", "\"sometimes\"");
  EXPECT_BAD(chat("{" + messages + R"(, "tools": [{"type": "function", "function": {"name": "bad name!"}}]})"),
             "tools[0].function.name", "1 to 64");
  EXPECT_BAD(chat("{" + messages + R"(, "tools": [{"type": "function", "function": {"name": "f"}},
                                                  {"type": "function", "function": {"name": "f"}}]})"),
             "tools[1].function.name", "defined twice");
  EXPECT_BAD(chat("{" + messages + R"(, "tools": [{"type": "retrieval"}]})"), "tools[0].type", "only \"function\"");
  EXPECT_BAD(chat("{" + messages + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}]})"),
             "tools[0].function.parameters", "expected an object");
}

TEST(CompletionRequest, PromptForms) {
  CompletionRequest r = completion(R"({"prompt": "Once upon", "max_tokens": 4, "logprobs": 2})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Once upon");
  EXPECT_EQ(r.top_logprobs, 2);
  r = completion(R"({"prompt": [1, 2, 3]})");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_TRUE(r.prompts[0].is_ids);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  r = completion(R"({"prompt": ["a", [4, 5]]})");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{4, 5}));

  EXPECT_BAD(completion("{}"), "prompt", "required");
  EXPECT_BAD(completion(R"({"prompt": ""})"), "prompt", "must not be empty");
  EXPECT_BAD(completion(R"({"prompt": []})"), "prompt", "an empty array");
  EXPECT_BAD(completion(R"({"prompt": [1, -2]})"), "prompt[1]", "between 0 and");
  EXPECT_BAD(completion(R"({"prompt": ["a", 5]})"), "prompt[1]", "expected a string or an array of token ids");
  EXPECT_BAD(completion(R"({"prompt": "a", "echo": 1})"), "echo", "expected true or false");
  EXPECT_BAD(completion(R"({"prompt": "a", "max_tokens": 0})"), "max_tokens", "0 only with echo");
  EXPECT_TRUE(completion(R"({"prompt": "a", "echo": true, "max_tokens": 0})").echo);
  EXPECT_BAD(completion(R"({"prompt": "a", "logprobs": true})"), "logprobs", "expected an integer");
}

TEST(ApiErrorBody, OpenAIShape) {
  ApiError e(404, "invalid_request_error", "model_not_found", "model", "The model `x` does not exist.");
  EXPECT_EQ(
      dump(e.body()),
      R"({"error":{"message":"The model `x` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}})");
  ApiError plain(400, "invalid_request_error", "", "", "bad");
  EXPECT_EQ(dump(plain.body()),
            R"({"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}})");
}

TEST(Sse, EventsAndChunks) {
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // Invalid UTF-8 (a token cut inside a character) never breaks serialization.
  EXPECT_EQ(sse_event(json{{"t", std::string("\xe2\x82")}}), "data: {\"t\":\"\xef\xbf\xbd\"}\n\n");
  ResponseHeader h{"chatcmpl-1", 7, "m"};
  std::vector<std::string> ids;
  ChatDelta d;
  d.content = "hi";
  d.calls.push_back({0, "f", "{\"a\""});
  const json chunk = chat_chunk(h, 2, chat_delta_json(d, ids), "");
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "hi");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  const json& call = chunk["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "f");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(call["id"], ids[0]);
  EXPECT_TRUE(ids[0].starts_with("call_"));
  ChatDelta more;
  more.calls.push_back({0, "", "}"});
  const json next = chat_delta_json(more, ids);
  EXPECT_FALSE(next["tool_calls"][0].contains("id"));  // only the first delta of a call names it
  EXPECT_EQ(next["tool_calls"][0]["function"]["arguments"], "}");
  const json usage = usage_chunk(h, "chat.completion.chunk", {10, 5, 8});
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 15);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
}

}  // namespace
}  // namespace qinfer::server
