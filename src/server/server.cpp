#include "server/server.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "io/json.h"
#include "server/anthropic.h"
#include "server/chat_output.h"
#include "server/metrics.h"
#include "server/responses.h"
#include "server/responses_api.h"

namespace qinfer::server {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// chat: /v1/chat/completions; messages (Anthropic's /v1/messages) and responses (OpenAI's
// /v1/responses) are chats whose requests and answers are reframed.
enum class Endpoint { chat, completion, messages, responses };

http::Response error_response(const ApiError& e) {
  // A client's mistake is worth a line for whoever debugs the client, not a warning.
  if (e.status < 500 && log_level() <= LogLevel::debug) log_debug("{} {}", e.status, dump(e.body()));
  http::Response r{e.status, "application/json", dump(e.body()), {}};
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  return r;
}

http::Response json_response(const json& body) { return {200, "application/json", dump(body), {}}; }

ApiError server_error(int status, const std::string& message) {
  return ApiError(status, status == 503 ? "service_unavailable" : "server_error", "", "", message);
}

// What the request's tools allow the model to write: any text then calls ("auto"), calls only
// ("required"), one call of the named tool.
grammar::ConstraintSpec tool_call_constraint(const ChatRequest& r, ToolCallFormat format) {
  grammar::ConstraintSpec spec;
  spec.kind = grammar::ConstraintSpec::Kind::tool_calls;
  grammar::ToolCallSpec& t = spec.tool_calls;
  t.syntax = format == ToolCallFormat::xml ? grammar::ToolCallSyntax::xml : grammar::ToolCallSyntax::hermes;
  t.required = r.tool_choice != ToolChoice::automatic;
  t.parallel = r.parallel_tool_calls && r.tool_choice != ToolChoice::named;
  for (size_t i = 0; i < r.tools.size(); ++i) {
    const json& f = r.tools[i]["function"];
    grammar::ToolSchema tool;
    tool.name = f["name"].get<std::string>();
    if (r.tool_choice == ToolChoice::named && tool.name != r.tool_name) continue;
    if (auto p = f.find("parameters"); p != f.end()) tool.parameters = *p;
    if (auto strict = f.find("strict"); strict != f.end() && strict->is_boolean()) tool.strict = strict->get<bool>();
    tool.field = fmt::format("tools[{}]", i);
    t.tools.push_back(std::move(tool));
  }
  return spec;
}

// The finish reason a client sees: a turn that ended by itself after calling tools ends in "tool_calls".
std::string client_finish_reason(const std::string& reason, int tool_calls) {
  if (reason == "stop" && tool_calls > 0) return "tool_calls";
  return reason;
}

struct ChoiceState {
  std::unique_ptr<ChatOutputParser> parser;  // chat only
  bool finished = false;
  std::string finish_reason;
  std::string stop_string;  // the stop string that ended it (vLLM's stop_reason)
  std::optional<Clock::time_point> last_token;
  // Gathered for a non-streamed response:
  std::string reasoning, text;
  json tool_calls = json::array();
  std::vector<std::string> call_ids;  // streamed calls' ids by index
  json logprobs;                      // chat: array of entries; completions: the columns object
  int64_t text_offset = 0;
  json token_ids = json::array();     // with return_token_ids
  bool sent_prompt_ids = false;       // streamed: a completion choice's first chunk carried them
  bool started = false;               // its first event came (with the prompt's logprobs, when asked)
  json prompt_logprobs;               // vLLM's prompt_logprobs, when asked
};

}  // namespace

struct Server::Impl {
  ServerOptions options;
  ServedModel model;
  Generator& generator;
  ToolCallFormat tool_format = ToolCallFormat::none;
  bool split_reasoning = false;
  // Changes when what answers does (the model, its template, the context): OpenAI's system_fingerprint.
  std::string fingerprint;
  Metrics metrics;
  ResponseStore responses;  // /v1/responses kept for previous_response_id
  std::unique_ptr<http::Server> http;
  int port = -1;
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;

  class Session;
  mutable std::mutex sessions_mutex;
  std::vector<std::weak_ptr<Session>> sessions;

  Impl(ServerOptions o, ServedModel m, Generator& g) : options(std::move(o)), model(std::move(m)), generator(g) {
    tool_format = detect_tool_call_format(model.chat_template_source);
    split_reasoning = model.chat_template_source.find("</think>") != std::string::npos;
    const size_t h = std::hash<std::string>{}(fmt::format("{}|{}|{}|{}", model.name, model.max_context,
                                                          model.chat_template_source, model.tokenizer->vocab_size()));
    fingerprint = fmt::format("fp_{:012x}", h & 0xFFFFFFFFFFFFull);
  }

  // Every request: the Host, CORS, media-type and API-key rules, then its route.
  void serve(http::Request& req, http::Responder& res);
  // A request in /metrics and the debug log, counted before its answer's last byte leaves.
  void count(const http::Request& req, int status);
  void generate(const http::Request& req, http::Responder& res, Endpoint endpoint, const http::Headers& cors);
  // The CORS headers of an answer to a request from an allowed Origin (none otherwise).
  http::Headers cors_headers(const http::Request& req) const;
  // `format`: the stream reframed for another API (it sees the usage chunk whatever the request says).
  std::shared_ptr<Session> chat_session(const json& body, std::unique_ptr<StreamFormat> format = nullptr);
  std::shared_ptr<Session> completion_session(const json& body);
  void check_model(const std::string& requested) const;
  engine::RequestParams params_for(const GenerationRequest& r, std::vector<int32_t> prompt,
                                   const std::string& prompt_field,
                                   grammar::Reasoning reasoning = grammar::Reasoning::none) const;
  // The compiled constraint of r (400 naming its field when it does not compile).
  std::shared_ptr<grammar::GrammarMasks> constraint_for(const GenerationRequest& r, grammar::Reasoning reasoning,
                                                        const std::vector<int32_t>& stop_ids) const;
  // Built on the first constrained request: the vocabulary trie takes a moment for 150k tokens.
  mutable std::once_flag constraints_once;
  mutable std::unique_ptr<grammar::ConstraintCache> constraints;
  json health() const;
  // Whether a request's Host header names this server (ServerOptions::allowed_hosts).
  bool host_allowed(std::string_view host) const;
  // vLLM's /tokenize (a prompt, or messages through the chat template) and /detokenize.
  json tokenize(const json& body) const;
  json detokenize(const json& body) const;
  void check_body_model(const json& body) const;  // the body's optional "model" names the served one
  json model_card() const;
  // Anthropic's /v1/messages/count_tokens: the prompt's tokens as the chat template renders it.
  json count_tokens(const json& body) const;
  void stop();
};

// One generation request from arrival to its last byte. Scheduler events land in `inbox_` on the
// scheduler thread; the HTTP thread turns them into chunks or the final response.
class Server::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, Endpoint endpoint, const GenerationRequest& r, size_t prompts)
      : server_(server),
        endpoint_(endpoint),
        stream_(r.stream),
        include_usage_(r.include_usage),
        n_(r.n),
        logprobs_(r.top_logprobs >= 0),
        top_logprobs_(r.top_logprobs),
        prompt_logprobs_(r.prompt_logprobs),
        token_ids_(r.return_token_ids),
        arrival_(Clock::now()),
        choices_(prompts * r.n),
        cached_(prompts, 0) {
    header_ = {random_id(endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-"), unix_now(), server.model.name,
               server.fingerprint};
    open_choices_ = static_cast<int>(choices_.size());
  }

  void use_chat_output(const ChatOutputOptions& options) {
    for (ChoiceState& c : choices_) c.parser = std::make_unique<ChatOutputParser>(options);
  }
  void use_format(std::unique_ptr<StreamFormat> format) { format_ = std::move(format); }
  // Completions' echo: each choice starts with its prompt's text (and, with logprobs, its tokens');
  // `prompt_only` (max_tokens 0): nothing generated is returned.
  void use_echo(std::vector<std::string> prompt_texts, bool prompt_only) {
    prompt_texts_ = std::move(prompt_texts);
    echo_only_ = prompt_only;
  }

  // Queues every prompt's request; on refusal, what was queued is cancelled and ApiError thrown.
  void submit(std::vector<engine::RequestParams> params) {
    for (size_t i = 0; i < params.size(); ++i) {
      prompt_tokens_ += static_cast<int64_t>(params[i].prompt.size());
      if (token_ids_) prompt_ids_.push_back(params[i].prompt);
      first_tokens_.push_back(params[i].prompt.at(0));
      const int offset = static_cast<int>(i) * n_;
      auto self = shared_from_this();
      std::optional<uint64_t> id;
      try {
        id = server_.generator.submit(std::move(params[i]),
                                      [self, offset](const engine::Event& e) { self->receive(e, offset); });
      } catch (const qinfer::Error& e) {
        cancel_all();
        throw ApiError(400, "invalid_request_error", "", "", e.what());
      }
      if (!id) {
        cancel_all();
        ApiError busy(429, "rate_limit_error", "queue_full", "",
                      "the server's request queue is full; retry after a moment");
        busy.retry_after_s = 1;
        throw busy;
      }
      std::lock_guard lock(mutex_);
      ids_.push_back(*id);
    }
  }

  // Called on the scheduler thread: only queues (timestamped, for the latency metrics).
  void receive(const engine::Event& e, int offset) {
    std::lock_guard lock(mutex_);
    inbox_.push_back({e, Clock::now()});
    inbox_.back().first.choice += offset;
    arrived_.notify_all();
  }

  // Called on the HTTP event thread when the connection closes: the sequences stop within a step,
  // and the worker waiting in pump() wakes to see it.
  void client_gone() {
    cancel_all();
    std::lock_guard lock(mutex_);
    gone_ = true;
    arrived_.notify_all();
  }

  // Waits up to `wait` for events and handles what arrived; appends SSE text to `sse` when
  // streaming. Returns true when the request is over; a client gone ends it as cancelled.
  bool pump(std::string* sse, std::chrono::milliseconds wait) {
    std::deque<std::pair<engine::Event, Clock::time_point>> events;
    bool gone = false;
    {
      std::unique_lock lock(mutex_);
      arrived_.wait_for(lock, wait, [&] { return !inbox_.empty() || gone_; });
      events.swap(inbox_);
      gone = gone_;
    }
    if (gone) {
      abandon();
      return true;
    }
    for (const auto& [e, at] : events) {
      if (done_) break;
      handle(e, at, sse);
    }
    return done_;
  }

  // The client went away: nothing more will be read, so the choices are accounted for here.
  void abandon() {
    if (!done_)
      for (ChoiceState& c : choices_)
        if (!c.finished) server_.metrics.count_finish("cancelled");
    done_ = true;
    cancel_all();
  }

  // The scheduler frees the sequences within a step. Once is enough.
  void cancel_all() {
    std::vector<uint64_t> ids;
    {
      std::lock_guard lock(mutex_);
      if (cancelled_) return;
      cancelled_ = true;
      ids = ids_;
    }
    for (uint64_t id : ids) server_.generator.cancel(id);
  }

  // The stream's first bytes: each choice's role, as OpenAI sends it before any content.
  std::string opening() {
    std::string out = format_ ? format_->open(prompt_tokens_) : "";
    if (endpoint_ == Endpoint::chat)
      for (size_t i = 0; i < choices_.size(); ++i) {
        json chunk = chat_chunk(header_, static_cast<int>(i), {{"role", "assistant"}, {"content", ""}}, "");
        if (token_ids_ && i == 0) chunk["prompt_token_ids"] = prompt_ids_.at(0);
        out += framed(chunk);
      }
    return out;
  }

  // The whole response (non-streaming), or the error that ended the request.
  json response() const {
    if (error_) throw *error_;
    json choices = json::array();
    Usage usage = this->usage();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceState& c = choices_[i];
      if (endpoint_ == Endpoint::chat) {
        json message = {{"role", "assistant"}};
        message["content"] = c.text.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.text);
        if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
        if (!c.tool_calls.empty()) message["tool_calls"] = c.tool_calls;
        choices.push_back({{"index", i},
                           {"message", std::move(message)},
                           {"logprobs", logprobs_ ? json{{"content", c.logprobs.is_null() ? json::array() : c.logprobs}}
                                                  : json(nullptr)},
                           {"finish_reason", c.finish_reason},
                           {"stop_reason", c.stop_string.empty() ? json(nullptr) : json(c.stop_string)}});
      } else {
        choices.push_back({{"index", i},
                           {"text", c.text},
                           {"logprobs", logprobs_ ? c.logprobs : json(nullptr)},
                           {"finish_reason", c.finish_reason},
                           {"stop_reason", c.stop_string.empty() ? json(nullptr) : json(c.stop_string)}});
        if (token_ids_) choices.back()["prompt_token_ids"] = prompt_ids_.at(i / static_cast<size_t>(n_));
        if (prompt_logprobs_ >= 0) choices.back()["prompt_logprobs"] = c.prompt_logprobs;
      }
      if (token_ids_) choices.back()["token_ids"] = c.token_ids;
    }
    json out = {{"id", header_.id},
                {"object", endpoint_ == Endpoint::chat ? "chat.completion" : "text_completion"},
                {"created", header_.created},
                {"model", header_.model},
                {"system_fingerprint", header_.fingerprint},
                {"choices", std::move(choices)},
                {"usage", usage_json(usage)}};
    if (token_ids_ && endpoint_ == Endpoint::chat) out["prompt_token_ids"] = prompt_ids_.at(0);
    if (prompt_logprobs_ >= 0 && endpoint_ == Endpoint::chat) out["prompt_logprobs"] = choices_.at(0).prompt_logprobs;
    return out;
  }

  bool stream() const { return stream_; }

 private:
  Usage usage() const {
    Usage u{prompt_tokens_, completion_tokens_, 0};
    for (int64_t c : cached_) u.cached_tokens += c;
    return u;
  }

  void handle(const engine::Event& e, Clock::time_point at, std::string* sse) {
    if (e.choice < 0 || e.choice >= static_cast<int>(choices_.size())) return;
    ChoiceState& c = choices_[e.choice];
    if (c.finished) return;
    if (!c.started && e.finish_reason != "error" && e.finish_reason != "cancelled") start(c, e.choice, e.prompt_logprobs, sse);
    if (e.kind == engine::Event::Kind::delta) {
      if (echo_only_) return;
      observe_tokens(c, e.tokens.size(), at);
      emit(c, e.choice, e.text, e.logprobs, e.tokens, "", sse);
      return;
    }
    if (e.finish_reason == "error") return fail(server_error(500, "generation failed: " + e.error), sse);
    // A client still listening sees "cancelled" only when the server stops.
    if (e.finish_reason == "cancelled") return fail(server_error(503, "the server is shutting down"), sse);
    c.finished = true;
    --open_choices_;
    const size_t prompt = static_cast<size_t>(e.choice / n_);
    cached_[prompt] = std::max(cached_[prompt], e.cached_prompt_tokens);
    if (echo_only_) {
      // The one token the engine sampled is not part of the answer.
      emit(c, e.choice, "", {}, {}, "length", sse);
    } else {
      c.stop_string = e.stop_string;
      completion_tokens_ += e.completion_tokens;
      emit(c, e.choice, e.text, e.logprobs, e.tokens, e.finish_reason, sse);
    }
    server_.metrics.count_finish(c.finish_reason);
    if (open_choices_ > 0) return;
    done_ = true;
    server_.metrics.request_latency.observe(seconds_since(arrival_));
    if (!sse) return;
    if (include_usage_)
      *sse += framed(
          usage_chunk(header_, endpoint_ == Endpoint::chat ? "chat.completion.chunk" : "text_completion", usage()));
    *sse += format_ ? format_->close() : std::string(kSseDone);
  }

  // A choice's first event: vLLM's prompt_logprobs, and with echo the prompt's text and logprobs,
  // come before anything generated (a chunk of their own when streaming).
  void start(ChoiceState& c, int index, const std::vector<engine::TokenLogprob>& prompt_logprobs, std::string* sse) {
    c.started = true;
    const tokenizer::Tokenizer& tok = *server_.model.tokenizer;
    const size_t prompt = static_cast<size_t>(index / n_);
    if (prompt_logprobs_ >= 0) c.prompt_logprobs = vllm_prompt_logprobs(tok, prompt_logprobs, prompt_logprobs_);
    const bool echo = !prompt_texts_.empty();
    if (!echo && !(sse && prompt_logprobs_ >= 0)) return;
    json lp = nullptr;
    if (echo && logprobs_) {
      lp = empty_completion_logprobs();
      append_prompt_completion_logprobs(lp, tok, first_tokens_.at(prompt), prompt_logprobs, top_logprobs_,
                                        c.text_offset);
      c.text_offset = static_cast<int64_t>(prompt_texts_.at(prompt).size());  // the generated text's offsets follow it
    }
    const std::string text = echo ? prompt_texts_.at(prompt) : "";
    if (!sse) {
      c.text = text;
      c.logprobs = std::move(lp);
      return;
    }
    json chunk = endpoint_ == Endpoint::chat ? chat_chunk(header_, index, json::object(), "")
                                             : completion_chunk(header_, index, text, "", std::move(lp));
    if (prompt_logprobs_ >= 0)
      (endpoint_ == Endpoint::chat ? chunk : chunk["choices"][0])["prompt_logprobs"] = c.prompt_logprobs;
    *sse += framed(chunk);
  }

  void observe_tokens(ChoiceState& c, size_t tokens, Clock::time_point now) {
    if (tokens == 0) return;
    if (!first_token_) {
      first_token_ = true;
      server_.metrics.time_to_first_token.observe(std::chrono::duration<double>(now - arrival_).count());
    }
    if (c.last_token) {
      const double gap = std::chrono::duration<double>(now - *c.last_token).count() / tokens;
      for (size_t i = 0; i < tokens; ++i) server_.metrics.inter_token_latency.observe(gap);
    }
    c.last_token = now;
  }

  // Text (and the end) of one choice, as a chunk or into the gathered response.
  void emit(ChoiceState& c, int index, const std::string& text, const std::vector<engine::TokenLogprob>& logprobs,
            const std::vector<int32_t>& tokens, const std::string& finish, std::string* sse) {
    const tokenizer::Tokenizer& tok = *server_.model.tokenizer;
    if (token_ids_ && !sse)
      for (const int32_t t : tokens) c.token_ids.push_back(t);
    // A streamed chunk carries its tokens' ids (and the first of a completion choice its prompt's).
    auto with_ids = [&](json chunk) {
      if (!token_ids_) return chunk;
      chunk["choices"][0]["token_ids"] = tokens;
      if (endpoint_ == Endpoint::completion && !c.sent_prompt_ids) {
        chunk["choices"][0]["prompt_token_ids"] = prompt_ids_.at(static_cast<size_t>(index / n_));
        c.sent_prompt_ids = true;
      }
      return chunk;
    };
    if (endpoint_ == Endpoint::completion) {
      json lp = nullptr;
      if (logprobs_) {
        if (c.logprobs.is_null()) c.logprobs = empty_completion_logprobs();
        if (sse) lp = empty_completion_logprobs();
        append_completion_logprobs(sse ? lp : c.logprobs, tok, logprobs, c.text_offset);
      }
      if (!finish.empty()) c.finish_reason = finish;
      if (sse) {
        if (!text.empty() || !finish.empty() || !logprobs.empty() || (token_ids_ && !tokens.empty()))
          *sse += sse_event(with_stop(c, with_ids(completion_chunk(header_, index, text, finish, std::move(lp)))));
      } else {
        c.text += text;
      }
      return;
    }
    ChatDelta delta = c.parser->push(text);
    if (!finish.empty()) {
      ChatDelta rest = c.parser->finish();
      delta.reasoning += rest.reasoning;
      delta.content += rest.content;
      for (ToolCallDelta& d : rest.calls) {
        if (!delta.calls.empty() && delta.calls.back().index == d.index)
          delta.calls.back().arguments += d.arguments;
        else
          delta.calls.push_back(std::move(d));
      }
      c.finish_reason = client_finish_reason(finish, c.parser->tool_calls());
    }
    json lp = nullptr;
    if (logprobs_) {
      json entries = chat_logprob_entries(tok, logprobs);
      if (c.logprobs.is_null()) c.logprobs = json::array();
      if (sse)
        lp = {{"content", std::move(entries)}};
      else
        c.logprobs.insert(c.logprobs.end(), entries.begin(), entries.end());
    }
    if (sse) {
      if (!delta.empty() || !finish.empty() || !logprobs.empty() || (token_ids_ && !tokens.empty()))
        *sse += framed(with_stop(
            c, with_ids(chat_chunk(header_, index, chat_delta_json(delta, c.call_ids), c.finish_reason, std::move(lp)))));
      return;
    }
    c.reasoning += delta.reasoning;
    c.text += delta.content;
    for (const ToolCallDelta& d : delta.calls) {
      if (!d.name.empty())
        c.tool_calls.push_back(
            {{"id", random_id("call_")}, {"type", "function"}, {"function", {{"name", d.name}, {"arguments", ""}}}});
      if (d.index < static_cast<int>(c.tool_calls.size()))
        c.tool_calls[d.index]["function"]["arguments"] =
            c.tool_calls[d.index]["function"]["arguments"].get<std::string>() + d.arguments;
    }
  }

  // A chunk as the client's API frames it.
  std::string framed(const json& chunk) { return format_ ? format_->chunk(chunk) : sse_event(chunk); }

  // The chunk that finishes a choice names the stop string that ended it (vLLM's stop_reason).
  static json with_stop(const ChoiceState& c, json chunk) {
    if (!c.finish_reason.empty() && !chunk["choices"].empty())
      chunk["choices"][0]["stop_reason"] = c.stop_string.empty() ? json(nullptr) : json(c.stop_string);
    return chunk;
  }

  void fail(ApiError error, std::string* sse) {
    cancel_all();
    done_ = true;
    for (ChoiceState& c : choices_)
      if (!c.finished) server_.metrics.count_finish(error.status == 503 ? "cancelled" : "error");
    if (sse && format_) {
      *sse += format_->error(error);
    } else if (sse) {
      // openai clients raise an APIError for an "error" event in a stream.
      json body = error.body();
      body["error"]["code"] = error.status;
      *sse += sse_event(body);
      *sse += kSseDone;
    }
    error_ = std::move(error);
  }

  Impl& server_;
  const Endpoint endpoint_;
  const bool stream_, include_usage_;
  const int n_;
  const bool logprobs_;
  const int32_t top_logprobs_, prompt_logprobs_;
  const bool token_ids_;
  const Clock::time_point arrival_;
  ResponseHeader header_;
  std::vector<ChoiceState> choices_;
  std::vector<int64_t> cached_;  // cached prompt tokens per prompt
  std::vector<std::vector<int32_t>> prompt_ids_;  // per prompt, with return_token_ids
  std::vector<int32_t> first_tokens_;             // per prompt
  std::vector<std::string> prompt_texts_;         // per prompt, with echo
  bool echo_only_ = false;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  int open_choices_ = 0;
  bool first_token_ = false;
  bool done_ = false;
  std::optional<ApiError> error_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<std::pair<engine::Event, Clock::time_point>> inbox_;
  std::vector<uint64_t> ids_;
  bool cancelled_ = false;
  bool gone_ = false;
  std::unique_ptr<StreamFormat> format_;
};

void Server::Impl::check_model(const std::string& requested) const {
  if (!requested.empty() && requested != model.name)
    throw ApiError(404, "invalid_request_error", "model_not_found", "model",
                   fmt::format("The model `{}` does not exist; this server serves `{}`.", requested, model.name));
}

engine::RequestParams Server::Impl::params_for(const GenerationRequest& r, std::vector<int32_t> prompt,
                                               const std::string& prompt_field, grammar::Reasoning reasoning) const {
  const int64_t p = static_cast<int64_t>(prompt.size());
  if (p == 0) bad_request(prompt_field, "{}: the prompt is empty", prompt_field);
  if (p >= model.max_context)
    bad_request(prompt_field, "{}: this model's maximum context length is {} tokens, and the prompt has {}",
                prompt_field, model.max_context, p);
  if (r.max_tokens && p + *r.max_tokens > model.max_context)
    bad_request("max_tokens",
                "max_tokens: this model's maximum context length is {} tokens; you asked for {} ({} in the prompt, "
                "{} for the completion)",
                model.max_context, p + *r.max_tokens, p, *r.max_tokens);
  engine::RequestParams params;
  params.prompt = std::move(prompt);
  params.sampling = r.sampling;
  if (!r.seeded) {
    static std::mutex mutex;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard lock(mutex);
    params.sampling.seed = rng();
  }
  params.max_tokens = static_cast<int32_t>(r.max_tokens.value_or(model.max_context - p));
  params.n = r.n;
  params.stop = r.stop;
  params.include_stop_str = r.include_stop_str;
  if (!r.ignore_eos) params.stop_ids = model.stop_ids;
  const int32_t vocab = model.tokenizer->vocab_size();
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i) {
    const int32_t id = r.stop_token_ids[i];
    if (id >= vocab)
      bad_request("stop_token_ids", "stop_token_ids[{}]: token id {} is outside the vocabulary (0 to {})", i, id,
                  vocab - 1);
    if (std::find(params.stop_ids.begin(), params.stop_ids.end(), id) == params.stop_ids.end())
      params.stop_ids.push_back(id);
  }
  params.min_tokens = r.min_tokens;
  for (const auto* ids : {&r.banned_tokens, &r.exclusive_tokens})
    for (const int32_t id : *ids)
      if (id >= model.tokenizer->vocab_size())
        bad_request("logit_bias", "logit_bias: token {} is outside the vocabulary 0..{}", id, model.tokenizer->vocab_size() - 1);
  params.banned_tokens = r.banned_tokens;
  params.exclusive_tokens = r.exclusive_tokens;
  if (r.min_tokens > params.max_tokens)
    bad_request("min_tokens", "min_tokens: {} is more than max_tokens ({})", r.min_tokens, params.max_tokens);
  params.top_logprobs = r.top_logprobs;
  params.prompt_logprobs = r.prompt_logprobs;
  if (r.constraint.kind != grammar::ConstraintSpec::Kind::none)
    params.constraint = constraint_for(r, reasoning, params.stop_ids);
  return params;
}

std::shared_ptr<grammar::GrammarMasks> Server::Impl::constraint_for(const GenerationRequest& r,
                                                                    grammar::Reasoning reasoning,
                                                                    const std::vector<int32_t>& stop_ids) const {
  std::call_once(constraints_once, [&] {
    constraints = std::make_unique<grammar::ConstraintCache>(grammar::TokenTrie::from_tokenizer(*model.tokenizer));
  });
  try {
    return constraints->get(r.constraint, reasoning, stop_ids);
  } catch (const qinfer::Error& e) {
    // Tool errors name the tool's field themselves.
    if (r.constraint.kind == grammar::ConstraintSpec::Kind::tool_calls) bad_request(r.constraint_field, "{}", e.what());
    bad_request(r.constraint_field, "{}: {}", r.constraint_field, e.what());
  }
}

std::shared_ptr<Server::Impl::Session> Server::Impl::chat_session(const json& body,
                                                                  std::unique_ptr<StreamFormat> format) {
  ChatRequest r = parse_chat_request(body, model.sampling_defaults, options.limits);
  if (format) r.include_usage = true;
  check_model(r.model);
  if (!model.chat_template)
    bad_request("messages", "this model has no chat template; send a prompt to /v1/completions instead");
  if (!r.tools.empty() && tool_format == ToolCallFormat::none)
    bad_request("tools", "tools: this model's chat template has no tool-call format");
  std::string prompt;
  try {
    prompt = model.chat_template->render(r.template_request);
  } catch (const qinfer::Error& e) {
    bad_request("messages", "the chat template rejected the request: {}", e.what());
  }
  ChatOutputOptions output;
  output.split_reasoning = split_reasoning;
  if (r.tool_choice != ToolChoice::none) {
    output.tool_format = tool_format;
    output.tools = r.tools;
  }
  if (r.constraint.kind != grammar::ConstraintSpec::Kind::none && r.tool_choice != ToolChoice::none)
    bad_request(r.constraint_field, "{}: a structured output cannot be combined with tools (tool_choice \"none\" or no "
                "tools)", r.constraint_field);
  if (r.tool_choice != ToolChoice::none) {
    // The calls follow the format's grammar: declared names, arguments their schemas accept.
    r.constraint = tool_call_constraint(r, tool_format);
    r.constraint_field = "tools";
  }
  output.reasoning_open = split_reasoning && engine::prompt_opens_reasoning(prompt);
  const grammar::Reasoning reasoning = engine::answer_start(split_reasoning, prompt);
  if (r.constraint.kind != grammar::ConstraintSpec::Kind::none) {
    // A constrained answer is content (and calls) all through, "<think>" inside a JSON string included.
    output.split_reasoning = reasoning != grammar::Reasoning::none;
    output.reasoning_leading_only = true;
  }
  auto session = std::make_shared<Session>(*this, Endpoint::chat, r, 1);
  session->use_chat_output(output);
  if (r.stream && format) session->use_format(std::move(format));
  std::vector<engine::RequestParams> params;
  params.push_back(
      params_for(r, model.tokenizer->encode(prompt, r.add_special_tokens.value_or(false)), "messages", reasoning));
  session->submit(std::move(params));
  return session;
}

std::shared_ptr<Server::Impl::Session> Server::Impl::completion_session(const json& body) {
  CompletionRequest r = parse_completion_request(body, model.sampling_defaults, options.limits);
  check_model(r.model);
  std::vector<engine::RequestParams> params;
  const int32_t vocab = model.tokenizer->vocab_size();
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const std::string field = r.prompts.size() > 1 ? fmt::format("prompt[{}]", i) : "prompt";
    std::vector<int32_t> ids = r.prompts[i].ids;
    if (r.prompts[i].is_ids) {
      for (int32_t id : ids)
        if (id >= vocab)
          bad_request(field, "{}: token id {} is outside the vocabulary (0 to {})", field, id, vocab - 1);
    } else {
      ids = model.tokenizer->encode(r.prompts[i].text, r.add_special_tokens.value_or(true));
    }
    params.push_back(params_for(r, std::move(ids), field));
    if (r.echo) {
      // The prompt's logprobs come with an echo that asks for logprobs; max_tokens 0 still samples
      // one token (the engine always does), which the answer leaves out.
      if (r.top_logprobs >= 0) params.back().prompt_logprobs = std::max(params.back().prompt_logprobs, r.top_logprobs);
      if (params.back().max_tokens == 0) params.back().max_tokens = 1;
    }
  }
  auto session = std::make_shared<Session>(*this, Endpoint::completion, r, r.prompts.size());
  if (r.echo) {
    std::vector<std::string> texts;
    for (size_t i = 0; i < r.prompts.size(); ++i)
      texts.push_back(r.prompts[i].is_ids ? model.tokenizer->decode(params[i].prompt) : r.prompts[i].text);
    session->use_echo(std::move(texts), r.max_tokens == 0);
  }
  session->submit(std::move(params));
  return session;
}

void Server::Impl::generate(const http::Request& req, http::Responder& res, Endpoint endpoint,
                            const http::Headers& cors) {
  auto fail_with = [&](const ApiError& e) {
    count(req, e.status);
    http::Response r = error_response(e);
    if (endpoint == Endpoint::messages) r.body = dump(anthropic_error_body(e));
    r.headers.insert(r.headers.end(), cors.begin(), cors.end());
    res.send(std::move(r));
  };
  std::shared_ptr<Session> session;
  std::optional<ResponsesRequest> reframed;  // of /v1/responses
  try {
    if (stopping) throw server_error(503, "the server is shutting down");
    const json body = parse_body(req.body);
    if (endpoint == Endpoint::messages) {
      session = chat_session(anthropic_chat_body(body), anthropic_stream(model.name));
    } else if (endpoint == Endpoint::responses) {
      reframed = responses_request(body, responses);
      // Only a stream needs the request beside the session: a whole answer is reframed below.
      session = chat_session(reframed->chat, reframed->stream ? responses_stream(*reframed, responses) : nullptr);
    } else {
      session = endpoint == Endpoint::chat ? chat_session(body) : completion_session(body);
    }
  } catch (const ApiError& e) {
    return fail_with(e);
  }
  {
    std::lock_guard lock(sessions_mutex);
    std::erase_if(sessions, [](const std::weak_ptr<Session>& s) { return s.expired(); });
    sessions.push_back(session);
  }
  if (stopping) session->cancel_all();  // stop() may have swept the sessions just before this one
  res.on_client_gone([session] { session->client_gone(); });
  if (session->stream()) {
    metrics.stream_opened();
    http::Headers headers = cors;
    headers.emplace_back("Cache-Control", "no-cache");
    std::string out = session->opening();
    bool open = res.begin_stream(200, "text/event-stream", std::move(headers));
    while (open) {
      const bool done = session->pump(&out, 50ms);
      if (!out.empty()) open = res.write(out);
      out.clear();
      if (done) break;
    }
    if (!open) session->abandon();  // the client went away
    count(req, 200);
    metrics.stream_closed();
    res.end_stream();
    return;
  }
  try {
    while (!session->pump(nullptr, 1000ms)) {
    }
    if (res.client_gone()) return;
    json answer = session->response();
    if (endpoint == Endpoint::messages) {
      answer = anthropic_message(answer);
    } else if (endpoint == Endpoint::responses) {
      const json message = assistant_message(answer);
      answer = responses_object(*reframed, answer);
      responses.keep(*reframed, answer, message);
    }
    http::Response r = json_response(answer);
    r.headers = cors;
    count(req, 200);
    res.send(std::move(r));
  } catch (const ApiError& e) {
    fail_with(e);
  } catch (const std::bad_alloc&) {
    session->cancel_all();
    ApiError e = server_error(503, "the server ran out of memory for this request; retry later or send less");
    e.retry_after_s = 1;
    fail_with(e);
  } catch (const std::exception& e) {
    session->cancel_all();
    log_error("{} {}: {}", req.method, req.path, e.what());
    fail_with(server_error(500, fmt::format("internal error: {}", e.what())));
  }
}

http::Headers Server::Impl::cors_headers(const http::Request& req) const {
  const std::string* origin = req.header("origin");
  if (!origin || options.allowed_origins.empty()) return {};
  const bool allowed = std::any_of(options.allowed_origins.begin(), options.allowed_origins.end(),
                                   [&](const std::string& o) { return o == "*" || o == *origin; });
  if (!allowed) return {};
  // The origin itself, not "*": an API key in Authorization is a credential the browser must be allowed to send.
  return {{"Access-Control-Allow-Origin", *origin}, {"Vary", "Origin"}};
}

bool Server::Impl::host_allowed(std::string_view host) const {
  auto lower = [](std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
    return out;
  };
  static const std::set<std::string> names = {"localhost", "::1"};
  // A 127/8 address literal (a name such as "127.example.com" is not one).
  auto loopback = [](const std::string& n) {
    return names.contains(n) || (n.starts_with("127.") && n.find_first_not_of("0123456789.") == std::string::npos);
  };
  const bool loopback_bind = loopback(lower(options.host));
  if (options.allowed_hosts.empty() && !loopback_bind) return true;
  // The name without its port ("[::1]:8000" -> "::1").
  std::string name;
  if (host.starts_with('[')) {
    name = std::string(host.substr(1, host.find(']') == std::string_view::npos ? 0 : host.find(']') - 1));
  } else {
    name = std::string(host.substr(0, host.find(':')));
  }
  name = lower(name);
  if (loopback(name)) return true;
  for (const std::string& allowed : options.allowed_hosts)
    if (allowed == "*" || lower(allowed) == name) return true;
  return false;
}

void Server::Impl::check_body_model(const json& body) const {
  if (const json* m = body.contains("model") ? &body["model"] : nullptr; m && !m->is_null()) {
    if (!m->is_string()) bad_request("model", "model: expected a string");
    check_model(m->get<std::string>());
  }
}

json Server::Impl::tokenize(const json& body) const {
  check_body_model(body);
  if (body.contains("return_token_strs") && body["return_token_strs"] == true)
    bad_request("return_token_strs", "return_token_strs: not supported (token strings are not kept)");
  const bool chat = body.contains("messages");
  if (chat == body.contains("prompt")) bad_request(chat ? "prompt" : "", "send either \"prompt\" or \"messages\"");
  auto flag = [&](const char* key, bool fallback) {
    if (!body.contains(key) || body[key].is_null()) return fallback;
    if (!body[key].is_boolean()) bad_request(key, "{}: expected a boolean", key);
    return body[key].get<bool>();
  };
  std::vector<int32_t> ids;
  if (chat) {
    if (!model.chat_template) bad_request("messages", "this model has no chat template; send a prompt");
    json request = json::object();
    for (const char* key : {"messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "documents"})
      if (body.contains(key)) request[key] = body[key];
    const ChatRequest r = parse_chat_request(request, model.sampling_defaults, options.limits);
    std::string prompt;
    try {
      prompt = model.chat_template->render(r.template_request);
    } catch (const qinfer::Error& e) {
      bad_request("messages", "the chat template rejected the request: {}", e.what());
    }
    ids = model.tokenizer->encode(prompt, flag("add_special_tokens", false));
  } else {
    if (!body["prompt"].is_string()) bad_request("prompt", "prompt: expected a string");
    ids = model.tokenizer->encode(body["prompt"].get<std::string>(), flag("add_special_tokens", true));
  }
  return {{"count", ids.size()}, {"max_model_len", model.max_context}, {"tokens", ids}, {"token_strs", nullptr}};
}

json Server::Impl::detokenize(const json& body) const {
  check_body_model(body);
  if (!body.contains("tokens") || !body["tokens"].is_array()) bad_request("tokens", "tokens: expected an array of token ids");
  std::vector<int32_t> ids;
  const int32_t vocab = model.tokenizer->vocab_size();
  for (size_t i = 0; i < body["tokens"].size(); ++i) {
    const json& t = body["tokens"][i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      bad_request("tokens", "tokens[{}]: expected a token id from 0 to {}, got {}", i, vocab - 1, dump(t));
    ids.push_back(t.get<int32_t>());
  }
  return {{"prompt", model.tokenizer->decode(ids)}};
}

json Server::Impl::health() const {
  const engine::EngineStats s = generator.stats();
  return {{"status", stopping ? "stopping" : "ok"},
          {"model", model.name},
          {"running", s.running},
          {"waiting", s.waiting},
          {"kv_blocks_used", s.kv_blocks_used},
          {"kv_blocks_total", s.kv_blocks_total},
          {"state_slots_used", s.state_slots_used},
          {"state_slots_total", s.state_slots_total}};
}

void Server::Impl::serve(http::Request& req, http::Responder& res) {
  const bool anthropic = req.path.starts_with("/v1/messages");
  const http::Headers cors = cors_headers(req);
  auto send = [&](http::Response r) {
    count(req, r.status);
    r.headers.insert(r.headers.end(), cors.begin(), cors.end());
    res.send(std::move(r));
  };
  // Anthropic's clients read their own error shape.
  auto send_error = [&](const ApiError& e) {
    http::Response r = error_response(e);
    if (anthropic) r.body = dump(anthropic_error_body(e));
    send(std::move(r));
  };
  try {
    if (const std::string* host = req.header("host"); host && !host_allowed(*host))
      throw ApiError(403, "invalid_request_error", "host_not_allowed", "",
                     fmt::format("Host \"{}\" is not served here (allow it with --allowed-hosts)", *host));
    // A browser's preflight: answered for allowed origins only, and before the API key (it carries none).
    if (req.method == "OPTIONS" && !cors.empty() && req.header("access-control-request-method")) {
      http::Response r{204, "", "", {}};
      r.headers = {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                   {"Access-Control-Allow-Headers",
                    req.header_or("access-control-request-headers", "Authorization, Content-Type")},
                   {"Access-Control-Max-Age", "600"}};
      send(std::move(r));
      return;
    }
    // Bodies are JSON only when they say so: a web page's cross-site form or text/plain POST (which
    // a browser sends without asking) cannot reach a local server's API.
    if (req.method == "POST") {
      std::string media = req.header_or("content-type");
      media = media.substr(0, media.find(';'));
      while (!media.empty() && media.back() == ' ') media.pop_back();
      std::transform(media.begin(), media.end(), media.begin(), [](unsigned char c) { return std::tolower(c); });
      if (media != "application/json")
        throw ApiError(415, "invalid_request_error", "unsupported_media_type", "",
                       fmt::format("the request body must be sent as \"Content-Type: application/json\"{}",
                                   media.empty() ? "" : fmt::format(", not \"{}\"", media)));
    }
    const bool guarded = req.path.starts_with("/v1/") || req.path == "/tokenize" || req.path == "/detokenize";
    if (!options.api_key.empty() && guarded) {
      // Anthropic's clients send the key as x-api-key.
      const std::string* x_api_key = req.header("x-api-key");
      const std::string given = x_api_key ? "Bearer " + *x_api_key : req.header_or("authorization");
      const std::string expected = "Bearer " + options.api_key;
      // Compared in full whatever the mismatch, so timing does not reveal a prefix.
      unsigned char diff = given.size() == expected.size() ? 0 : 1;
      for (size_t i = 0; i < expected.size(); ++i) diff |= expected[i] ^ (i < given.size() ? given[i] : 0);
      if (diff != 0)
        throw ApiError(401, "invalid_request_error", "invalid_api_key", "",
                       given.empty() ? "missing API key: send \"Authorization: Bearer <key>\" (or \"x-api-key: <key>\")"
                                     : "incorrect API key");
    }
    const bool post = req.method == "POST", get = req.method == "GET" || req.method == "HEAD";
    if (post && (req.path == "/v1/chat/completions" || req.path == "/v1/completions" || req.path == "/v1/messages" ||
                 req.path == "/v1/responses")) {
      generate(req, res,
               req.path == "/v1/chat/completions" ? Endpoint::chat
               : req.path == "/v1/messages"       ? Endpoint::messages
               : req.path == "/v1/responses"      ? Endpoint::responses
                                                  : Endpoint::completion,
               cors);
    } else if ((get || req.method == "DELETE") && req.path.starts_with("/v1/responses/")) {
      const std::string id = req.path.substr(std::string_view("/v1/responses/").size());
      const std::optional<json> stored = responses.response(id);
      if (!stored)
        throw ApiError(404, "invalid_request_error", "not_found", "", fmt::format("Response with id '{}' not found.", id));
      if (get) {
        send(json_response(*stored));
      } else {
        responses.erase(id);
        send(json_response({{"id", id}, {"object", "response.deleted"}, {"deleted", true}}));
      }
    } else if (post && req.path == "/v1/messages/count_tokens") {
      send(json_response(count_tokens(parse_body(req.body))));
    } else if (get && req.path == "/v1/models") {
      send(json_response({{"object", "list"}, {"data", json::array({model_card()})}}));
    } else if (get && req.path.starts_with("/v1/models/")) {
      check_model(req.path.substr(std::string_view("/v1/models/").size()));
      send(json_response(model_card()));
    } else if (post && req.path == "/tokenize") {
      send(json_response(tokenize(parse_body(req.body))));
    } else if (post && req.path == "/detokenize") {
      send(json_response(detokenize(parse_body(req.body))));
    } else if (get && req.path == "/health") {
      http::Response r = json_response(health());
      if (stopping) r.status = 503;
      send(std::move(r));
    } else if (get && req.path == "/metrics") {
      send({200, "text/plain; version=0.0.4", metrics.render(generator.stats()), {}});
    } else {
      throw ApiError(404, "invalid_request_error", "not_found", "", fmt::format("{} {}: no such endpoint", req.method, req.path));
    }
  } catch (const ApiError& e) {
    if (!res.answered()) send_error(e);
  } catch (const std::bad_alloc&) {
    // One request too large for the memory left: it fails, the server and the others go on.
    log_warn("{} {}: out of memory", req.method, req.path);
    if (!res.answered()) {
      ApiError e = server_error(503, "the server ran out of memory for this request; retry later or send less");
      e.retry_after_s = 1;
      send_error(e);
    }
  } catch (const std::exception& e) {
    log_error("{} {}: {}", req.method, req.path, e.what());
    if (!res.answered()) send_error(server_error(500, fmt::format("internal error: {}", e.what())));
  }
}

void Server::Impl::count(const http::Request& req, int status) {
  static const std::set<std::string> known = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                                              "/v1/messages/count_tokens", "/v1/models", "/health", "/metrics",
                                              "/tokenize", "/detokenize"};
  metrics.count_request(known.contains(req.path) ? req.path : "other", status);
  log_debug("{} {} {}", req.method, req.path, status);
}

json Server::Impl::count_tokens(const json& body) const {
  const json chat = anthropic_chat_body(body, /*count_only=*/true);
  const ChatRequest r = parse_chat_request(chat, model.sampling_defaults, options.limits);
  check_model(r.model);
  if (!model.chat_template) bad_request("messages", "this model has no chat template");
  std::string prompt;
  try {
    prompt = model.chat_template->render(r.template_request);
  } catch (const qinfer::Error& e) {
    bad_request("messages", "the chat template rejected the request: {}", e.what());
  }
  return {{"input_tokens", model.tokenizer->encode(prompt, false).size()}};
}

json Server::Impl::model_card() const {
  return json{{"id", model.name},
              {"object", "model"},
              {"created", unix_now()},
              {"owned_by", "qinfer"},
              {"max_model_len", model.max_context}};
}

void Server::Impl::stop() {
  std::lock_guard guard(stop_mutex);
  if (!http) return;
  stopping = true;
  http->stop_accepting();
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(sessions_mutex);
    for (const auto& weak : sessions)
      if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (const auto& s : live) s->cancel_all();
  live.clear();
  // Give streams a moment to write their closing error; then close every connection.
  http->stop(2s);
  http.reset();
}

SamplingParams sampling_defaults(const std::filesystem::path& model_dir) {
  SamplingParams s;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  const auto path = model_dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return s;
  const io::json g = io::read_json_file(path);
  auto number = [&](const char* key, float& into) {
    if (auto it = g.find(key); it != g.end() && it->is_number()) into = it->get<float>();
  };
  number("temperature", s.temperature);
  number("top_p", s.top_p);
  number("min_p", s.min_p);
  number("repetition_penalty", s.repetition_penalty);
  if (auto it = g.find("top_k"); it != g.end() && it->is_number_integer()) s.top_k = std::max(0, it->get<int32_t>());
  // do_sample false in the file means greedy.
  if (auto it = g.find("do_sample"); it != g.end() && it->is_boolean() && !it->get<bool>()) s.temperature = 0;
  return s;
}

Server::Server(ServerOptions options, ServedModel model, Generator& generator)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(model), generator)) {
  QINFER_CHECK(impl_->model.tokenizer, "server: the served model has no tokenizer");
  QINFER_CHECK(impl_->model.max_context > 0, "server: max_context must be positive");
}

Server::~Server() { stop(); }

int Server::start() { return start(http::Listener(impl_->options.host, impl_->options.port)); }

int Server::start(http::Listener listener) {
  Impl& i = *impl_;
  QINFER_CHECK(!i.http, "server: start() called twice");
  const ServerOptions& o = i.options;
  http::ServerLimits limits;
  limits.parser.max_body_bytes = o.max_body_bytes;
  limits.max_connections = o.max_connections;
  // Generation requests hold a worker while they run; the scheduler decides how many run at once.
  limits.workers = o.http_threads > 0 ? o.http_threads : o.max_running + o.max_queue + 16;
  limits.header_timeout = o.header_timeout;
  limits.body_timeout = o.body_timeout;
  limits.idle_timeout = o.idle_timeout;
  auto error_body = [&i](int status, const std::string& message) {
    i.metrics.count_request("other", status);
    ApiError e(status, status >= 500 ? "server_error" : "invalid_request_error", "", "", message);
    if (status == 503) e.retry_after_s = 1;
    return error_response(e);
  };
  i.http = std::make_unique<http::Server>(limits, [&i](http::Request& req, http::Responder& res) { i.serve(req, res); },
                                          error_body);
  i.port = listener.port();
  i.http->start(std::move(listener));
  return i.port;
}

void Server::stop_accepting() {
  Impl& i = *impl_;
  i.stopping = true;
  std::lock_guard guard(i.stop_mutex);
  if (i.http) i.http->stop_accepting();
}

size_t Server::in_progress() const {
  std::lock_guard lock(impl_->sessions_mutex);
  return static_cast<size_t>(std::count_if(impl_->sessions.begin(), impl_->sessions.end(),
                                           [](const std::weak_ptr<Impl::Session>& s) { return !s.expired(); }));
}

void Server::stop() { impl_->stop(); }

int Server::port() const { return impl_->port; }

}  // namespace qinfer::server
