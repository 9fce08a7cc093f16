// The sharding math: per-rank counts from each family's config, errors naming the config field,
// which rows / columns each tensor splits on, and slice reading: the ranks' slices, read as spans of
// the mapped files, put back together give the whole tensor (dense bf16, MLX 3/4/8-bit, mxfp4).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "models/registry.h"
#include "parallel/sharding.h"
#include "parallel/tp_checkpoints.h"
#include "support/golden_reference.h"

namespace qinfer::parallel {
namespace {

io::TextConfig fixture_config(const std::string& fixture) { return io::load_config(golden::kGolden / fixture).text; }

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PlanShards, PerRankCountsOfEveryFamily) {
  ShardPlan p = plan_shards(fixture_config("qwen3"), 1, 2);
  EXPECT_EQ(p.rank, 1);
  EXPECT_EQ(p.size, 2);
  EXPECT_EQ(p.global.num_attention_heads, 4);
  EXPECT_EQ(p.local.num_attention_heads, 2);
  EXPECT_EQ(p.local.num_key_value_heads, 1);
  EXPECT_EQ(p.local.intermediate_size, 64);
  EXPECT_EQ(p.local.hidden_size, 64);  // replicated dimensions stay
  EXPECT_EQ(p.local.vocab_size, p.global.vocab_size);

  p = plan_shards(fixture_config("qwen3_moe"), 0, 2);  // layer 1 is dense (mlp_only_layers)
  EXPECT_EQ(p.local.moe_intermediate_size, 24);
  EXPECT_EQ(p.local.intermediate_size, 64);
  EXPECT_EQ(p.local.num_experts, 8);  // experts are split by their intermediate, not handed out

  p = plan_shards(fixture_config("qwen3_next"), 0, 2);
  EXPECT_EQ(p.local.linear_num_key_heads, 1);
  EXPECT_EQ(p.local.linear_num_value_heads, 2);
  EXPECT_EQ(p.local.linear_key_head_dim, p.global.linear_key_head_dim);  // heads split, not their width
  EXPECT_EQ(p.local.moe_intermediate_size, 24);
  EXPECT_EQ(p.local.shared_expert_intermediate_size, 48);
  EXPECT_EQ(p.local.num_attention_heads, 2);

  p = plan_shards(fixture_config("qwen3_5"), 1, 2);
  EXPECT_EQ(p.local.linear_num_key_heads, 1);
  EXPECT_EQ(p.local.linear_num_value_heads, 2);
  EXPECT_EQ(p.local.intermediate_size, 128);
  EXPECT_EQ(p.local.linear_conv_dim(), p.global.linear_conv_dim() / 2);

  p = plan_shards(fixture_config("qwen3_5_moe"), 1, 2);
  EXPECT_EQ(p.local.moe_intermediate_size, 32);
  EXPECT_EQ(p.local.shared_expert_intermediate_size, 32);
  EXPECT_EQ(p.local.num_key_value_heads, 1);

  p = plan_shards(fixture_config("qwen3_next"), 0, 1);
  EXPECT_EQ(p.local.num_attention_heads, 4);
  EXPECT_EQ(p.local.linear_num_value_heads, 4);
  EXPECT_EQ(p.local.moe_intermediate_size, 48);
}

TEST(PlanShards, CountsThatDoNotDivideNameTheField) {
  io::TextConfig c = fixture_config("qwen3");
  c.num_attention_heads = 24;
  c.num_key_value_heads = 8;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 3); }), "tensor parallel 3: num_key_value_heads 8 is not divisible by 3");
  EXPECT_EQ(error_of([&] { plan_shards(fixture_config("qwen3_next"), 0, 4); }),
            "tensor parallel 4: num_key_value_heads 2 is not divisible by 4");
  c = fixture_config("qwen3");
  c.num_attention_heads = 6;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 4); }), "tensor parallel 4: num_attention_heads 6 is not divisible by 4");
  c.num_attention_heads = 4;
  c.intermediate_size = 131;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 2); }), "tensor parallel 2: intermediate_size 131 is not divisible by 2");

  c = fixture_config("qwen3_5");
  c.linear_num_value_heads = 6;
  EXPECT_EQ(error_of([&] { plan_shards(c, 1, 2); }), "");
  c.linear_num_value_heads = 5;
  EXPECT_EQ(error_of([&] { plan_shards(c, 1, 2); }),
            "tensor parallel 2: linear_num_value_heads 5 is not divisible by 2");
  c = fixture_config("qwen3_5");
  c.linear_num_key_heads = 3;
  EXPECT_EQ(error_of([&] { plan_shards(c, 1, 2); }), "tensor parallel 2: linear_num_key_heads 3 is not divisible by 2");

  c = fixture_config("qwen3_next");
  c.moe_intermediate_size = 50;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 2); }), "");
  c.moe_intermediate_size = 51;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 2); }), "tensor parallel 2: moe_intermediate_size 51 is not divisible by 2");
  c = fixture_config("qwen3_next");
  c.shared_expert_intermediate_size = 97;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 2); }),
            "tensor parallel 2: shared_expert_intermediate_size 97 is not divisible by 2");
  // A count no layer uses does not have to divide: qwen3_5_moe has no dense MLP.
  c = fixture_config("qwen3_5_moe");
  c.intermediate_size = 7;
  EXPECT_EQ(error_of([&] { plan_shards(c, 0, 2); }), "");

  EXPECT_NE(error_of([&] { plan_shards(c, 2, 2); }).find("rank 2 is not in 0..1"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_shards(c, 0, 0); }), "");
}

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

TEST(SliceOf, RowsAndColumnsFollowTheHeads) {
  const ShardPlan p = plan_shards(fixture_config("qwen3_5"), 1, 2);  // Hq 4, Hkv 2, hd 32; Hk 2, Hv 4, Dk = Dv = 32
  const std::string a = "model.layers.3.self_attn.", g = "model.layers.0.linear_attn.";
  // Gated q_proj: [query | gate] per head, so rank 1's two heads are the second half of the rows.
  Slice s = slice_of(a + "q_proj.weight", {256, 128}, p);
  EXPECT_EQ(s.kind, Slice::rows);
  EXPECT_EQ(s.row_ranges, (Ranges{{128, 256}}));
  EXPECT_EQ(slice_of(a + "k_proj.weight", {64, 128}, p).row_ranges, (Ranges{{32, 64}}));
  s = slice_of(a + "o_proj.weight", {128, 128}, p);
  EXPECT_EQ(s.kind, Slice::columns);
  EXPECT_EQ(s.column_begin, 64);
  EXPECT_EQ(s.column_end, 128);
  // q (Hk·Dk = 64) | k (64) | v (Hv·Dv = 128): each section split; value heads 2,3 use key head 1.
  EXPECT_EQ(slice_of(g + "in_proj_qkv.weight", {256, 128}, p).row_ranges, (Ranges{{32, 64}, {96, 128}, {192, 256}}));
  EXPECT_EQ(slice_of(g + "conv1d.weight", {256, 4}, p).row_ranges, (Ranges{{32, 64}, {96, 128}, {192, 256}}));
  EXPECT_EQ(slice_of(g + "in_proj_z.weight", {128, 128}, p).row_ranges, (Ranges{{64, 128}}));
  EXPECT_EQ(slice_of(g + "in_proj_b.weight", {4, 128}, p).row_ranges, (Ranges{{2, 4}}));
  EXPECT_EQ(slice_of(g + "A_log", {4}, p).row_ranges, (Ranges{{2, 4}}));
  EXPECT_EQ(slice_of(g + "dt_bias", {4}, p).row_ranges, (Ranges{{2, 4}}));
  EXPECT_EQ(slice_of(g + "out_proj.weight", {128, 128}, p).column_begin, 64);
  EXPECT_EQ(slice_of("model.layers.0.mlp.down_proj.weight", {128, 256}, p).column_begin, 128);
  EXPECT_EQ(slice_of("model.layers.0.mlp.up_proj.weight", {256, 128}, p).row_ranges, (Ranges{{128, 256}}));
  for (const char* whole : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                            "model.layers.0.input_layernorm.weight", "model.layers.3.self_attn.q_norm.weight",
                            "model.layers.0.linear_attn.norm.weight", "model.layers.0.mlp.gate.weight",
                            "model.layers.0.mlp.shared_expert_gate.weight"})
    EXPECT_EQ(slice_of(whole, {8, 128}, p).kind, Slice::replicated) << whole;
  // Experts: each expert's intermediate rows (gate/up) and input columns (down).
  s = slice_of("model.layers.0.mlp.experts.gate_proj.weight", {8, 64, 64}, p);
  EXPECT_EQ(s.row_ranges, (Ranges{{32, 64}}));
  s = slice_of("model.layers.0.mlp.experts.down_proj.weight", {8, 64, 64}, p);
  EXPECT_EQ(s.kind, Slice::columns);
  EXPECT_EQ(s.column_begin, 32);
  EXPECT_EQ(slice_of("model.layers.0.mlp.shared_expert.down_proj.weight", {64, 64}, p).kind, Slice::columns);
  // Qwen3-Next's grouped projections: whole key-head groups.
  const ShardPlan next = plan_shards(fixture_config("qwen3_next"), 0, 2);
  EXPECT_EQ(slice_of(g + "in_proj_qkvz.weight", {384, 64}, next).row_ranges, (Ranges{{0, 192}}));
  EXPECT_EQ(slice_of(g + "in_proj_ba.weight", {8, 64}, next).row_ranges, (Ranges{{0, 4}}));
  // One rank keeps everything whole.
  EXPECT_EQ(slice_of(a + "q_proj.weight", {256, 128}, plan_shards(fixture_config("qwen3_5"), 0, 1)).kind,
            Slice::replicated);
  // A q | k | v tensor whose rows do not add up is an error naming it.
  EXPECT_NE(error_of([&] { slice_of(g + "in_proj_qkv.weight", {250, 128}, p); }).find("in_proj_qkv"),
            std::string::npos);
}

std::vector<std::byte> concat(const StoredSlice& s) {
  std::vector<std::byte> out;
  for (const auto& span : s.spans) out.insert(out.end(), span.begin(), span.end());
  return out;
}

// The whole tensor back from every rank's slice, put together by the slice's own geometry.
std::vector<std::byte> reassemble(const io::CanonicalTensor& t, const std::vector<Slice>& slices,
                                  int64_t logical_columns) {
  const size_t n = slices.size();
  std::vector<std::vector<std::byte>> parts;
  std::vector<size_t> at(n, 0);
  for (const Slice& s : slices) {
    StoredSlice stored = stored_slice(t, s, logical_columns);
    EXPECT_EQ(stored.nbytes(), t.nbytes() / n) << t.name;  // each rank reads only its share
    parts.push_back(concat(stored));
  }
  const uint64_t element = storage_bytes(t.dtype, 1);
  std::vector<std::byte> out;
  auto take = [&](size_t r, uint64_t bytes) {
    out.insert(out.end(), parts[r].begin() + static_cast<std::ptrdiff_t>(at[r]),
               parts[r].begin() + static_cast<std::ptrdiff_t>(at[r] + bytes));
    at[r] += bytes;
  };
  const std::vector<int64_t>& shape = t.shape;
  if (slices[0].kind == Slice::rows) {
    const size_t axis = shape.size() >= 2 ? shape.size() - 2 : 0;
    const uint64_t row_bytes = (shape.size() >= 2 ? shape.back() : 1) * element;
    int64_t blocks = 1;
    for (size_t d = 0; d < axis; ++d) blocks *= shape[d];
    for (int64_t b = 0; b < blocks; ++b)
      for (size_t k = 0; k < slices[0].row_ranges.size(); ++k)
        for (size_t r = 0; r < n; ++r)
          take(r, static_cast<uint64_t>(slices[r].row_ranges[k].second - slices[r].row_ranges[k].first) * row_bytes);
  } else {
    const int64_t rows = static_cast<int64_t>(t.nbytes() / (shape.back() * element));
    for (int64_t row = 0; row < rows; ++row)
      for (size_t r = 0; r < n; ++r) take(r, shape.back() / static_cast<int64_t>(n) * element);
  }
  for (size_t r = 0; r < n; ++r) EXPECT_EQ(at[r], parts[r].size()) << t.name << " rank " << r;
  return out;
}

// Checks every sharded text tensor of a checkpoint; returns how many were sharded.
int check_reassembly(const models::Checkpoint& checkpoint, int size) {
  std::vector<ShardPlan> plans;
  for (int r = 0; r < size; ++r) plans.push_back(plan_shards(checkpoint.config.text, r, size));
  int sharded = 0;
  for (const auto& [name, t] : checkpoint.plan.tensors) {
    if (t.group != io::TensorGroup::text || name.ends_with(".scales") || name.ends_with(".biases")) continue;
    const std::vector<int64_t> logical = logical_shape(t);
    std::vector<Slice> slices;
    for (const ShardPlan& p : plans) slices.push_back(slice_of(name, logical, p));
    if (slices[0].kind == Slice::replicated) continue;
    ++sharded;
    EXPECT_TRUE(reassemble(t, slices, logical.back()) == t.read_bytes()) << name;
    if (!t.quant) continue;
    const std::string base = name.substr(0, name.size() - 7);
    for (const char* part : {".scales", ".biases"}) {
      const io::CanonicalTensor* q = checkpoint.plan.find(base + part);
      if (q) {
        EXPECT_TRUE(reassemble(*q, slices, logical.back()) == q->read_bytes()) << base + part;
      }
    }
  }
  return sharded;
}

TEST(StoredSlice, DenseSlicesReassembleEveryTensor) {
  // qwen3_next stores its experts one by one (a stacked tensor of many pieces); qwen3_5_moe fuses
  // gate_up (each half a piece per expert).
  for (const char* fixture : {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe"}) {
    const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / fixture);
    EXPECT_GT(check_reassembly(checkpoint, 2), 10) << fixture;
  }
  // One rank keeps every tensor whole.
  EXPECT_EQ(check_reassembly(models::open_checkpoint(golden::kGolden / "qwen3"), 1), 0);
}

TEST(StoredSlice, QuantizedSlicesReassembleEveryTensor) {
  for (const char* fixture : {"qwen3_mlx_8bit", "qwen3_5_mlx_3bit", "qwen3_5_mlx_6bit", "qwen3_5_mlx_mxfp4"}) {
    const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / fixture);
    EXPECT_GT(check_reassembly(checkpoint, 2), 10) << fixture;
  }
}

TEST(StoredSlice, QuantizedColumnSliceDequantizesToTheWholeRowsColumns) {
  const models::Checkpoint checkpoint = models::open_checkpoint(moe_4bit_g32());
  EXPECT_GT(check_reassembly(checkpoint, 2), 10);
  const std::string base = "model.layers.3.self_attn.o_proj";
  const io::CanonicalTensor& codes = checkpoint.plan.at(base + ".weight");
  ASSERT_TRUE(codes.quant.has_value());
  const io::CanonicalTensor& scales = checkpoint.plan.at(base + ".scales");
  const io::CanonicalTensor& biases = checkpoint.plan.at(base + ".biases");
  const quant::Layout layout{quant::Mode::affine, codes.quant->bits, codes.quant->group_size};
  const std::vector<int64_t> logical = logical_shape(codes);
  const int64_t rows = logical[0], in = logical[1];
  const std::vector<std::byte> all_codes = codes.read_bytes(), all_scales = scales.read_bytes(),
                               all_biases = biases.read_bytes();
  const uint64_t scale_bytes = storage_bytes(scales.dtype, 1);
  for (int r = 0; r < 2; ++r) {
    const Slice s = slice_of(base + ".weight", logical, plan_shards(checkpoint.config.text, r, 2));
    ASSERT_EQ(s.kind, Slice::columns);
    const int64_t width = s.column_end - s.column_begin;
    const std::vector<std::byte> c = concat(stored_slice(codes, s, in)), sc = concat(stored_slice(scales, s, in)),
                                 bi = concat(stored_slice(biases, s, in));
    for (int64_t row = 0; row < rows; ++row) {
      std::vector<float> whole(in), part(width);
      const int64_t words = in * layout.bits / 32, groups = in / layout.group_size;
      quant::dequantize_row(layout, reinterpret_cast<const uint32_t*>(all_codes.data()) + row * words, scales.dtype,
                            all_scales.data() + row * groups * scale_bytes, all_biases.data() + row * groups * scale_bytes,
                            0.0f, in, whole.data());
      const int64_t part_words = width * layout.bits / 32, part_groups = width / layout.group_size;
      quant::dequantize_row(layout, reinterpret_cast<const uint32_t*>(c.data()) + row * part_words, scales.dtype,
                            sc.data() + row * part_groups * scale_bytes, bi.data() + row * part_groups * scale_bytes,
                            0.0f, width, part.data());
      for (int64_t j = 0; j < width; ++j) ASSERT_EQ(part[j], whole[s.column_begin + j]) << "rank " << r << " row " << row;
    }
  }
}

TEST(CheckShards, RowParallelInputsOffQuantizationGroupsAreAnError) {
  // o_proj has 4·16 = 64 inputs: 32 per rank at TP=2, half of a 64-wide group.
  const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / "qwen3_5_moe_mlx_4bit");
  const std::string error = error_of([&] { check_shards(plan_shards(checkpoint.config.text, 0, 2), checkpoint.plan); });
  EXPECT_NE(error.find("tensor parallel 2: '"), std::string::npos) << error;
  EXPECT_NE(error.find("gives each rank 32 input columns, not a multiple of its quantization group size 64"),
            std::string::npos)
      << error;
  EXPECT_EQ(error_of([&] { check_shards(plan_shards(checkpoint.config.text, 0, 1), checkpoint.plan); }), "");
  const models::Checkpoint g32 = models::open_checkpoint(moe_4bit_g32());
  EXPECT_EQ(error_of([&] { check_shards(plan_shards(g32.config.text, 1, 2), g32.plan); }), "");
}

}  // namespace
}  // namespace qinfer::parallel
