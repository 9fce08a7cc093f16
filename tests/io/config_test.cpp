// config.json parsing: nesting, rope / layer-type / quantization variants, HF defaults, and errors
// that name the file and the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "io/config.h"

namespace qinfer::io {
namespace {

using ::testing::HasSubstr;

std::string error_of(const json& doc) {
  try {
    parse_config(doc, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

json qwen3_5_vlm() {
  return json::parse(R"({
    "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
    "tie_word_embeddings": true, "image_token_id": 248056, "video_token_id": 248057,
    "vision_start_token_id": 248053, "vision_end_token_id": 248054,
    "text_config": {
      "model_type": "qwen3_5_text", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
      "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 3584, "vocab_size": 248320,
      "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
      "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
      "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                      "linear_attention", "linear_attention", "linear_attention", "full_attention"],
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                          "mrope_section": [11, 11, 10], "mrope_interleaved": true},
      "eos_token_id": 248044, "dtype": "bfloat16"
    },
    "vision_config": {"depth": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072,
                      "out_hidden_size": 1024, "num_position_embeddings": 2304}
  })");
}

TEST(Config, NestedQwen35VlmConfig) {
  ModelConfig c = parse_config(qwen3_5_vlm(), "cfg.json");
  EXPECT_EQ(c.model_type, "qwen3_5");
  EXPECT_EQ(c.text.model_type, "qwen3_5_text");
  EXPECT_EQ(c.text.hidden_size, 1024);
  EXPECT_TRUE(c.text.tie_word_embeddings);  // decided by the outer config
  EXPECT_DOUBLE_EQ(c.text.rope.theta, 1e7);
  EXPECT_EQ(c.text.rotary_dim(), 64);
  EXPECT_EQ(c.text.rope.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_TRUE(c.text.rope.mrope_interleaved);
  EXPECT_EQ(c.text.layer_types[3], LayerKind::full_attention);
  EXPECT_EQ(c.text.layer_types[4], LayerKind::linear_attention);
  EXPECT_EQ(c.text.linear_conv_dim(), 2 * 16 * 128 + 16 * 128);
  EXPECT_TRUE(c.text.attn_output_gate);
  EXPECT_EQ(c.text.mtp_num_hidden_layers, 1);
  ASSERT_TRUE(c.vision.has_value());
  EXPECT_EQ(c.vision->depth, 12);
  EXPECT_EQ(c.vision->patch_size, 16);  // HF default
  EXPECT_EQ(c.tokens.eos, std::vector<int64_t>{248044});
  EXPECT_EQ(c.tokens.image, 248056);
  EXPECT_EQ(c.text.dtype, "bfloat16");
}

TEST(Config, Transformers5NamesAndNestedDtype) {
  json doc = {{"model_type", "qwen3_moe"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"vocab_size", 100}, {"num_local_experts", 6}, {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32}, {"intermediate_size", 128}, {"dtype", "bfloat16"}};
  ModelConfig c = parse_config(doc, "cfg.json");
  EXPECT_EQ(c.text.num_experts, 6);
  json vlm = qwen3_5_vlm();
  vlm["dtype"] = "bfloat16";
  vlm["text_config"]["dtype"] = "float32";  // transformers 5 writes the load dtype here
  EXPECT_EQ(parse_config(vlm, "cfg.json").text.dtype, "bfloat16");
}

TEST(Config, FlatQwen35ConfigIsItsOwnTextConfig) {
  json flat = qwen3_5_vlm()["text_config"];
  flat["model_type"] = "qwen3_5";
  ModelConfig c = parse_config(flat, "cfg.json");
  EXPECT_EQ(c.text.model_type, "qwen3_5_text");
  EXPECT_FALSE(c.vision.has_value());
  EXPECT_EQ(c.text.num_hidden_layers, 8);
}

TEST(Config, LegacyRopeThetaAndScaling) {
  json doc = {{"model_type", "qwen3"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 32},
              {"intermediate_size", 128}, {"vocab_size", 100}, {"rope_theta", 1000000.0},
              {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}};
  ModelConfig c = parse_config(doc, "cfg.json");
  EXPECT_DOUBLE_EQ(c.text.rope.theta, 1e6);
  EXPECT_EQ(c.text.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.text.rope.factor, 4.0);
  EXPECT_EQ(c.text.rope.original_max_position_embeddings, 32768);
  EXPECT_EQ(c.text.num_key_value_heads, 32);  // Qwen3Config's default
  EXPECT_EQ(c.text.head_dim, 128);           // Qwen3Config's default head_dim
  EXPECT_EQ(c.text.rotary_dim(), 128);
  EXPECT_EQ(c.text.max_position_embeddings, 131072);  // YaRN's context: 4 x 32768
}

json qwen3_yarn(const json& rope_scaling) {
  return {{"model_type", "qwen3"}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 4}, {"intermediate_size", 128}, {"vocab_size", 100},
          {"max_position_embeddings", 40960}, {"rope_scaling", rope_scaling}};
}

// YaRN's own fields, transformers 5's defaults for the absent ones, and the positions the model then
// reads: factor x the original context.
TEST(Config, YarnFieldsDefaultsAndPositions) {
  TextConfig t = parse_config(qwen3_yarn({{"rope_type", "yarn"}, {"factor", 4.0},
                                          {"original_max_position_embeddings", 32768}}),
                              "cfg.json")
                     .text;
  EXPECT_EQ(t.max_position_embeddings, 131072);  // Qwen3's model card: 32768 x 4, not config.json's 40960
  EXPECT_DOUBLE_EQ(t.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(t.rope.beta_slow, 1.0);
  EXPECT_FALSE(t.rope.attention_factor.has_value());
  EXPECT_EQ(t.rope.mscale, 0.0);
  EXPECT_EQ(t.rope.mscale_all_dim, 0.0);
  EXPECT_TRUE(t.rope.truncate);

  // Given fields are kept, a beta of 0 takes its default (HF's `or`), and without an original context
  // max_position_embeddings is it.
  t = parse_config(qwen3_yarn({{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_fast", 0}, {"beta_slow", 2},
                               {"attention_factor", 0.8}, {"mscale", 1}, {"mscale_all_dim", 0.5},
                               {"truncate", false}}),
                   "cfg.json")
          .text;
  EXPECT_EQ(t.rope.original_max_position_embeddings, 40960);
  EXPECT_EQ(t.max_position_embeddings, 81920);
  EXPECT_DOUBLE_EQ(t.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(t.rope.beta_slow, 2.0);
  EXPECT_EQ(t.rope.attention_factor, 0.8);
  EXPECT_DOUBLE_EQ(t.rope.mscale, 1.0);
  EXPECT_DOUBLE_EQ(t.rope.mscale_all_dim, 0.5);
  EXPECT_FALSE(t.rope.truncate);

  // Without a factor, the ratio of the two contexts (DeepSeek-V3's spelling).
  t = parse_config(qwen3_yarn({{"rope_type", "yarn"}, {"original_max_position_embeddings", 10240}}), "cfg.json").text;
  EXPECT_DOUBLE_EQ(t.rope.factor, 4.0);
  EXPECT_EQ(t.max_position_embeddings, 40960);

  EXPECT_THAT(error_of(qwen3_yarn({{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", -1}})),
              HasSubstr("cfg.json: rope_scaling.beta_fast: must be a positive number, got -1"));
  EXPECT_THAT(error_of(qwen3_yarn({{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0}})),
              HasSubstr("cfg.json: rope_scaling.attention_factor: must be a positive number, got 0"));
  EXPECT_THAT(error_of(qwen3_yarn({{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "yes"}})),
              HasSubstr("cfg.json: rope_scaling.truncate: expected true or false"));
  EXPECT_THAT(error_of(qwen3_yarn(
                  {{"rope_type", "yarn"}, {"factor", 1e6}, {"original_max_position_embeddings", 32768}})),
              HasSubstr("cfg.json: rope_scaling: yarn factor 1000000 x original_max_position_embeddings 32768 gives"));
}

// --rope-scaling yarn:FACTOR: YaRN over the config's original context, which is max_position_embeddings
// unless the config names one; MRoPE and the other rope fields stay.
TEST(Config, ApplyYarnStretchesTheOriginalContext) {
  json plain = qwen3_yarn(nullptr);
  TextConfig t = parse_config(plain, "cfg.json").text;
  apply_yarn(t, 4.0);
  EXPECT_EQ(t.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(t.rope.factor, 4.0);
  EXPECT_EQ(t.rope.original_max_position_embeddings, 40960);
  EXPECT_EQ(t.max_position_embeddings, 163840);

  t = parse_config(qwen3_yarn({{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}),
                   "cfg.json")
          .text;
  apply_yarn(t, 2.0);
  EXPECT_DOUBLE_EQ(t.rope.factor, 2.0);
  EXPECT_EQ(t.rope.original_max_position_embeddings, 32768);
  EXPECT_EQ(t.max_position_embeddings, 65536);

  // ORIGINAL given (yarn:4:32768, as Qwen3's model cards have it) wins over the config's own.
  t = parse_config(plain, "cfg.json").text;
  apply_yarn(t, 4.0, 32768);
  EXPECT_EQ(t.rope.original_max_position_embeddings, 32768);
  EXPECT_EQ(t.max_position_embeddings, 131072);

  t = parse_config(qwen3_5_vlm(), "cfg.json").text;
  const int64_t positions = t.max_position_embeddings;
  apply_yarn(t, 4.0);
  EXPECT_EQ(t.rope.type, "yarn");
  EXPECT_EQ(t.rope.mrope_section, (std::vector<int64_t>{11, 11, 10}));
  EXPECT_TRUE(t.rope.mrope_interleaved);
  EXPECT_EQ(t.rotary_dim(), 64);
  EXPECT_EQ(t.max_position_embeddings, 4 * positions);

  t = parse_config(qwen3_yarn({{"rope_type", "linear"}, {"factor", 2.0}}), "cfg.json").text;
  try {
    apply_yarn(t, 4.0);
    ADD_FAILURE() << "YaRN replaced a linear scaling";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--rope-scaling yarn:4: the config already scales its rotary frequencies "
                                    "(rope_type 'linear')"));
  }
  t = parse_config(plain, "cfg.json").text;
  EXPECT_THROW(apply_yarn(t, 1e4), Error);  // 4 x 10^8 positions
}

TEST(Config, RopeParametersWinOverTopLevelTheta) {
  json doc = qwen3_5_vlm();
  doc["text_config"]["rope_theta"] = 5.0;
  EXPECT_DOUBLE_EQ(parse_config(doc, "cfg.json").text.rope.theta, 1e7);
  doc["text_config"].erase("rope_parameters");
  ModelConfig c = parse_config(doc, "cfg.json");
  EXPECT_DOUBLE_EQ(c.text.rope.theta, 5.0);
  EXPECT_EQ(c.text.rope.mrope_section, (std::vector<int64_t>{11, 11, 10}));  // HF default for qwen3_5_text
}

TEST(Config, LayerTypesDerivedFromFullAttentionInterval) {
  json doc = qwen3_5_vlm();
  doc["text_config"].erase("layer_types");
  doc["text_config"]["full_attention_interval"] = 2;
  ModelConfig c = parse_config(doc, "cfg.json");
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(c.text.layer_types[i], i % 2 == 1 ? LayerKind::full_attention : LayerKind::linear_attention) << i;
}

TEST(Config, QwenNextMtpAndMoeDefaults) {
  json doc = {{"model_type", "qwen3_next"}, {"hidden_size", 64}, {"num_hidden_layers", 4},
              {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 100},
              {"num_nextn_predict_layers", 2}, {"mlp_only_layers", {0}}};
  ModelConfig c = parse_config(doc, "cfg.json");
  EXPECT_EQ(c.text.mtp_num_hidden_layers, 2);
  EXPECT_EQ(c.text.num_experts, 512);  // HF Qwen3NextConfig default
  EXPECT_TRUE(c.text.norm_topk_prob);
  EXPECT_FALSE(c.text.is_moe_layer(0));
  EXPECT_TRUE(c.text.is_moe_layer(1));
  EXPECT_EQ(c.text.intermediate_size, 5632);  // needed by the dense layer 0; HF default
  EXPECT_EQ(c.text.layer_types[3], LayerKind::full_attention);
}

TEST(Config, Qwen35MoeIgnoresSparseStepAndMlpOnlyLayers) {
  json doc = qwen3_5_vlm();
  doc["model_type"] = "qwen3_5_moe";
  doc["text_config"]["model_type"] = "qwen3_5_moe_text";
  doc["text_config"].update({{"num_experts", 8}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 64},
                             {"shared_expert_intermediate_size", 64}, {"mlp_only_layers", {0, 1}},
                             {"decoder_sparse_step", 2}});
  ModelConfig c = parse_config(doc, "cfg.json");
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(c.text.is_moe_layer(i)) << i;
}

TEST(Config, MlxQuantizationTable) {
  json doc = qwen3_5_vlm();
  doc["quantization"] = json::parse(R"({"group_size": 64, "bits": 4, "mode": "affine",
      "language_model.model.layers.0.mlp.gate": {"group_size": 64, "bits": 8},
      "language_model.model.layers.1.mlp.gate": {"bits": 6},
      "language_model.lm_head": false})");
  ModelConfig c = parse_config(doc, "cfg.json");
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(c.quantization->global, (QuantSpec{4, 64, "affine"}));
  EXPECT_EQ(c.quantization->for_module("language_model.model.layers.0.mlp.gate"), (QuantSpec{8, 64, "affine"}));
  EXPECT_EQ(c.quantization->for_module("language_model.model.layers.1.mlp.gate"), (QuantSpec{6, 64, "affine"}));
  EXPECT_EQ(c.quantization->for_module("language_model.lm_head"), std::nullopt);
  EXPECT_EQ(c.quantization->for_module("language_model.model.layers.2.mlp.up_proj"), c.quantization->global);
}

TEST(Config, FpQuantModesAndQuantizationConfigFallback) {
  json doc = qwen3_5_vlm();
  doc["quantization_config"] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
  ModelConfig c = parse_config(doc, "cfg.json");
  EXPECT_EQ(c.quantization->global, (QuantSpec{4, 32, "mxfp4"}));
  doc["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  c = parse_config(doc, "cfg.json");
  EXPECT_FALSE(c.quantization.has_value());
  EXPECT_EQ(c.foreign_quantization, "fp8");
}

TEST(Config, ErrorsNameFileAndField) {
  json doc = qwen3_5_vlm();
  doc["text_config"]["num_key_value_heads"] = 3;
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: text_config.num_key_value_heads: 3 does not divide"));

  doc = qwen3_5_vlm();
  doc["text_config"]["hidden_size"] = "big";
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: text_config.hidden_size: expected an integer, got \"big\""));

  doc = qwen3_5_vlm();
  doc["text_config"]["layer_types"].push_back("full_attention");
  EXPECT_THAT(error_of(doc), HasSubstr("text_config.layer_types: has 9 entries but num_hidden_layers is 8"));

  doc = qwen3_5_vlm();
  doc["text_config"]["layer_types"][0] = "sliding_attention";
  EXPECT_THAT(error_of(doc), HasSubstr("text_config.layer_types[0]: unsupported layer type 'sliding_attention'"));

  doc = qwen3_5_vlm();
  doc["text_config"]["rope_parameters"]["mrope_section"] = {10, 10, 10};
  EXPECT_THAT(error_of(doc), HasSubstr("mrope_section: sections sum to 30 but the rotary dims have 32"));

  doc = qwen3_5_vlm();
  doc["quantization"] = {{"bits", 7}, {"group_size", 64}};
  EXPECT_THAT(error_of(doc), HasSubstr("affine bits must be one of 2, 3, 4, 5, 6, 8, got 7"));

  doc = qwen3_5_vlm();
  doc["quantization"] = {{"bits", 4}, {"group_size", 64}, {"mode", "nvfp4"}};
  EXPECT_THAT(error_of(doc), HasSubstr("mode nvfp4 needs bits 4 and group_size 16"));

  doc = qwen3_5_vlm();
  doc["quantization"] = {{"bits", 4}, {"group_size", 64}, {"model.layers.0.mlp.gate", 8}};
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: quantization.model.layers.0.mlp.gate: expected an object"));

  doc = qwen3_5_vlm();
  doc["text_config"]["model_type"] = "llama";
  EXPECT_THAT(error_of(doc), HasSubstr("text_config.model_type: unsupported text model_type 'llama'"));

  doc = qwen3_5_vlm();
  doc.erase("model_type");
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: model_type: required field is missing"));

  EXPECT_THAT(error_of(json::array()), HasSubstr("cfg.json: expected a JSON object"));

  doc = qwen3_5_vlm();
  doc["text_config"]["rope_parameters"]["rope_type"] = "longrope";
  EXPECT_THAT(error_of(doc), HasSubstr("unsupported rope_type 'longrope'"));
}

TEST(Config, LoadConfigNamesMissingAndMalformedFiles) {
  auto dir = std::filesystem::temp_directory_path() / "qinfer-config-test";
  std::filesystem::create_directories(dir);
  try {
    load_config(dir / "nope");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.json not found"));
  }
  {
    std::ofstream(dir / "config.json") << "{\"model_type\": \"qwen3\",";
  }
  try {
    load_config(dir);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "config.json").string() + ": malformed JSON"));
  }
  std::filesystem::remove_all(dir);
}

// The defaults table must agree with transformers' own config classes, dumped on the GPU machine by
// tools/make_golden.py into hf_config_defaults.json.
TEST(Config, DefaultsMatchTransformers) {
  const auto path = std::filesystem::path(QINFER_TEST_DATA) / "golden" / "hf_config_defaults.json";
  json hf = read_json_file(path);
  const std::pair<const char*, const char*> classes[] = {{"qwen3", "Qwen3Config"},
                                                         {"qwen3_moe", "Qwen3MoeConfig"},
                                                         {"qwen3_next", "Qwen3NextConfig"},
                                                         {"qwen3_5_text", "Qwen3_5TextConfig"},
                                                         {"qwen3_5_moe_text", "Qwen3_5MoeTextConfig"}};
  int compared = 0;
  for (const auto& [type, cls] : classes) {
    ASSERT_TRUE(hf.contains(cls)) << cls;
    const json& theirs = hf[cls];
    const json& ours = hf_text_defaults(type);
    for (const auto& [key, value] : ours.items()) {
      // Keys of ours that HF keeps elsewhere (rope parameters) or that are qinfer's own flags.
      json expected;
      if (theirs.contains(key)) expected = theirs[key];
      else if (key == "num_experts" && theirs.contains("num_local_experts")) expected = theirs["num_local_experts"];
      else if (theirs.contains("rope_parameters") && theirs["rope_parameters"].is_object() &&
               theirs["rope_parameters"].contains(key))
        expected = theirs["rope_parameters"][key];
      else continue;
      if (value.is_number() && expected.is_number()) EXPECT_DOUBLE_EQ(value.get<double>(), expected.get<double>())
          << cls << "." << key;
      else EXPECT_EQ(value, expected) << cls << "." << key;
      ++compared;
    }
  }
  EXPECT_GT(compared, 60);
}

}  // namespace
}  // namespace qinfer::io

namespace qinfer::io {
namespace {

// The hand-written (release-style) config.json and what transformers 5.17 writes for the same model
// (rope_parameters, num_local_experts, dtype, explicit layer_types) must mean the same thing.
TEST(Config, ReleaseStyleAndTransformers5ConfigsAgree) {
  const auto golden = std::filesystem::path(QINFER_TEST_DATA) / "golden";
  for (const char* fixture : {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_yarn"}) {
    ModelConfig a = load_config(golden / fixture / "config.json");
    ModelConfig b = load_config(golden / fixture / "hf_saved_config.json");
    const TextConfig &x = a.text, &y = b.text;
    EXPECT_EQ(x.model_type, y.model_type) << fixture;
    EXPECT_EQ(x.hidden_size, y.hidden_size) << fixture;
    EXPECT_EQ(x.head_dim, y.head_dim) << fixture;
    EXPECT_EQ(x.num_key_value_heads, y.num_key_value_heads) << fixture;
    EXPECT_EQ(x.layer_types, y.layer_types) << fixture;
    EXPECT_EQ(x.num_experts, y.num_experts) << fixture;
    EXPECT_EQ(x.mlp_only_layers, y.mlp_only_layers) << fixture;
    EXPECT_EQ(x.norm_topk_prob, y.norm_topk_prob) << fixture;
    EXPECT_DOUBLE_EQ(x.rope.theta, y.rope.theta) << fixture;
    EXPECT_EQ(x.rotary_dim(), y.rotary_dim()) << fixture;
    EXPECT_EQ(x.rope.mrope_section, y.rope.mrope_section) << fixture;
    EXPECT_EQ(x.rope.type, y.rope.type) << fixture;
    EXPECT_DOUBLE_EQ(x.rope.factor, y.rope.factor) << fixture;
    EXPECT_EQ(x.rope.original_max_position_embeddings, y.rope.original_max_position_embeddings) << fixture;
    EXPECT_EQ(x.max_position_embeddings, y.max_position_embeddings) << fixture;
    EXPECT_EQ(x.tie_word_embeddings, y.tie_word_embeddings) << fixture;
    EXPECT_EQ(x.mtp_num_hidden_layers, y.mtp_num_hidden_layers) << fixture;
    EXPECT_EQ(x.dtype, "bfloat16") << fixture;
    EXPECT_EQ(y.dtype, "bfloat16") << fixture;
    EXPECT_EQ(a.vision.has_value(), b.vision.has_value()) << fixture;
  }
}

}  // namespace
}  // namespace qinfer::io
