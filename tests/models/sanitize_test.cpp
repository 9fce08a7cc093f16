// Every sanitize rule, in both checkpoint generations, on synthetic checkpoints whose canonical
// values are known: normalization must hand each canonical tensor exactly the values it started from.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "synthetic.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;

// bf16 storage rounds γ−1 and γ differently; half an ulp at 1.0 is 2^-8.
constexpr float kTolerance = 1.0f / 128;

void expect_values(const io::NormalizationPlan& plan, const std::map<std::string, CanonicalValues>& values) {
  for (const auto& [name, v] : values) {
    const io::CanonicalTensor* t = plan.find(name);
    ASSERT_NE(t, nullptr) << name;
    if (t->quant) continue;
    EXPECT_EQ(t->shape, v.shape) << name;
    std::vector<float> got = t->read_f32();
    ASSERT_EQ(got.size(), v.gamma.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], v.gamma[i], kTolerance) << name << "[" << i << "]";
    }
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Case {
  std::string model_type;
  Layout layout;
  SyntheticOptions options;
};

class SanitizeRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(SanitizeRoundTrip, CanonicalValuesSurvive) {
  const Case& c = GetParam();
  TempDir dir;
  SyntheticOptions o = c.options;
  o.layout = c.layout;
  auto values = write_synthetic(dir.path(), tiny_config(c.model_type), o);
  models::Checkpoint ck = models::open_checkpoint(dir.path());
  EXPECT_EQ(ck.family->name, c.model_type);
  expect_values(ck.plan, values);
  const bool zero_centred = ck.family->rules.zero_centred_norms;
  EXPECT_EQ(ck.plan.shift_norms, zero_centred && c.layout == Layout::hf);
  EXPECT_EQ(ck.plan.count(io::TensorGroup::mtp) > 0, o.with_mtp);
  EXPECT_EQ(ck.plan.count(io::TensorGroup::vision), o.with_vision ? 2u : 0u);
  if (c.layout == Layout::mlx && ck.family->rules.vlm_naming) {
    EXPECT_EQ(ck.plan.generation, io::Generation::mlx);
  }
  if (c.layout == Layout::hf) {
    EXPECT_EQ(ck.plan.generation, io::Generation::hf);
  }
  for (const auto& [name, t] : ck.plan.tensors) {
    // The linear-attention output norm is a plain gain and is never shifted.
    if (name.ends_with("linear_attn.norm.weight")) {
      EXPECT_FALSE(t.add_one) << name;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = c.model_type + (c.layout == Layout::hf ? "_hf" : "_mlx");
  if (c.options.with_mtp) name += "_mtp";
  if (c.options.with_vision) name += "_vision";
  if (c.options.mtp_per_expert) name += "_mtp_per_expert";
  if (c.options.strip_model_prefix) name += "_bare";
  if (c.options.store_tied_head) name += "_tied_head";
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Families, SanitizeRoundTrip,
    ::testing::Values(Case{"qwen3", Layout::hf, {}}, Case{"qwen3", Layout::hf, {.store_tied_head = true}},
                      Case{"qwen3", Layout::hf, {.strip_model_prefix = true}}, Case{"qwen3_moe", Layout::hf, {}},
                      Case{"qwen3_moe", Layout::mlx, {}}, Case{"qwen3_next", Layout::hf, {.with_mtp = true}},
                      Case{"qwen3_next", Layout::mlx, {}},
                      Case{"qwen3_5", Layout::hf, {.with_mtp = true, .with_vision = true}},
                      Case{"qwen3_5", Layout::mlx, {.with_mtp = true, .with_vision = true}},
                      Case{"qwen3_5", Layout::mlx, {}},
                      Case{"qwen3_5_moe", Layout::hf, {.with_mtp = true, .with_vision = true}},
                      Case{"qwen3_5_moe", Layout::hf, {.with_mtp = true, .mtp_per_expert = true}},
                      Case{"qwen3_5_moe", Layout::mlx, {.with_mtp = true}}),
    case_name);

// The regression the old "any mtp. tensor => shift" rule caused: an MLX-converted Qwen3.5/3.6
// checkpoint that keeps its MTP weights already stores γ and must not get a second +1.
TEST(Sanitize, MlxConvertedCheckpointKeepingMtpIsNotShiftedTwice) {
  TempDir dir;
  auto values = write_synthetic(dir.path(), tiny_config("qwen3_5"), {.layout = Layout::mlx, .with_mtp = true});
  models::Checkpoint ck = models::open_checkpoint(dir.path());
  ASSERT_GT(ck.plan.count(io::TensorGroup::mtp), 0u);
  EXPECT_FALSE(ck.plan.shift_norms);
  const io::CanonicalTensor& norm = ck.plan.at("model.layers.0.input_layernorm.weight");
  EXPECT_FALSE(norm.add_one);
  EXPECT_NEAR(norm.read_f32()[0], values.at("model.layers.0.input_layernorm.weight").gamma[0], kTolerance);
  EXPECT_FALSE(ck.plan.at("mtp.norm.weight").add_one);
  EXPECT_THAT(ck.plan.shift_reason, HasSubstr("[C, K, 1]"));
}

TEST(Sanitize, RawHfCheckpointIsShiftedOnceIncludingMtpNorms) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3_5"), {.layout = Layout::hf, .with_mtp = true});
  models::Checkpoint ck = models::open_checkpoint(dir.path());
  EXPECT_TRUE(ck.plan.shift_norms);
  for (const char* name : {"model.norm.weight", "model.layers.3.self_attn.q_norm.weight", "mtp.norm.weight",
                           "mtp.pre_fc_norm_embedding.weight", "mtp.layers.0.self_attn.k_norm.weight"})
    EXPECT_TRUE(ck.plan.at(name).add_one) << name;
  EXPECT_FALSE(ck.plan.at("model.layers.0.linear_attn.norm.weight").add_one);
}

TEST(Sanitize, LayoutAndStoredGainsDisagreeIsAnErrorExplainingBoth) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3_5"), {.layout = Layout::hf, .gains_already_shifted = true});
  std::string message = error_of([&] { models::open_checkpoint(dir.path()); });
  EXPECT_THAT(message, HasSubstr("[C, 1, K] (raw HF)"));
  EXPECT_THAT(message, HasSubstr("looks like γ"));
  EXPECT_THAT(message, HasSubstr(dir.path().string()));
}

TEST(Sanitize, PlainNormFamiliesAreNeverShifted) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3_moe"), {.layout = Layout::hf});
  models::Checkpoint ck = models::open_checkpoint(dir.path());
  EXPECT_FALSE(ck.plan.zero_centred_norms);
  for (const auto& [name, t] : ck.plan.tensors) EXPECT_FALSE(t.add_one) << name;
}

TEST(Sanitize, TiedHeadIsDroppedAndMissingUntiedHeadIsAnError) {
  TempDir tied;
  write_synthetic(tied.path(), tiny_config("qwen3"), {.store_tied_head = true});
  models::Checkpoint ck = models::open_checkpoint(tied.path());
  EXPECT_EQ(ck.plan.find("lm_head.weight"), nullptr);
  ASSERT_EQ(ck.plan.dropped.size(), 1u);
  EXPECT_EQ(ck.plan.dropped[0].first, "lm_head.weight");

  TempDir untied;
  io::json config = tiny_config("qwen3");
  write_synthetic(untied.path(), config, {});
  config["tie_word_embeddings"] = false;
  write_file(untied.path() / "config.json", config.dump());
  EXPECT_THAT(error_of([&] { models::open_checkpoint(untied.path()); }),
              HasSubstr("tensor 'lm_head.weight' is missing"));
}

TEST(Sanitize, FusedGateUpIsSplitPerExpert) {
  TempDir dir;
  auto values = write_synthetic(dir.path(), tiny_config("qwen3_5_moe"), {.layout = Layout::hf});
  models::Checkpoint ck = models::open_checkpoint(dir.path());
  const io::CanonicalTensor& gate = ck.plan.at("model.layers.1.mlp.experts.gate_proj.weight");
  EXPECT_EQ(gate.sources, std::vector<std::string>{"model.language_model.layers.1.mlp.experts.gate_up_proj"});
  const io::CanonicalTensor& up = ck.plan.at("model.layers.1.mlp.experts.up_proj.weight");
  ASSERT_EQ(gate.pieces.size(), 4u);  // one contiguous half per expert
  ASSERT_EQ(up.pieces.size(), 4u);
  const uint64_t half = gate.pieces[0].nbytes;
  for (uint64_t x = 0; x < 4; ++x) {
    EXPECT_EQ(gate.pieces[x].offset, 2 * half * x);
    EXPECT_EQ(up.pieces[x].offset, 2 * half * x + half);
  }
  expect_values(ck.plan, values);
}

TEST(Sanitize, MissingExpertIsAnError) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3_moe"), {});
  // Rewrite the file without expert 2 of layer 0's up projection.
  io::TensorStore store(dir.path());
  SafetensorsWriter writer;
  for (const auto& [name, t] : store.tensors()) {
    if (name == "model.layers.0.mlp.experts.2.up_proj.weight") continue;
    auto data = t.data();
    writer.add(name, t.info->dtype, t.info->shape, std::vector<std::byte>(data.begin(), data.end()));
  }
  TempDir broken;
  writer.write(broken / "model.safetensors");
  std::filesystem::copy_file(dir / "config.json", broken / "config.json");
  EXPECT_THAT(error_of([&] { models::open_checkpoint(broken.path()); }),
              HasSubstr("model.layers.0.mlp.experts.up_proj.weight"));
}

TEST(Sanitize, WrongShapeNamesTensorAndExpectedShape) {
  TempDir dir;
  io::json config = tiny_config("qwen3");
  write_synthetic(dir.path(), config, {});
  config["intermediate_size"] = 96;
  write_file(dir.path() / "config.json", config.dump());
  std::string message = error_of([&] { models::open_checkpoint(dir.path()); });
  EXPECT_THAT(message, HasSubstr("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_THAT(message, HasSubstr("[128, 64], expected [96, 64]"));
}

TEST(Sanitize, MixedConvLayoutsAreAnError) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3_next"), {.layout = Layout::hf});
  io::TensorStore store(dir.path());
  SafetensorsWriter writer;
  for (const auto& [name, t] : store.tensors()) {
    auto data = t.data();
    std::vector<int64_t> shape = t.info->shape;
    if (name == "model.layers.1.linear_attn.conv1d.weight") shape = {shape[0], shape[2], 1};
    writer.add(name, t.info->dtype, shape, std::vector<std::byte>(data.begin(), data.end()));
  }
  TempDir broken;
  writer.write(broken / "model.safetensors");
  std::filesystem::copy_file(dir / "config.json", broken / "config.json");
  EXPECT_THAT(error_of([&] { models::open_checkpoint(broken.path()); }), HasSubstr("mix the HF [C,1,K] and MLX"));
}

TEST(Sanitize, QuantizedWeightsCarryTheirSpecIncludingOverrides) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3_5_moe"), {.layout = Layout::mlx, .quantize = true});
  models::Checkpoint ck = models::open_checkpoint(dir.path());
  ASSERT_TRUE(ck.config.quantization.has_value());
  const io::CanonicalTensor& q = ck.plan.at("model.layers.0.linear_attn.in_proj_qkv.weight");
  ASSERT_TRUE(q.quant.has_value());
  EXPECT_EQ(q.quant->bits, 4);
  const io::CanonicalTensor& router = ck.plan.at("model.layers.0.mlp.gate.weight");
  ASSERT_TRUE(router.quant.has_value());
  EXPECT_EQ(router.quant->bits, 8);
  EXPECT_EQ(router.shape, (std::vector<int64_t>{4, 64 * 8 / 32}));
  EXPECT_TRUE(ck.plan.at("model.layers.0.mlp.experts.down_proj.weight").quant.has_value());
  EXPECT_FALSE(ck.plan.at("model.layers.0.input_layernorm.weight").quant.has_value());
}

TEST(Sanitize, ScalesWithoutQuantizationTableIsAnError) {
  TempDir dir;
  io::json config = tiny_config("qwen3");
  write_synthetic(dir.path(), config, {.layout = Layout::mlx, .quantize = true});
  write_file(dir.path() / "config.json", config.dump());
  EXPECT_THAT(error_of([&] { models::open_checkpoint(dir.path()); }),
              HasSubstr("no MLX `quantization` table"));
}

TEST(Sanitize, ScalesOnModuleMarkedUnquantizedIsAnError) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3"), {.layout = Layout::mlx, .quantize = true});
  io::json config = io::read_json_file(dir.path() / "config.json");
  config["quantization"]["model.layers.1.mlp.up_proj"] = false;
  write_file(dir.path() / "config.json", config.dump());
  EXPECT_THAT(error_of([&] { models::open_checkpoint(dir.path()); }),
              HasSubstr("says module 'model.layers.1.mlp.up_proj' is not quantized"));
}

TEST(Sanitize, QuantizedWeightWithWrongBitsIsAnError) {
  TempDir dir;
  write_synthetic(dir.path(), tiny_config("qwen3"), {.layout = Layout::mlx, .quantize = true});
  io::json config = io::read_json_file(dir.path() / "config.json");
  config["quantization"]["bits"] = 8;
  config.erase("quantization_config");
  write_file(dir.path() / "config.json", config.dump());
  EXPECT_THAT(error_of([&] { models::open_checkpoint(dir.path()); }), HasSubstr("expected uint32"));
}

TEST(Registry, UnknownModelTypeListsSupportedTypes) {
  TempDir dir;
  io::json config = tiny_config("qwen3");
  config["model_type"] = "llama";
  write_file(dir.path() / "config.json", config.dump());
  std::string message = error_of([&] { models::open_checkpoint(dir.path()); });
  EXPECT_THAT(message, HasSubstr("'llama'"));
  EXPECT_THAT(message, HasSubstr("qwen3_5_moe"));
}

TEST(Registry, EveryFamilyIsRegisteredWithItsCapabilities) {
  std::vector<std::string> names;
  for (const models::Family& f : models::families()) names.emplace_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"}));
  for (const char* type : {"qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
    io::ModelConfig c = io::parse_config(tiny_config(type), "config.json");
    const models::Family& f = models::family_for(c);
    EXPECT_TRUE(f.capabilities(c).recurrent_state) << type;
    EXPECT_TRUE(f.capabilities(c).mtp) << type;
  }
  io::ModelConfig qwen3 = io::parse_config(tiny_config("qwen3"), "config.json");
  EXPECT_EQ(models::family_for(qwen3).capabilities(qwen3).embedding_terminator, "<|endoftext|>");
  io::ModelConfig q35 = io::parse_config(tiny_config("qwen3_5"), "config.json");
  EXPECT_TRUE(models::family_for(q35).capabilities(q35).vision);
  // A Qwen3.5 config that has experts belongs to the MoE family even if its type says otherwise.
  io::json moe = tiny_config("qwen3_5_moe");
  moe["model_type"] = "qwen3_5";
  moe["text_config"]["model_type"] = "qwen3_5_text";
  EXPECT_THROW(models::family_for(io::parse_config(moe, "config.json")), Error);
}

}  // namespace
}  // namespace qinfer::testing
