#pragma once
// Expected-tensor lists for the blocks the families share, in canonical names. A family's list is
// the sum of its blocks, so a shape rule lives in one place.
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace qinfer::models {

using Expected = std::vector<io::ExpectedTensor>;

void add_embedding_and_head(Expected& out, const io::TextConfig& c);
// Plain (Qwen3) or output-gated (Next / 3.5: q_proj doubled) attention with per-head q/k norms.
void add_attention(Expected& out, const std::string& prefix, const io::TextConfig& c, bool gated);
// `intermediate_field` names the config field the intermediate size comes from, for errors.
void add_dense_mlp(Expected& out, const std::string& prefix, int64_t hidden, int64_t intermediate,
                   const std::string& intermediate_field);
// Router + stacked experts (+ shared expert and its sigmoid gate when the config has one).
void add_moe(Expected& out, const std::string& prefix, const io::TextConfig& c);
void add_layer_norms(Expected& out, const std::string& prefix, int64_t hidden);
// Gated DeltaNet: `grouped` is Qwen3-Next's fused in_proj_qkvz / in_proj_ba, else Qwen3.5's split projections.
void add_gated_deltanet(Expected& out, const std::string& prefix, const io::TextConfig& c, bool grouped);
// The MTP head of Next / 3.5: fc over [embedding; hidden], full-attention layers, final norm.
void add_mtp(Expected& out, const io::TextConfig& c);
// The decoder layer stack of Qwen3 / Qwen3-MoE: plain attention, dense or MoE feed-forward per layer.
void add_attention_layers(Expected& out, const io::TextConfig& c);
// The decoder layer stack of a hybrid (Next / 3.5) model.
void add_hybrid_layers(Expected& out, const io::TextConfig& c, bool grouped_deltanet);

}  // namespace qinfer::models
