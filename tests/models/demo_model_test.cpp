// The bundled demo model (models/demo, made by tools/train_demo) against the transformers reference stored
// beside it (models/demo/reference): logits in prefill and decode on the cpu backend (relative RMS <= 1e-2,
// argmax identical where the reference top-2 margin is >= 1e-2), greedy tokens up to the first near-tie,
// the tokenizer on the stored prompt texts, the chat template, and the checkpoint layout it exports.
// A missing model fails every test: the demo is part of the repository.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/thread_pool.h"
#include "io/json.h"
#include "models/eval.h"
#include "support/golden_reference.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::models {
namespace {

namespace fs = std::filesystem;

const fs::path kDemo = (fs::path(QINFER_TEST_DATA) / ".." / ".." / "models" / "demo").lexically_normal();
const fs::path kReference = kDemo / "reference";

using golden::compare;
using golden::Comparison;
using golden::Reference;

Reference load_reference() { return golden::load_reference(kReference); }

class DemoModel : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kDemo / "config.json") && fs::exists(kReference / "reference.json"))
        << "the demo model is missing: expected " << kDemo.string() << " with reference/reference.json. Make it "
        << "with tools/train_demo/train_demo.py on the GPU machine and copy its output there (see "
        << "tools/train_demo/README.md).";
  }
};

// `eval --dump` names: every layer's mixer output, MLP output and residual stream, the Gated DeltaNet
// and attention intermediates under the layer's own name, then the final norm and the logits; the
// dump's logits are the returned ones.
TEST_F(DemoModel, DumpNamesEveryIntermediateOnce) {
  Checkpoint checkpoint = open_checkpoint(kDemo);
  std::unique_ptr<Ops> ops = make_cpu_ops(global_thread_pool());
  Model model(checkpoint, *ops);
  std::vector<std::string> names;
  Tensor dumped_logits;
  const Tensor logits = prompt_logits(model, {1, 2, 3}, parse_eval_mode("prefill"), [&](const std::string& name, const Tensor& t) {
    names.push_back(name);
    if (name == "logits") dumped_logits = t;
  });
  auto count = [&](const std::string& name) { return std::count(names.begin(), names.end(), name); };
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "model.embed_tokens");
  EXPECT_EQ(names.back(), "logits");
  EXPECT_EQ(count("model.norm"), 1);
  const int64_t layers = model.config().num_hidden_layers;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}", i);
    EXPECT_EQ(count(layer), 1) << layer;
    EXPECT_EQ(count(layer + ".mixer"), 1) << layer;
    EXPECT_EQ(count(layer + ".mlp"), 1) << layer;
    EXPECT_EQ(count(layer + ".self_attn.attention") + count(layer + ".linear_attn.core"), 1) << layer;
  }
  ASSERT_EQ(dumped_logits.shape, logits.shape);
}

TEST_F(DemoModel, LogitsMatchTransformersInPrefillAndDecode) {
  Checkpoint checkpoint = open_checkpoint(kDemo);
  std::unique_ptr<Ops> ops = make_cpu_ops(global_thread_pool());
  Model model(checkpoint, *ops);
  const Reference ref = load_reference();
  ASSERT_EQ(ref.prompts.size(), 3u);
  ASSERT_EQ(ref.vocab, model.config().vocab_size);
  for (const char* mode_name : {"prefill", "decode"}) {
    for (size_t k = 0; k < ref.prompts.size(); ++k) {
      Tensor logits = prompt_logits(model, ref.prompts[k], parse_eval_mode(mode_name));
      const Comparison c = compare(logits.ptr<float>(), ref.logits[k], ref.vocab);
      EXPECT_LE(c.relative_rms, 1e-2) << mode_name << " prompt " << k;
      EXPECT_EQ(c.argmax_mismatches, 0) << mode_name << " prompt " << k;
      RecordProperty(fmt::format("rel_rms_{}_{}", mode_name, k), fmt::format("{:.3g}", c.relative_rms));
    }
  }
}

// A trained model can still meet a near-tie; the tokens after the first one are not comparable.
TEST_F(DemoModel, GreedyTokensMatchUntilTheFirstNearTie) {
  Checkpoint checkpoint = open_checkpoint(kDemo);
  std::unique_ptr<Ops> ops = make_cpu_ops(global_thread_pool());
  Model model(checkpoint, *ops);
  const Reference ref = load_reference();
  const auto margins = ref.doc["greedy_margins"].get<std::vector<std::vector<float>>>();
  for (size_t k = 0; k < ref.prompts.size(); ++k) {
    size_t clear = 0;
    while (clear < ref.greedy[k].size() && margins[k][clear] >= 1e-2f) ++clear;
    EXPECT_GE(clear, 1u) << "prompt " << k << ": the first greedy step is a near-tie; pick another prompt";
    const std::vector<int32_t> got = greedy_continuation(model, ref.prompts[k], static_cast<int32_t>(clear));
    const std::vector<int32_t> want(ref.greedy[k].begin(), ref.greedy[k].begin() + static_cast<ptrdiff_t>(clear));
    EXPECT_EQ(got, want) << "prompt " << k;
  }
}

TEST_F(DemoModel, TokenizerEncodesAndDecodesTheStoredPromptTexts) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(kDemo);
  const Reference ref = load_reference();
  const auto texts = ref.doc["prompt_texts"].get<std::vector<std::string>>();
  ASSERT_EQ(texts.size(), ref.prompts.size());
  for (size_t k = 0; k < texts.size(); ++k) {
    EXPECT_EQ(tok.encode(texts[k]), ref.prompts[k]) << "prompt " << k;
    EXPECT_EQ(tok.decode(ref.prompts[k]), texts[k]) << "prompt " << k;
  }
  EXPECT_LE(tok.vocab_size(), ref.vocab);  // every id has an embedding row
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"})
    EXPECT_TRUE(tok.token_to_id(special).has_value()) << special;
}

TEST_F(DemoModel, ChatTemplateRendersLikeTransformers) {
  const Reference ref = load_reference();
  const io::json& chat = ref.doc["chat"];
  const auto request = nlohmann::ordered_json::parse(
      io::json{{"messages", chat["messages"]}, {"add_generation_prompt", chat["add_generation_prompt"]}}.dump());
  const std::string text = tokenizer::ChatTemplate::from_model_dir(kDemo).render(request);
  EXPECT_EQ(text, chat["text"].get<std::string>());
  EXPECT_EQ(text, ref.doc["prompt_texts"][chat["prompt"].get<size_t>()].get<std::string>());
}

// What the exporter writes: the released Qwen3.5 naming with a tied head, an MTP head, HF norm storage.
TEST_F(DemoModel, CheckpointLayout) {
  const Checkpoint checkpoint = open_checkpoint(kDemo);
  EXPECT_EQ(checkpoint.config.model_type, "qwen3_5");
  EXPECT_TRUE(checkpoint.config.text.tie_word_embeddings);
  EXPECT_EQ(checkpoint.config.text.mtp_num_hidden_layers, 1);
  EXPECT_LE(checkpoint.config.text.vocab_size, 8192);
  EXPECT_EQ(checkpoint.plan.find("lm_head.weight"), nullptr);
  EXPECT_EQ(checkpoint.plan.count(io::TensorGroup::mtp), 15u);
  EXPECT_TRUE(checkpoint.plan.shift_norms);  // HF storage: w, applied as 1 + w
  EXPECT_TRUE(checkpoint.plan.dropped.empty());
  EXPECT_LE(fs::file_size(kDemo / "model.safetensors"), 40'000'000u);
}

}  // namespace
}  // namespace qinfer::models
