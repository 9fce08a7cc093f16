#include "models/model.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace qinfer::models {

Model::Model(const Checkpoint& checkpoint, Ops& ops, parallel::Communicator* communicator)
    : config_(checkpoint.config.text),
      ops_(ops),
      communicator_(communicator),
      shard_(parallel::plan_shards(config_, communicator ? communicator->rank() : 0,
                                   communicator ? communicator->size() : 1)) {
  const bool sharded = shard_.size > 1;
  if (sharded) parallel::check_shards(shard_, checkpoint.plan);
  // Layers are built from the rank's config: its head counts and intermediates.
  const io::TextConfig& c = shard_.local;
  uint64_t text_bytes = 0;
  for (const auto& [name, t] : checkpoint.plan.tensors) {
    if (t.group != io::TensorGroup::text) continue;
    // A sharded tensor (scales and biases follow their weight) is split evenly over the ranks.
    std::string weight = name;
    if (name.ends_with(".scales") || name.ends_with(".biases")) weight.replace(weight.size() - 7, 7, ".weight");
    const bool split = sharded && parallel::slice_of(weight, parallel::logical_shape(t), shard_).kind !=
                                      parallel::Slice::replicated;
    text_bytes += split ? t.nbytes() / static_cast<uint64_t>(shard_.size) : t.nbytes();
  }
  const auto start = std::chrono::steady_clock::now();
  ProgressBar progress(sharded ? fmt::format("loading weights (rank {})", shard_.rank) : "loading weights",
                       text_bytes, ProgressBar::Unit::bytes);
  layers::WeightLoader w(checkpoint.plan, ops, &progress, sharded ? &shard_ : nullptr);
  embed_tokens = w.matrix("model.embed_tokens.weight");
  final_norm = w.vector("model.norm.weight");
  lm_head = c.tie_word_embeddings ? embed_tokens : w.matrix("lm_head.weight");
  // Qwen3-Next stores grouped linear-attention projections; Qwen3.5 split ones. Gated attention
  // comes with the hybrids.
  const bool hybrid = checkpoint.family->rules.zero_centred_norms;
  const bool grouped = checkpoint.family->name == "qwen3_next";
  int64_t attention_index = 0, linear_index = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = fmt::format("model.layers.{}", i);
    DecoderLayer layer{w.vector(prefix + ".input_layernorm.weight"), w.vector(prefix + ".post_attention_layernorm.weight"),
                       layers::Attention{}, layers::Mlp{}};
    if (c.layer_types[i] == io::LayerKind::linear_attention)
      layer.mixer = layers::GatedDeltaNet::load(w, prefix, c, grouped, linear_index++);
    else
      layer.mixer = layers::Attention::load(w, prefix, c, hybrid && c.attn_output_gate, attention_index++);
    if (c.is_moe_layer(i)) layer.ffn = layers::Moe::load(w, prefix + ".mlp", c);
    else layer.ffn = layers::Mlp::load(w, prefix + ".mlp");
    layers_.push_back(std::move(layer));
  }
  (void)to_host(ops, ops.alloc(DType::f32, {1}));  // the transfers are complete
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("loaded {} of weights onto {} in {:.2f} s ({:.2f} GB/s)", format_bytes(text_bytes), ops.name(), seconds,
           static_cast<double>(text_bytes) / seconds / 1e9);
}

CacheShape Model::cache_shape() const {
  const io::TextConfig& c = shard_.local;
  CacheShape s;
  for (const io::LayerKind kind : c.layer_types) {
    if (kind == io::LayerKind::full_attention) ++s.attention_layers;
    else ++s.linear_layers;
  }
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.conv_channels = c.linear_conv_dim();
  s.conv_window = c.linear_conv_kernel_dim > 0 ? c.linear_conv_kernel_dim - 1 : 0;
  s.value_heads = c.linear_num_value_heads;
  s.value_head_dim = c.linear_value_head_dim;
  s.key_head_dim = c.linear_key_head_dim;
  s.kv_dtype = ops_.kv_dtype();
  return s;
}

ModelCache Model::make_cache(int64_t num_blocks, int32_t block_size, int64_t num_slots) const {
  return ModelCache(ops_, cache_shape(), num_blocks, block_size, num_slots);
}

ModelCache Runner::cache_for(int64_t tokens, int64_t sequences) const {
  constexpr int32_t kBlock = 16;
  return make_cache(sequences * ((tokens + kBlock - 1) / kBlock + 1), kBlock, sequences);
}

Tensor Model::forward(const Batch& batch, ModelCache& cache,
                      const std::function<void(const std::string&, const Tensor&)>& dump) {
  const io::TextConfig& c = config_;
  // Batch bookkeeping: the flat token list, positions, and each sequence's cache layout.
  layers::ForwardContext ctx{ops_, cache, {}, {}};
  AttentionLayout& layout = ctx.attention;
  layout.block_size = cache.block_size();
  layout.seqs.cu_seqlens.push_back(0);
  std::vector<int32_t> tokens;
  bool decode = !dump && batch.may_record;  // one token and one logits row per sequence
  for (const Batch::Sequence& s : batch.sequences) {
    QINFER_CHECK(!s.tokens.empty() && s.cache != nullptr, "forward: every sequence needs tokens and a cache");
    for (int32_t t : s.tokens)
      QINFER_CHECK(t >= 0 && t < c.vocab_size, "token id {} is outside the vocabulary (0..{})", t, c.vocab_size - 1);
    check_room(cache, *s.cache, static_cast<int64_t>(s.tokens.size()), s.state_to, s.snapshot_to);
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    layout.seqs.cu_seqlens.push_back(static_cast<int32_t>(tokens.size()));
    layout.seqs.state_slot.push_back(s.cache->slot);
    layout.seqs.state_to.push_back(s.state_to >= 0 ? s.state_to : s.cache->slot);
    layout.seqs.snapshot_at.push_back(s.snapshot_to >= 0 ? s.snapshot_at : 0);
    layout.seqs.snapshot_to.push_back(s.snapshot_to);
    layout.cached.push_back(s.cache->cached);
    layout.max_blocks = std::max<int32_t>(layout.max_blocks, static_cast<int32_t>(s.cache->blocks.size()));
    decode = decode && s.tokens.size() == 1 && !s.all_logits;
  }
  // Decode steps repeat their shape, and the backend may record and replay them (Ops::begin_step).
  // The block table widens in powers of two so that a growing context changes the shape only at
  // doublings. A tensor-parallel rank records its collectives with the step (every rank records
  // and replays the same steps, as every rank sees the same batches).
  std::string step_key;
  if (decode) {
    int32_t width = batch.block_table_width;
    QINFER_CHECK(width == 0 || width >= layout.max_blocks, "forward: a sequence holds {} blocks, past the batch's block "
                 "table width {}", layout.max_blocks, width);
    if (width == 0) {
      width = 8;
      while (width < layout.max_blocks) width *= 2;
    }
    layout.max_blocks = width;
    step_key = fmt::format("cache {}: decode {} sequences, {} blocks", cache.id(), batch.sequences.size(), width);
  }
  layout.block_table.assign(batch.sequences.size() * static_cast<size_t>(layout.max_blocks), -1);
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const std::vector<int32_t>& blocks = batch.sequences[i].cache->blocks;
    std::copy(blocks.begin(), blocks.end(), layout.block_table.begin() + static_cast<std::ptrdiff_t>(i * layout.max_blocks));
  }
  if (step_key.empty()) return run(batch, tokens, ctx, dump);
  ops_.begin_step(step_key);
  Tensor logits;
  try {
    logits = run(batch, tokens, ctx, dump);
  } catch (...) {
    ops_.abort_step();
    throw;
  }
  return ops_.end_step(std::move(logits));
}

// Every block ends in a row-parallel projection (o_proj, out_proj, down_proj; the MoE's experts and
// its shared expert, whose sigmoid gate is computed whole on every rank, so gate·Σ partials = Σ
// gate·partials): one sum over the ranks per block.
void Model::reduce(Tensor& partial) const {
  if (shard_.size > 1) communicator_->all_reduce_sum(ops_, partial);
}

// The decoder over a prepared batch. Every device tensor it makes is gone when it returns, except
// the logits (a recorded step must free what it allocates before it ends).
Tensor Model::run(const Batch& batch, const std::vector<int32_t>& tokens, layers::ForwardContext& ctx,
                  const std::function<void(const std::string&, const Tensor&)>& dump) {
  const io::TextConfig& c = config_;
  AttentionLayout& layout = ctx.attention;
  const int64_t T = static_cast<int64_t>(tokens.size());
  // Text positions: all three MRoPE rows equal to the token's index in its sequence.
  Tensor positions = host_tensor(DType::i32, {3, T});
  Tensor ids_host = host_tensor(DType::i32, {T});
  for (size_t s = 0; s < batch.sequences.size(); ++s)
    for (int32_t i = layout.seqs.cu_seqlens[s]; i < layout.seqs.cu_seqlens[s + 1]; ++i)
      for (int axis = 0; axis < 3; ++axis)
        positions.ptr<int32_t>()[axis * T + i] = layout.cached[s] + (i - layout.seqs.cu_seqlens[s]);
  std::copy(tokens.begin(), tokens.end(), ids_host.ptr<int32_t>());
  const Tensor ids = to_backend(ops_, ids_host);
  ctx.positions = to_backend(ops_, positions);
  ctx.dump = dump;
  struct DropPositions {  // ctx outlives this call; its device positions must not
    layers::ForwardContext& ctx;
    ~DropPositions() { ctx.positions = Tensor(); }
  } drop_positions{ctx};

  // The decoder, as in the HF modeling files.
  Tensor h = ctx.alloc({T, c.hidden_size});
  ops_.embedding(ids, embed_tokens, h);
  Tensor normed = ctx.alloc({T, c.hidden_size}), delta = ctx.alloc({T, c.hidden_size});
  const float eps = static_cast<float>(c.rms_norm_eps);
  ctx.named("model.embed_tokens", h);
  if (!layers_.empty()) ops_.rms_norm(h, layers_[0].input_norm, eps, normed);
  // Each residual add is fused with the norm that follows it (the next layer's input norm after
  // the mlp); the last one stands alone, the final norm taking only the selected rows. Where the
  // next block reads its input first and only through one projection op (attention's q/k/v, the
  // dense MLP's gate/up), the add and norm are left to that op (ForwardContext::PendingNorm).
  auto add_norm = [&](const Tensor& w, bool next_takes_it) {
    if (next_takes_it && !ctx.dump) {
      ctx.pending_norm.emplace(layers::ForwardContext::PendingNorm{h, delta, w, eps, normed});
    } else {
      ops_.add_rms_norm(h, delta, w, eps, normed);
    }
  };
  auto forward = [&](const auto& block) {
    std::visit([&](const auto& b) { b.forward(ctx, normed, delta); }, block);
    QINFER_CHECK(!ctx.pending_norm, "forward: a layer left its input's add and norm undone");
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    const DecoderLayer& layer = layers_[i];
    const std::string name = ctx.dump ? fmt::format("model.layers.{}", i) : std::string();
    forward(layer.mixer);
    reduce(delta);
    ctx.named(name, ".mixer", delta);
    add_norm(layer.post_attention_norm, std::holds_alternative<layers::Mlp>(layer.ffn));
    forward(layer.ffn);
    reduce(delta);
    ctx.named(name, ".mlp", delta);
    if (i + 1 < layers_.size())
      add_norm(layers_[i + 1].input_norm, std::holds_alternative<layers::Attention>(layers_[i + 1].mixer));
    else ops_.add(h, delta);
    ctx.named(name, h);
  }

  // Logits only for the rows asked for.
  std::vector<int64_t> rows;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const int32_t begin = layout.seqs.cu_seqlens[s], end = layout.seqs.cu_seqlens[s + 1];
    for (int32_t i = batch.sequences[s].all_logits ? begin : end - 1; i < end; ++i) rows.push_back(i);
  }
  Tensor selected = ctx.alloc({static_cast<int64_t>(rows.size()), c.hidden_size});
  for (size_t r = 0; r < rows.size(); ++r) {
    Tensor dst = selected.rows(static_cast<int64_t>(r), static_cast<int64_t>(r) + 1);
    ops_.copy_columns(h.rows(rows[r], rows[r] + 1), 0, dst, 0, c.hidden_size);
  }
  ops_.rms_norm(selected, final_norm, eps, selected);
  ctx.named("model.norm", selected);
  Tensor logits = ctx.alloc({static_cast<int64_t>(rows.size()), c.vocab_size});
  ops_.linear(selected, lm_head, logits);
  ctx.named("logits", logits);

  for (const Batch::Sequence& s : batch.sequences) {
    s.cache->cached += static_cast<int32_t>(s.tokens.size());
    if (s.state_to >= 0) s.cache->slot = s.state_to;
  }
  return logits;
}

}  // namespace qinfer::models
