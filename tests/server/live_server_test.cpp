// The server on the real Scheduler and tiny random-weight models (a Qwen3 dense one with Qwen3's
// template and Hermes tool calls, a Qwen3.5 hybrid one with a Qwen3.5-style template, XML tool calls
// and recurrent-state slots), driven by the real `openai` npm client; then `qinfer serve` itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "core/thread_pool.h"
#include "engine/generate.h"
#include "engine/engine.h"
#include "models/model.h"
#include "models/random_checkpoint.h"
#include "parallel/process_group.h"
#include "server/server.h"
#include "server_test_util.h"
#include "support/run_command.h"
#include "support/safetensors_writer.h"

namespace qinfer::server::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int kVocab = 663;  // the mini tokenizer's ids exactly: a random model samples every id it has

json text_config(int64_t positions, int64_t vocab = kVocab) {
  return {{"hidden_size", 64},    {"num_attention_heads", 2},       {"num_key_value_heads", 1},
          {"head_dim", 32},       {"intermediate_size", 128},       {"vocab_size", vocab},
          {"rms_norm_eps", 1e-6}, {"max_position_embeddings", positions}};
}

// The real Qwen3 tokenizer and its chat template (scripts/fetch-test-data.sh fetches them).
fs::path qwen3_tokenizer_dir() { return repo_root() / ".deps" / "qwen3-tokenizer"; }
constexpr int64_t kQwen3Vocab = 151936;  // Qwen3's embedding rows (the tokenizer has 151,669 ids)

// A model folder: random weights, the in-repo Qwen3.5-style mini tokenizer, and a chat template
// from tests/jinja/data.
class TinyModelDir {
 public:
  struct RealQwen3Tokenizer {};
  // A Qwen3 dense model with the real Qwen3 tokenizer and its own chat template.
  explicit TinyModelDir(RealQwen3Tokenizer, int64_t positions = 2048) {
    json config = text_config(positions, kQwen3Vocab);
    config.update({{"model_type", "qwen3"},
                   {"num_hidden_layers", 2},
                   {"rope_theta", 1e6},
                   {"tie_word_embeddings", true},
                   {"torch_dtype", "bfloat16"}});
    models::write_random_checkpoint(dir_.path(), io::json::parse(config.dump()), 7);
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(qwen3_tokenizer_dir() / file, dir_ / file);
  }
  TinyModelDir(bool hybrid, const std::string& template_file, int64_t positions = 2048) {
    json config;
    if (hybrid) {
      json text = text_config(positions);
      text.update({{"model_type", "qwen3_5_text"},
                   {"num_hidden_layers", 4},
                   {"linear_num_key_heads", 2},
                   {"linear_num_value_heads", 4},
                   {"linear_key_head_dim", 16},
                   {"linear_value_head_dim", 16},
                   {"linear_conv_kernel_dim", 4},
                   {"full_attention_interval", 4},
                   {"mtp_num_hidden_layers", 0},
                   {"rope_parameters",
                    {{"rope_type", "default"},
                     {"rope_theta", 1e7},
                     {"partial_rotary_factor", 0.25},
                     {"mrope_section", {2, 1, 1}},
                     {"mrope_interleaved", true}}}});
      config = {
          {"model_type", "qwen3_5"}, {"torch_dtype", "bfloat16"}, {"tie_word_embeddings", true}, {"text_config", text}};
    } else {
      config = text_config(positions);
      config.update({{"model_type", "qwen3"},
                     {"num_hidden_layers", 2},
                     {"rope_theta", 1e6},
                     {"tie_word_embeddings", true},
                     {"torch_dtype", "bfloat16"}});
    }
    models::write_random_checkpoint(dir_.path(), io::json::parse(config.dump()), hybrid ? 35 : 3);
    const fs::path mini = repo_root() / "tests" / "tokenizer" / "data" / "qwen35_mini";
    fs::copy_file(mini / "tokenizer.json", dir_ / "tokenizer.json");
    json tokenizer_config = json::parse(read_file(mini / "tokenizer_config.json"));
    tokenizer_config["chat_template"] = read_file(repo_root() / "tests" / "jinja" / "data" / template_file);
    std::ofstream(dir_ / "tokenizer_config.json") << tokenizer_config.dump(2);
  }
  const fs::path& path() const { return dir_.path(); }

 private:
  qinfer::testing::TempDir dir_;
};

// The server as `qinfer serve` assembles it, in-process on a free port.
class LiveServer {
 public:
  LiveServer(bool hybrid, const std::string& template_file, int64_t max_context = 1024)
      : LiveServer(std::make_unique<TinyModelDir>(hybrid, template_file, std::max<int64_t>(2048, max_context)),
                   max_context) {}
  // A model folder made elsewhere (owned: removed with the server), or one in the repository.
  LiveServer(std::unique_ptr<TinyModelDir> dir, int64_t max_context)
      : LiveServer(dir->path(), max_context, std::move(dir)) {}
  LiveServer(const fs::path& model_dir, int64_t max_context) : LiveServer(model_dir, max_context, nullptr) {}
  LiveServer(const fs::path& model_dir, int64_t max_context, std::unique_ptr<TinyModelDir>&& owned)
      : owned_(std::move(owned)),
        path_(model_dir),
        checkpoint_(models::open_checkpoint(path_)),
        ops_(make_cpu_ops(global_thread_pool())),
        model_(checkpoint_, *ops_),
        tokenizer_(tokenizer::Tokenizer::load(path_)),
        template_(tokenizer::ChatTemplate::from_model_dir(path_)),
        engine_(model_, tokenizer_, engine_options(max_context)),
        generator_(engine_) {
    ServedModel served;
    served.name = path_.filename().string();
    served.tokenizer = &tokenizer_;
    served.chat_template = &template_;
    served.chat_template_source = tokenizer_.config().chat_template;
    served.stop_ids = engine::stop_ids(path_, checkpoint_.config, tokenizer_);
    served.max_context = engine_.options().max_context;
    served.sampling_defaults = sampling_defaults(path_);
    ServerOptions options;
    options.port = 0;
    options.http_threads = 128;
    server_ = std::make_unique<Server>(options, served, generator_);
    port_ = server_->start();
  }
  ~LiveServer() { server_->stop(); }

  int port() const { return port_; }
  const fs::path& dir() const { return path_; }
  engine::EngineStats stats() const { return engine_.stats(); }

 private:
  static engine::EngineOptions engine_options(int64_t max_context) {
    engine::EngineOptions o;
    o.max_running = 64;
    o.max_waiting = 256;
    o.max_context = max_context;
    return o;
  }

  std::unique_ptr<TinyModelDir> owned_;
  fs::path path_;
  models::Checkpoint checkpoint_;
  std::unique_ptr<Ops> ops_;
  models::Model model_;
  tokenizer::Tokenizer tokenizer_;
  tokenizer::ChatTemplate template_;
  engine::Engine engine_;
  EngineGenerator generator_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

// Runs tests/server/node/<script> against the server; fails clearly when node or the openai package
// is missing (scripts/install-deps.sh and scripts/fetch-test-data.sh install them).
void run_node(const std::string& script, int port, const std::string& env = "") {
  ASSERT_EQ(std::system("command -v node >/dev/null 2>&1"), 0)
      << "node is not installed: the server tests drive the server with the openai npm client";
  ASSERT_TRUE(fs::exists(repo_root() / ".deps" / "node" / "node_modules" / "openai" / "package.json"))
      << "the openai npm package is missing: run scripts/fetch-test-data.sh";
  const fs::path file = repo_root() / "tests" / "server" / "node" / script;
  const qinfer::testing::CommandResult r =
      qinfer::testing::run_command(env + " node '" + file.string() + "' http://127.0.0.1:" + std::to_string(port) + "/v1");
  EXPECT_EQ(r.status, 0) << "node " << script << " failed:\n" << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("checks passed")) << r.err;
  std::cout << r.out;
}

void expect_all_free(const LiveServer& s) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (s.stats().running + s.stats().waiting > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  const engine::EngineStats st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.state_slots_used, 0);
}

TEST(LiveServer, OpenAIClientOnQwen3WithHermesTools) {
  LiveServer s(false, "qwen3.jinja");
  run_node("openai_client.mjs", s.port());
  expect_all_free(s);
}

TEST(LiveServer, OpenAIClientOnQwen35HybridWithXmlTools) {
  LiveServer s(true, "qwen35_features.jinja");
  run_node("openai_client.mjs", s.port());
  expect_all_free(s);
}

TEST(LiveServer, StructuredOutputsFollowTheirGrammars) {
  LiveServer s(false, "qwen3.jinja");
  run_node("structured_outputs.mjs", s.port());
  expect_all_free(s);
}

// The same grammars through the client libraries applications use: the Vercel AI SDK (generateObject,
// streamObject), LangChain's ChatOpenAI.withStructuredOutput and the openai client's parse helpers.
TEST(LiveServer, StructuredOutputClientLibraries) {
  for (const char* package : {"ai", "@ai-sdk/openai", "@ai-sdk/openai-compatible", "zod", "@langchain/core",
                              "@langchain/openai"})
    ASSERT_TRUE(fs::exists(repo_root() / ".deps" / "node" / "node_modules" / package / "package.json"))
        << "the " << package << " npm package is missing: run scripts/fetch-test-data.sh";
  LiveServer s(false, "qwen3.jinja");
  run_node("structured_clients.mjs", s.port());
  expect_all_free(s);
}

// Tool calls follow the request's tools in both formats, through openai (runTools) and LangChain.
// Runs tests/server/node/<script> against a Qwen3 server (Hermes tool calls) and a Qwen3.5 one (XML
// calls), once `packages` are installed.
void run_node_on_both_call_formats(const std::string& script, std::initializer_list<const char*> packages) {
  for (const char* package : packages)
    ASSERT_TRUE(fs::exists(repo_root() / ".deps" / "node" / "node_modules" / package / "package.json"))
        << "the " << package << " npm package is missing: run scripts/fetch-test-data.sh";
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "Qwen3.5, XML calls" : "Qwen3, Hermes calls");
    LiveServer s(hybrid, hybrid ? "qwen35_features.jinja" : "qwen3.jinja", /*max_context=*/4096);
    run_node(script, s.port());
    expect_all_free(s);
  }
}

TEST(LiveServer, ToolCallsFollowTheirTools) {
  run_node_on_both_call_formats("tool_calls.mjs", {"zod", "@langchain/openai"});
}

// Anthropic's Messages API through @anthropic-ai/sdk: plain, streamed, tool use (both call formats),
// stop sequences, countTokens and errors.
TEST(LiveServer, AnthropicClient) { run_node_on_both_call_formats("anthropic_client.mjs", {"@anthropic-ai/sdk"}); }

// OpenAI's Responses API through the clients that default to it: openai's responses.*, the AI SDK's
// default openai('…') model and @openai/agents (an agent run and a tool call), on both call formats.
TEST(LiveServer, ResponsesClients) {
  run_node_on_both_call_formats("responses_client.mjs", {"@openai/agents", "@ai-sdk/openai", "ai", "zod"});
}

// Every schema of the grammar corpus over seeded runs, each output validated by ajv, on the demo
// model (3 seeds) and on a random-weight model with the real Qwen3 tokenizer (1 seed: its 152k-row
// head and sampling are most of the test's time); regexes and choices likewise. Under the
// sanitizers, which are there for memory errors, a quarter of the schemas and one seed.
TEST(LiveServer, StructuredOutputsValidateOnRealVocabularies) {
  ASSERT_TRUE(fs::exists(repo_root() / ".deps" / "node" / "node_modules" / "ajv-formats" / "package.json"))
      << "the ajv npm package is missing: run scripts/fetch-test-data.sh";
  ASSERT_TRUE(fs::exists(qwen3_tokenizer_dir() / "tokenizer.json")) << "run scripts/fetch-test-data.sh";
#if defined(QINFER_SANITIZE)
  const std::string demo_env = "QINFER_CORPUS_SEEDS=1 QINFER_CORPUS_EVERY=4", qwen3_env = demo_env;
#else
  const std::string demo_env = "QINFER_CORPUS_SEEDS=3", qwen3_env = "QINFER_CORPUS_SEEDS=1";
#endif
  {
    SCOPED_TRACE("the demo model");
    LiveServer s(repo_root() / "models" / "demo", /*max_context=*/1024);
    run_node("schema_corpus.mjs", s.port(), demo_env);
    expect_all_free(s);
  }
  {
    SCOPED_TRACE("a random-weight Qwen3 with the real tokenizer");
    LiveServer s(std::make_unique<TinyModelDir>(TinyModelDir::RealQwen3Tokenizer{}), /*max_context=*/1024);
    run_node("schema_corpus.mjs", s.port(), qwen3_env);
    expect_all_free(s);
  }
}

// A template's error reaches the client naming the template's file inside the model folder, never
// the server's own path to it.
TEST(LiveServer, TemplateErrorsNameNoServerPaths) {
  LiveServer s(true, "qwen35_features.jinja");
  const HttpResponse r = fetch(s.port(), "POST", "/v1/chat/completions",
                               R"({"messages": [{"role": "assistant", "content": "only me"}]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("No user query found"));
  EXPECT_THAT(r.body, ::testing::Not(HasSubstr(s.dir().string()))) << r.body;
  EXPECT_THAT(r.body, ::testing::Not(HasSubstr("/tmp"))) << r.body;
  EXPECT_THAT(r.body, HasSubstr("tokenizer_config.json[chat_template]")) << r.body;
}

TEST(LiveServer, SixtyFourStreamsWithAThirdAbortedFreeEverything) {
  LiveServer s(true, "qwen35_features.jinja");
  run_node("concurrency.mjs", s.port());
  expect_all_free(s);
  EXPECT_GT(s.stats().state_slots_total, 0);  // the hybrid model holds recurrent state per sequence
}

// tools/loadgen.py keeps working against the server on both endpoints, and reports a refused request
// (a smoke run, not a measurement).
TEST(LiveServer, LoadGeneratorReports) {
  ASSERT_EQ(std::system("command -v python3 >/dev/null 2>&1"), 0) << "python3 is not installed";
  LiveServer s(false, "qwen3.jinja");
  const std::string loadgen = "python3 '" + (repo_root() / "tools" / "loadgen.py").string() +
                              "' --url http://127.0.0.1:" + std::to_string(s.port()) + "/v1";
  for (const std::string endpoint : {"chat", "completions"}) {
    const qinfer::testing::CommandResult r = qinfer::testing::run_command(
        loadgen + " --endpoint " + endpoint + " --concurrency 1,4 --requests 4 --max-tokens 5 --json");
    ASSERT_EQ(r.status, 0) << endpoint << ":\n" << r.out << r.err;
    std::istringstream lines(r.out);
    std::string line;
    int levels = 0;
    while (std::getline(lines, line)) {
      const json level = json::parse(line, nullptr, false);
      ASSERT_TRUE(level.is_object()) << line;
      EXPECT_EQ(level["ok"], 4) << line;
      EXPECT_EQ(level["failed"], 0) << line;
      EXPECT_EQ(level["output_tokens"], 4 * 5) << line;  // ignore_eos: every request runs to max_tokens
      EXPECT_EQ(level["tokens_from"], "usage") << line;
      EXPECT_GT(level["output_tok_s"].get<double>(), 0) << line;
      EXPECT_GT(level["ttft_ms"]["p50"].get<double>(), 0) << line;
      ++levels;
    }
    EXPECT_EQ(levels, 2) << endpoint;
  }
  const qinfer::testing::CommandResult refused =
      qinfer::testing::run_command(loadgen + " --model nope --concurrency 2 --requests 2 --max-tokens 5");
  EXPECT_EQ(refused.status, 1) << refused.out << refused.err;
  EXPECT_THAT(refused.out, HasSubstr("first error: HTTP 404: The model `nope` does not exist")) << refused.err;
  expect_all_free(s);
}

// What the scheduler refuses comes back as 400, and the model keeps serving.
TEST(LiveServer, SchedulerRefusalsAre400) {
  LiveServer s(false, "qwen3.jinja");
  const std::string long_prompt(3000, 'x');
  EXPECT_EQ(fetch(s.port(), "POST", "/v1/completions", dump({{"prompt", {1, 2, kVocab + 5}}})).status, 400);
  const HttpResponse r =
      fetch(s.port(), "POST", "/v1/completions", dump({{"prompt", long_prompt}, {"max_tokens", 10}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("maximum context length is 1024"));
  const HttpResponse ok = fetch(s.port(), "POST", "/v1/completions", dump({{"prompt", {5, 6, 7}}, {"max_tokens", 3}}));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.body_json()["usage"]["prompt_tokens"], 3);
  expect_all_free(s);
}

// The prefix cache through the API: the same prompt again reports its whole cached blocks in
// usage.prompt_tokens_details.cached_tokens and gives the same greedy completion and logprobs as the
// cold request (the hybrid model from the checkpoint of its state after them).
TEST(LiveServer, RepeatedPromptReportsCachedTokensAndTheSameCompletion) {
  for (const bool hybrid : {false, true}) {
    LiveServer s(hybrid, hybrid ? "qwen3_5.jinja" : "qwen3.jinja");
    std::vector<int> prompt;
    for (int i = 0; i < 70; ++i) prompt.push_back(5 + (i * 37) % 200);
    const json body = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
    const HttpResponse cold = fetch(s.port(), "POST", "/v1/completions", dump(body));
    const HttpResponse warm = fetch(s.port(), "POST", "/v1/completions", dump(body));
    ASSERT_EQ(cold.status, 200) << cold.body;
    ASSERT_EQ(warm.status, 200) << warm.body;
    const json c = cold.body_json(), w = warm.body_json();
    EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // 69 of 70 tokens may come from the cache: 4 whole blocks of 16.
    EXPECT_EQ(w["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
    EXPECT_EQ(w["choices"][0]["text"], c["choices"][0]["text"]);
    const json& lc = c["choices"][0]["logprobs"]["token_logprobs"];
    const json& lw = w["choices"][0]["logprobs"]["token_logprobs"];
    ASSERT_EQ(lc.size(), lw.size());
    for (size_t i = 0; i < lc.size(); ++i) EXPECT_NEAR(lw[i].get<double>(), lc[i].get<double>(), 1e-4) << i;
    expect_all_free(s);
  }
}

std::vector<int> ids_from(int seed, int count) {
  std::vector<int> ids;
  for (int i = 0; i < count; ++i) ids.push_back(5 + (seed * 7919 + i * 37) % 600);
  return ids;
}

// A completion of `prompt` (greedy, `max_tokens` whatever the end token) with its token ids.
json complete_ids(int port, const std::vector<int>& prompt, int max_tokens, bool stream = false) {
  const json body = {{"prompt", prompt},   {"max_tokens", max_tokens}, {"temperature", 0},
                     {"ignore_eos", true}, {"return_token_ids", true}, {"logprobs", 1}};
  const HttpResponse r = fetch(port, "POST", "/v1/completions", dump(body));
  EXPECT_EQ(r.status, 200) << r.body;
  return r.body_json();
}

// A conversation as agents send it: each turn resends everything so far (the prompt, the reply's
// token ids from return_token_ids) and adds a message. Every turn after the first takes all of the
// last turn's computed whole blocks from the cache (the hybrid model from the checkpoint of its
// state at the last one, kept when the turn finished), and its completion is the cold server's.
TEST(LiveServer, MultiTurnConversationHitsOnEveryTurn) {
  for (const bool hybrid : {false, true}) {
    LiveServer s(hybrid, hybrid ? "qwen3_5.jinja" : "qwen3.jinja");
    std::vector<int> prompt = ids_from(1, 40);
    std::vector<int> previous_computed;  // the last turn's prompt + reply but its last token
    json last;
    for (int turn = 0; turn < 6; ++turn) {
      last = complete_ids(s.port(), prompt, 9);
      const json& choice = last["choices"][0];
      EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int>>(), prompt);
      const auto reply = choice["token_ids"].get<std::vector<int>>();
      ASSERT_EQ(reply.size(), 9u);
      const int expected = turn == 0 ? 0 : static_cast<int>(previous_computed.size()) / 16 * 16;
      EXPECT_EQ(last["usage"]["prompt_tokens_details"]["cached_tokens"], expected)
          << (hybrid ? "hybrid" : "dense") << " turn " << turn;
      previous_computed = prompt;
      previous_computed.insert(previous_computed.end(), reply.begin(), reply.end() - 1);
      prompt.insert(prompt.end(), reply.begin(), reply.end());
      for (int t : ids_from(100 + turn, 23)) prompt.push_back(t);
    }
    const engine::EngineStats st = s.stats();
    EXPECT_EQ(st.prefix_hits_total, 5);
    EXPECT_EQ(st.prefix_misses_total, 1);
    if (hybrid) EXPECT_GT(st.state_checkpoints_cached, 0);
    // The last turn again on a server that has seen nothing: the same tokens and logprobs.
    LiveServer cold(hybrid, hybrid ? "qwen3_5.jinja" : "qwen3.jinja");
    const json again = complete_ids(cold.port(), last["choices"][0]["prompt_token_ids"].get<std::vector<int>>(), 9);
    EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(again["choices"][0]["token_ids"], last["choices"][0]["token_ids"]);
    const json& lw = last["choices"][0]["logprobs"]["token_logprobs"];
    const json& lc = again["choices"][0]["logprobs"]["token_logprobs"];
    ASSERT_EQ(lw.size(), lc.size());
    for (size_t i = 0; i < lw.size(); ++i) EXPECT_NEAR(lw[i].get<double>(), lc[i].get<double>(), 1e-4) << i;
    expect_all_free(s);
  }
}

// return_token_ids streamed: the first chunk of a choice carries the prompt's ids, each chunk its
// tokens' ids, which together are the non-streamed response's.
TEST(LiveServer, StreamedTokenIds) {
  LiveServer s(false, "qwen3.jinja");
  const std::vector<int> prompt = ids_from(3, 20);
  const json whole = complete_ids(s.port(), prompt, 7);
  const json body = {{"prompt", prompt},   {"max_tokens", 7},          {"temperature", 0},
                     {"ignore_eos", true}, {"return_token_ids", true}, {"stream", true}};
  const HttpResponse r = fetch(s.port(), "POST", "/v1/completions", dump(body));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<int> ids;
  bool prompt_seen = false;
  for (const json& chunk : sse_payloads(r.body)) {
    if (chunk == "[DONE]" || chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (choice.contains("prompt_token_ids")) {
      EXPECT_FALSE(prompt_seen) << "the prompt's ids come once";
      EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int>>(), prompt);
      prompt_seen = true;
    }
    for (int t : choice["token_ids"]) ids.push_back(t);
  }
  EXPECT_TRUE(prompt_seen);
  EXPECT_EQ(json(ids), whole["choices"][0]["token_ids"]);
  const HttpResponse bad = fetch(s.port(), "POST", "/v1/completions",
                                 dump(json{{"prompt", prompt}, {"max_tokens", 2}, {"return_token_ids", "yes"}}));
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("return_token_ids"));
}

// lm-eval's loglikelihood request (echo, logprobs 1, token ids, max_tokens 1 or 0) gives each prompt
// token's logprob as `qinfer eval --logits` computes it, the first one null, with the greedy pick as
// the top alternative; vLLM's prompt_logprobs agree with it, streamed too; a cached copy of the prompt
// is not taken from the cache. On the hybrid model (recurrent state) and the dense one.
TEST(LiveServer, EchoedPromptLogprobsAreTheEvalLogits) {
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "dense");
    LiveServer s(hybrid, hybrid ? "qwen35_features.jinja" : "qwen3.jinja");
    const std::vector<int> prompt = ids_from(5, 70);
    // The reference: qinfer eval's logits of the prompt, log-softmaxed over the vocabulary.
    qinfer::testing::TempDir tmp;
    std::string ids;
    for (int id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    const auto ran = qinfer::testing::run_command(std::string(QINFER_BINARY) + " eval --model '" + s.dir().string() +
                                                  "' --ids " + ids + " --logits '" + (tmp / "l.bin").string() + "'");
    ASSERT_EQ(ran.status, 0) << ran.err;
    const std::string raw = read_file(tmp / "l.bin");
    const size_t V = raw.size() / sizeof(float) / prompt.size();
    ASSERT_EQ(V * prompt.size() * sizeof(float), raw.size());
    const auto* logits = reinterpret_cast<const float*>(raw.data());
    auto reference = [&](size_t position, int token) {
      const float* row = logits + position * V;
      double total = 0;
      for (size_t v = 0; v < V; ++v) total += std::exp(static_cast<double>(row[v]));
      return row[token] - std::log(total);
    };
    auto argmax = [&](size_t position) {
      const float* row = logits + position * V;
      return static_cast<int>(std::max_element(row, row + V) - row);
    };
    // A plain request first, so that the prompt's blocks are in the cache.
    ASSERT_EQ(complete_ids(s.port(), prompt, 2)["usage"]["prompt_tokens"], 70);
    for (const int max_tokens : {1, 0}) {
      SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
      const json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", 1},
                         {"echo", true},     {"prompt_logprobs", 2}};
      const HttpResponse r = fetch(s.port(), "POST", "/v1/completions", dump(body));
      ASSERT_EQ(r.status, 200) << r.body;
      const json out = r.body_json();
      const json& choice = out["choices"][0];
      const json& lp = choice["logprobs"];
      ASSERT_EQ(lp["tokens"].size(), prompt.size() + static_cast<size_t>(max_tokens));
      EXPECT_TRUE(lp["token_logprobs"][0].is_null());
      EXPECT_TRUE(lp["top_logprobs"][0].is_null());
      EXPECT_EQ(out["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "computed whole";
      EXPECT_EQ(out["usage"]["completion_tokens"], max_tokens);
      if (max_tokens == 0) {
        EXPECT_EQ(choice["finish_reason"], "length");
      }
      const std::string prompt_text = tokenizer::Tokenizer::load(s.dir()).decode(
          std::vector<int32_t>(prompt.begin(), prompt.end()));
      EXPECT_TRUE(choice["text"].get<std::string>().starts_with(prompt_text));
      if (max_tokens == 0) {
        EXPECT_EQ(choice["text"], prompt_text);
      }
      EXPECT_EQ(lp["text_offset"][0], 0);
      const json& vllm = choice["prompt_logprobs"];
      ASSERT_EQ(vllm.size(), prompt.size());
      EXPECT_TRUE(vllm[0].is_null());
      for (size_t k = 1; k < prompt.size(); ++k) {
        const double want = reference(k - 1, prompt[k]);
        EXPECT_NEAR(lp["token_logprobs"][k].get<double>(), want, 1e-4) << "position " << k;
        const json& top = lp["top_logprobs"][k];
        ASSERT_EQ(top.size(), 1u);
        EXPECT_NEAR(top.begin().value().get<double>(), reference(k - 1, argmax(k - 1)), 1e-4) << "position " << k;
        const json& mine = vllm[k][std::to_string(prompt[k])];
        EXPECT_NEAR(mine["logprob"].get<double>(), want, 1e-4) << "position " << k;
        EXPECT_GE(mine["rank"].get<int>(), 1);
        EXPECT_TRUE(vllm[k].contains(std::to_string(argmax(k - 1)))) << "position " << k;
        if (mine["rank"] == 1) {
          EXPECT_EQ(argmax(k - 1), prompt[k]);
        }
      }
      // Streamed: the prompt's text and logprobs come first, in a chunk of their own.
      json streamed = body;
      streamed["stream"] = true;
      const HttpResponse st = fetch(s.port(), "POST", "/v1/completions", dump(streamed));
      ASSERT_EQ(st.status, 200) << st.body;
      const std::vector<json> chunks = sse_payloads(st.body);
      ASSERT_FALSE(chunks.empty());
      const json& head = chunks[0]["choices"][0];
      EXPECT_EQ(head["text"], prompt_text);
      EXPECT_EQ(head["logprobs"]["token_logprobs"], json(std::vector<json>(lp["token_logprobs"].begin(),
                                                                           lp["token_logprobs"].begin() + 70)));
      EXPECT_EQ(nlohmann::json::parse(head["prompt_logprobs"].dump()), nlohmann::json::parse(vllm.dump()));
    }
    // Chat completions take prompt_logprobs (one list for the request), not echo; bad values are 400s.
    const json chat = {{"messages", {{{"role", "user"}, {"content", "hello"}}}}, {"max_tokens", 2},
                       {"prompt_logprobs", 0}};
    const HttpResponse c = fetch(s.port(), "POST", "/v1/chat/completions", dump(chat));
    ASSERT_EQ(c.status, 200) << c.body;
    EXPECT_EQ(c.body_json()["prompt_logprobs"].size(), c.body_json()["usage"]["prompt_tokens"].get<size_t>());
    for (const json& bad : {json{{"prompt", prompt}, {"max_tokens", 0}},
                            json{{"prompt", prompt}, {"prompt_logprobs", 21}},
                            json{{"prompt", prompt}, {"echo", "yes"}}}) {
      const HttpResponse b = fetch(s.port(), "POST", "/v1/completions", dump(bad));
      EXPECT_EQ(b.status, 400) << bad.dump();
    }
    json chat_echo = chat;
    chat_echo["echo"] = true;
    const HttpResponse ce = fetch(s.port(), "POST", "/v1/chat/completions", dump(chat_echo));
    EXPECT_EQ(ce.status, 400);
    EXPECT_THAT(ce.body, HasSubstr("echo"));
    expect_all_free(s);
  }
}

// The shapes peers miss (a shared prefix whose checkpoint-grid point falls in the unique suffix): a
// second request sharing a long prefix hits on the shared part (the hybrid model from the last
// interval checkpoint inside it) and keeps a checkpoint where it leaves the first one's path; a third
// then starts at that junction, the shared part's last whole block.
TEST(LiveServer, SharedPrefixWithLongUniqueSuffixesHits) {
  struct Shape {
    int shared, first_suffix, second_suffix;
  };
  for (const bool hybrid : {false, true}) {
    LiveServer s(hybrid, hybrid ? "qwen3_5.jinja" : "qwen3.jinja", 8192);
    for (const Shape& shape : {Shape{6476, 376, 1296}, Shape{1500, 700, 700}}) {
      const std::vector<int> shared = ids_from(shape.shared, shape.shared);
      auto with_suffix = [&](int seed, int n) {
        std::vector<int> p = shared;
        for (int t : ids_from(seed, n)) p.push_back(t);
        return p;
      };
      const int whole = shape.shared / 16 * 16;
      // The interval checkpoint (every 1024 tokens) at or below the shared part's last whole block.
      const int interval = whole / 1024 * 1024;
      const json a = complete_ids(s.port(), with_suffix(11, shape.first_suffix), 2);
      const json b = complete_ids(s.port(), with_suffix(12, shape.second_suffix), 2);
      const json c = complete_ids(s.port(), with_suffix(13, shape.first_suffix), 2);
      const std::string what = fmt::format("{} {}+{}", hybrid ? "hybrid" : "dense", shape.shared, shape.second_suffix);
      EXPECT_EQ(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << what;
      EXPECT_EQ(b["usage"]["prompt_tokens_details"]["cached_tokens"], hybrid ? interval : whole) << what;
      EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], whole) << what << ": from the junction";
    }
    expect_all_free(s);
  }
}

// The port `qinfer serve` printed to `out` ("... ready on http://127.0.0.1:PORT/v1"), once it has;
// 0 after 30 s.
int served_port(const fs::path& out) {
  for (int i = 0; i < 600; ++i) {
    const std::string text = read_file(out);
    if (const size_t at = text.find("http://127.0.0.1:");
        at != std::string::npos && text.find("/v1", at) != std::string::npos)
      return std::atoi(text.c_str() + at + 17);
    std::this_thread::sleep_for(50ms);
  }
  return 0;
}

// Waits up to 10 s for `pid` to exit, then kills it; whether it exited by itself (`status`: its wait status).
bool exits_within_10s(pid_t pid, int& status) {
  for (int i = 0; i < 200 && waitpid(pid, &status, WNOHANG) == 0; ++i) std::this_thread::sleep_for(50ms);
  if (waitpid(pid, &status, WNOHANG) != 0) return true;
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}

// `qinfer serve` as a user runs it: prints the URL, serves, stops cleanly on SIGTERM.
TEST(ServeCommand, StartsServesAndStopsOnSigterm) {
  ASSERT_TRUE(fs::exists(QINFER_BINARY)) << QINFER_BINARY << " is not built (cmake --build <dir> --target qinfer)";
  TinyModelDir dir(false, "qwen3.jinja");
  const fs::path out = dir.path() / "serve.out", err = dir.path() / "serve.err";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    execl(QINFER_BINARY, QINFER_BINARY, "serve", "--model", dir.path().c_str(), "--port", "0", "--api-key", "k1",
          "--max-running", "4", "--served-model-name", "demo", static_cast<char*>(nullptr));
    _exit(127);
  }
  const int port = served_port(out);
  ASSERT_GT(port, 0) << read_file(out) << read_file(err);
  EXPECT_THAT(read_file(out), HasSubstr("demo ready on http://127.0.0.1:"));
  EXPECT_EQ(fetch(port, "GET", "/v1/models").status, 401);
  const HttpResponse models = fetch(port, "GET", "/v1/models", "", {"Authorization: Bearer k1"});
  EXPECT_EQ(models.body_json()["data"][0]["id"], "demo");
  const json body = {{"model", "demo"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  const HttpResponse chat = fetch(port, "POST", "/v1/chat/completions", dump(body), {"Authorization: Bearer k1"});
  EXPECT_EQ(chat.status, 200) << chat.body;
  kill(pid, SIGTERM);
  int status = 0;
  if (!exits_within_10s(pid, status)) FAIL() << "qinfer serve did not stop on SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(err);
  EXPECT_THAT(read_file(err), HasSubstr("draining"));
}

// SIGTERM drains: a request in progress goes on while new ones are refused, until --drain-timeout ends
// it with an error; a client trickling the bytes of a request never finished does not hold the exit.
TEST(ServeCommand, DrainsOnSigtermUntilItsDeadline) {
  ASSERT_TRUE(fs::exists(QINFER_BINARY));
  TinyModelDir dir(false, "qwen3.jinja", 1 << 16);  // a context long enough to outlast the drain
  const fs::path out = dir.path() / "serve.out", err = dir.path() / "serve.err";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    execl(QINFER_BINARY, QINFER_BINARY, "serve", "--model", dir.path().c_str(), "--port", "0", "--drain-timeout",
          "1.5", "--threads", "1", "--max-running", "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  const int port = served_port(out);
  ASSERT_GT(port, 0) << read_file(out) << read_file(err);
  RawConnection trickle(port);
  trickle.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le");
  // A stream that outlasts the drain: one token per step, as long as the context allows.
  RawConnection stream(port);
  const json body = {{"prompt", "hi"}, {"stream", true}, {"ignore_eos", true}};
  stream.send(http_request("POST", "/v1/completions", dump(body)));
  stream.read_until([](const std::string& r) { return r.find("\"text\"") != std::string::npos; }, 10s);
  RawConnection kept(port);  // open before the signal, its request sent during the drain
  const auto signalled = std::chrono::steady_clock::now();
  kill(pid, SIGTERM);
  std::this_thread::sleep_for(300ms);
  kept.send(http_request("POST", "/v1/completions", dump(json{{"prompt", "x"}, {"max_tokens", 1}})));
  const HttpResponse refused = parse_http(kept.read_all(5s));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_FALSE(RawConnection(port).ok());  // no new connections: a balancer sends them elsewhere
  const std::string streamed = stream.read_all(10s);
  int status = 0;
  ASSERT_TRUE(exits_within_10s(pid, status)) << read_file(err);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(err);
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 6.0);
  EXPECT_THAT(streamed, HasSubstr("shutting down"));
  EXPECT_THAT(read_file(err), HasSubstr("ending 1 requests in progress"));
}

// `qinfer serve` as the two processes of a tensor-parallel group (one cpu rank each) over golden
// fixture `fixture` with the mini tokenizer: process 1 (the follower) starts first, then process 0.
struct ServeGroup {
  qinfer::testing::TempDir dir;
  fs::path out[2], err[2];
  pid_t pid[2] = {-1, -1};
  int port = 0;  // process 0's, once it serves; 0 if it did not within 30 s

  explicit ServeGroup(const char* fixture) {
    const fs::path golden = fs::path(QINFER_TEST_DATA) / "golden" / fixture;
    for (const char* file : {"config.json", "model.safetensors"}) fs::copy_file(golden / file, dir / file);
    const fs::path mini = repo_root() / "tests" / "tokenizer" / "data" / "qwen35_mini";
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(mini / file, dir / file);
  }

  void start() {
    // A free port for the group to meet at.
    std::unique_ptr<parallel::ProcessGroup> probe = parallel::ProcessGroup::listen("127.0.0.1:0", 2);
    const std::string meet = "127.0.0.1:" + std::to_string(probe->port());
    probe.reset();
    for (int p : {1, 0}) {
      out[p] = dir / (std::to_string(p) + ".out");
      err[p] = dir / (std::to_string(p) + ".err");
      pid[p] = fork();
      if (pid[p] == 0) {
        freopen(out[p].c_str(), "w", stdout);
        freopen(err[p].c_str(), "w", stderr);
        const std::string index = std::to_string(p);
        execl(QINFER_BINARY, QINFER_BINARY, "serve", "--model", dir.path().c_str(), "--port", "0", "--device", "cpu",
              "--tensor-parallel", "2", "--tp-processes", "2", "--tp-process", index.c_str(), "--tp-address",
              meet.c_str(), "--served-model-name", "tp", static_cast<char*>(nullptr));
        _exit(127);
      }
    }
    if (pid[0] > 0 && pid[1] > 0) port = served_port(out[0]);
  }
};

// `qinfer serve` as a tensor-parallel group of two processes (one cpu rank each): process 1 follows,
// process 0 serves; a greedy completion is the text of one process, and SIGTERM to process 0 stops both.
TEST(ServeCommand, AGroupOverTwoProcessesServesAsOne) {
  ASSERT_TRUE(fs::exists(QINFER_BINARY));
  ServeGroup group("qwen3_5");
  const qinfer::testing::CommandResult one = qinfer::testing::run_command(
      std::string(QINFER_BINARY) + " run --model '" + group.dir.path().string() +
      "' -p 'the cat sat' --raw --temp 0 -n 12");
  ASSERT_EQ(one.status, 0) << one.err;
  group.start();
  ASSERT_GT(group.pid[1], 0);
  ASSERT_GT(group.pid[0], 0);
  ASSERT_GT(group.port, 0) << read_file(group.err[0]) << read_file(group.err[1]);
  const json body = {{"model", "tp"}, {"prompt", "the cat sat"}, {"max_tokens", 12}, {"temperature", 0}};
  const HttpResponse r = fetch(group.port, "POST", "/v1/completions", dump(body));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body_json()["choices"][0]["text"].get<std::string>() + "\n", one.out);
  kill(group.pid[0], SIGTERM);
  for (int p : {0, 1}) {
    int status = 0;
    if (!exits_within_10s(group.pid[p], status)) ADD_FAILURE() << "process " << p << " did not stop";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(group.err[p]);
  }
  EXPECT_THAT(read_file(group.err[1]), HasSubstr("process 1 follows process 0 until it stops"));
  EXPECT_EQ(read_file(group.out[1]), "");
}

// A follower that dies ends the group, not the server: process 0 answers later requests with an
// error that names the group's failure, keeps serving its other endpoints, and stops on SIGTERM.
TEST(ServeCommand, AGroupWhoseFollowerDiesAnswersWithAnErrorAndStaysUp) {
  ASSERT_TRUE(fs::exists(QINFER_BINARY));
  ServeGroup group("qwen3");
  group.start();
  ASSERT_GT(group.pid[1], 0);
  ASSERT_GT(group.pid[0], 0);
  ASSERT_GT(group.port, 0) << read_file(group.err[0]) << read_file(group.err[1]);
  const json body = {{"model", "tp"}, {"prompt", "the cat sat"}, {"max_tokens", 4}, {"temperature", 0}};
  ASSERT_EQ(fetch(group.port, "POST", "/v1/completions", dump(body)).status, 200);
  kill(group.pid[1], SIGKILL);
  int status = 0;
  waitpid(group.pid[1], &status, 0);
  for (int i = 0; i < 2; ++i) {  // the request that meets the dead peer, and one after
    const HttpResponse r = fetch(group.port, "POST", "/v1/completions", dump(body));
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_THAT(r.body, HasSubstr("a peer process stopped")) << r.body;
  }
  EXPECT_EQ(fetch(group.port, "GET", "/v1/models").status, 200);
  kill(group.pid[0], SIGTERM);
  if (!exits_within_10s(group.pid[0], status)) FAIL() << "process 0 did not stop on SIGTERM: " << read_file(group.err[0]);
  EXPECT_TRUE(WIFEXITED(status)) << read_file(group.err[0]);
}

TEST(ServeCommand, RefusesAnAddressInUse) {
  ASSERT_TRUE(fs::exists(QINFER_BINARY));
  ScriptedGenerator generator;
  // A scripted server holds a port; `qinfer serve` on the same port must say so and exit 1.
  static const tokenizer::Tokenizer tok =
      tokenizer::Tokenizer::load(repo_root() / "tests" / "tokenizer" / "data" / "qwen35_mini");
  ServedModel served;
  served.name = "x";
  served.tokenizer = &tok;
  served.max_context = 64;
  ServerOptions options;
  options.port = 0;
  Server holder(options, served, generator);
  const int port = holder.start();
  TinyModelDir dir(false, "qwen3.jinja");
  const qinfer::testing::CommandResult r = qinfer::testing::run_command(
      std::string(QINFER_BINARY) + " serve --model '" + dir.path().string() + "' --port " + std::to_string(port));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(port)));
  // Without --model it names the bundled demo model, then refuses the busy port (before loading it).
  const qinfer::testing::CommandResult demo =
      qinfer::testing::run_command(std::string(QINFER_BINARY) + " serve --port " + std::to_string(port));
  EXPECT_EQ(demo.status, 1);
  EXPECT_THAT(demo.err, HasSubstr("bundled demo model"));
  EXPECT_THAT(demo.err, HasSubstr("cannot listen on 127.0.0.1:" + std::to_string(port)));
}

}  // namespace
}  // namespace qinfer::server::testing
