// The golden fixtures through normalization: both generations of the same model land on the same
// canonical tensors, and sharded / fused / per-expert layouts resolve to the bytes transformers used.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "models/registry.h"

namespace qinfer::models {
namespace {

const std::filesystem::path kGolden = std::filesystem::path(QINFER_TEST_DATA) / "golden";

// qwen3_5_mlx is qwen3_5 converted the way mlx-lm converts: after normalization every text and MTP
// tensor must hold the same values; zero-centred gains differ only by bf16 rounding of 1 + w.
TEST(GoldenCheckpoint, HfAndMlxGenerationsNormalizeToTheSameTensors) {
  Checkpoint hf = open_checkpoint(kGolden / "qwen3_5");
  Checkpoint mlx = open_checkpoint(kGolden / "qwen3_5_mlx");
  EXPECT_EQ(hf.plan.generation, io::Generation::hf);
  EXPECT_EQ(mlx.plan.generation, io::Generation::mlx);
  EXPECT_TRUE(hf.plan.shift_norms);
  EXPECT_FALSE(mlx.plan.shift_norms);
  size_t compared = 0, shifted = 0;
  for (const auto& [name, t] : hf.plan.tensors) {
    if (t.group == io::TensorGroup::vision) continue;
    const io::CanonicalTensor* other = mlx.plan.find(name);
    ASSERT_NE(other, nullptr) << name;
    ASSERT_EQ(t.shape, other->shape) << name;
    std::vector<float> a = t.read_f32(), b = other->read_f32();
    ASSERT_EQ(a.size(), b.size());
    const float tolerance = t.add_one ? 1.0f / 256 : 0.0f;
    for (size_t i = 0; i < a.size(); ++i) ASSERT_LE(std::abs(a[i] - b[i]), tolerance) << name << "[" << i << "]";
    ++compared;
    shifted += t.add_one;
  }
  EXPECT_EQ(compared, hf.plan.count(io::TensorGroup::text) + hf.plan.count(io::TensorGroup::mtp));
  EXPECT_EQ(shifted, 18u);  // 4 layers x 2 + final + q/k norm of the attention layer + 7 MTP norms
  EXPECT_EQ(hf.plan.count(io::TensorGroup::vision), mlx.plan.count(io::TensorGroup::vision));
}

TEST(GoldenCheckpoint, ShardedPerExpertCheckpointStacksAcrossShards) {
  Checkpoint ck = open_checkpoint(kGolden / "qwen3_moe");
  EXPECT_EQ(ck.store.files().size(), 2u);
  const io::CanonicalTensor& up = ck.plan.at("model.layers.0.mlp.experts.up_proj.weight");
  EXPECT_EQ(up.shape[0], ck.config.text.num_experts);
  EXPECT_EQ(up.pieces.size(), static_cast<size_t>(ck.config.text.num_experts));
  // Layer 0 is split over both shards in this fixture (experts in one, attention in the other).
  std::set<const io::SafetensorsFile*> files;
  for (const auto& [name, t] : ck.plan.tensors)
    if (name.starts_with("model.layers.0."))
      for (const io::Piece& p : t.pieces) files.insert(p.source->file);
  EXPECT_EQ(files.size(), 2u);
  EXPECT_EQ(ck.plan.find("model.layers.1.mlp.experts.up_proj.weight"), nullptr);  // mlp_only_layers = [1]
  EXPECT_NE(ck.plan.find("model.layers.1.mlp.up_proj.weight"), nullptr);
}

TEST(GoldenCheckpoint, FusedExpertsAndPerExpertMtpExperts) {
  Checkpoint ck = open_checkpoint(kGolden / "qwen3_5_moe");
  const io::CanonicalTensor& gate = ck.plan.at("model.layers.0.mlp.experts.gate_proj.weight");
  const io::CanonicalTensor& up = ck.plan.at("model.layers.0.mlp.experts.up_proj.weight");
  EXPECT_EQ(gate.sources, up.sources);
  EXPECT_EQ(gate.sources.front(), "model.language_model.layers.0.mlp.experts.gate_up_proj");
  const io::CanonicalTensor& mtp = ck.plan.at("mtp.layers.0.mlp.experts.down_proj.weight");
  EXPECT_EQ(mtp.group, io::TensorGroup::mtp);
  EXPECT_EQ(mtp.sources.size(), static_cast<size_t>(ck.config.text.num_experts));
}

TEST(GoldenCheckpoint, QwenNextKeepsMtpAndShiftsOnce) {
  Checkpoint ck = open_checkpoint(kGolden / "qwen3_next");
  EXPECT_TRUE(ck.plan.shift_norms);
  EXPECT_GT(ck.plan.count(io::TensorGroup::mtp), 0u);
  EXPECT_TRUE(ck.plan.at("model.layers.3.self_attn.q_norm.weight").add_one);
  EXPECT_FALSE(ck.plan.at("model.layers.0.linear_attn.norm.weight").add_one);
  EXPECT_EQ(ck.plan.at("model.layers.0.linear_attn.in_proj_qkvz.weight").shape[0],
            2 * ck.config.text.linear_key_dim() + 2 * ck.config.text.linear_value_dim());
}

TEST(GoldenCheckpoint, TiedQwen3HasNoHead) {
  Checkpoint ck = open_checkpoint(kGolden / "qwen3");
  EXPECT_TRUE(ck.config.text.tie_word_embeddings);
  EXPECT_EQ(ck.plan.find("lm_head.weight"), nullptr);
  EXPECT_FALSE(ck.plan.zero_centred_norms);
}

}  // namespace
}  // namespace qinfer::models
