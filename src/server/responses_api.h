#pragma once
// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) over the chat
// pipeline, for the clients that default to it (the AI SDK's openai(...) model, @openai/agents): a
// request's input items become chat messages, the chat answer becomes output items (reasoning,
// message, function_call), and a chat stream becomes response.* events. Responses are kept in memory
// (bounded) unless store is false, so previous_response_id continues a conversation.
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/api_error.h"
#include "server/stream_format.h"

namespace qinfer::server {

struct ResponsesRequest {
  std::string id;     // resp_...
  json chat;          // the chat-completions body
  json conversation;  // the chat messages without the instructions
  json echo;          // the request's settings, as the response object repeats them
  bool store = true;
  bool stream = false;
};

// Stored responses: the response object and the conversation it ends (chat messages, without the
// instructions, which a follow-up gives anew). The least recently used go first past either bound.
class ResponseStore {
 public:
  explicit ResponseStore(size_t max_responses = 1024, size_t max_bytes = 64u << 20);
  void put(const std::string& id, json response, json conversation);
  // A finished request's response, with its conversation and the answer that ended it; nothing
  // when it asked for store false.
  void keep(const ResponsesRequest& r, const json& response, const json& message);
  std::optional<json> response(const std::string& id);
  std::optional<json> conversation(const std::string& id);
  bool erase(const std::string& id);

 private:
  struct Entry {
    json response, conversation;
    size_t bytes = 0;
    std::list<std::string>::iterator order;
  };
  void touch(Entry& e, const std::string& id);
  size_t max_responses_, max_bytes_, bytes_ = 0;
  std::mutex mutex_;
  std::list<std::string> order_;  // most recent first
  std::unordered_map<std::string, Entry> entries_;
};

// 400 naming the field for what the API does not define or this server does not implement; 404 for
// a previous_response_id that is not stored.
ResponsesRequest responses_request(const json& body, ResponseStore& store);

// The response object of a finished chat.completion, and the assistant message a follow-up continues
// from.
json responses_object(const ResponsesRequest& r, const json& completion);
json assistant_message(const json& completion);

// Streams the events; at the end the response is kept in `store` (ResponseStore::keep).
std::unique_ptr<StreamFormat> responses_stream(ResponsesRequest r, ResponseStore& store);

}  // namespace qinfer::server
