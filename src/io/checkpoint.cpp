#include "io/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace qinfer::io {
namespace {

struct PrefixRule {
  std::string_view from, to;
  TensorGroup group;
  bool vlm_only;
};

// First match wins, so the longer VLM prefixes come before the generic ones.
constexpr PrefixRule kPrefixRules[] = {
    {"model.language_model.", "model.", TensorGroup::text, true},
    {"language_model.model.", "model.", TensorGroup::text, true},
    {"language_model.lm_head.", "lm_head.", TensorGroup::text, true},
    {"language_model.mtp.", "mtp.", TensorGroup::mtp, true},
    {"model.visual.", "visual.", TensorGroup::vision, true},
    {"vision_tower.", "visual.", TensorGroup::vision, true},
    {"model.mtp.", "mtp.", TensorGroup::mtp, false},
    {"mtp.", "mtp.", TensorGroup::mtp, false},
    {"model.", "model.", TensorGroup::text, false},
    {"lm_head.", "lm_head.", TensorGroup::text, false},
    // Qwen3-Embedding checkpoints store the bare backbone without the `model.` prefix.
    {"layers.", "model.layers.", TensorGroup::text, false},
    {"embed_tokens.", "model.embed_tokens.", TensorGroup::text, false},
    {"norm.", "model.norm.", TensorGroup::text, false},
};

constexpr std::string_view kZeroCentredSuffixes[] = {
    ".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight",
};
constexpr std::string_view kZeroCentredNames[] = {
    "model.norm.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
};

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

bool ends_with(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

std::string config_label(const ModelConfig& config) {
  return config.file.empty() ? std::string("config.json") : config.file.string();
}

// "a.b.mlp.experts.3.gate_proj.weight" -> {"a.b.mlp.experts", 3, "gate_proj.weight"}
struct ExpertName {
  std::string base;  // up to and including "experts"
  int64_t index;
  std::string rest;
};
std::optional<ExpertName> parse_expert(const std::string& name) {
  static constexpr std::string_view kMarker = ".mlp.experts.";
  size_t at = name.find(kMarker);
  if (at == std::string::npos) return std::nullopt;
  size_t begin = at + kMarker.size();
  size_t end = begin;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == begin || end >= name.size() || name[end] != '.' || end - begin > 9) return std::nullopt;
  return ExpertName{name.substr(0, begin - 1), std::stoll(name.substr(begin, end - begin)), name.substr(end + 1)};
}

struct Entry {
  std::string canonical;
  TensorGroup group;
  const StoredTensor* stored;
  std::string source;
};

class PlanBuilder {
 public:
  explicit PlanBuilder(const TensorStore& store) : store_(store) {}

  NormalizationPlan plan;

  void add(CanonicalTensor tensor) {
    const std::string name = tensor.name;
    auto [it, inserted] = plan.tensors.emplace(name, std::move(tensor));
    QINFER_CHECK(inserted, "{}: tensors {} and {} both map to canonical name '{}'", store_.dir().string(),
                 fmt::join(it->second.sources, ", "), fmt::join(tensor.sources, ", "), name);
  }

  CanonicalTensor whole(const Entry& e) const {
    CanonicalTensor t;
    t.name = e.canonical;
    t.group = e.group;
    t.dtype = e.stored->info->dtype;
    t.shape = e.stored->info->shape;
    t.pieces = {Piece{e.stored, 0, e.stored->info->nbytes}};
    t.sources = {e.source};
    return t;
  }

  // Per-expert tensors `experts.{e}.X` stacked into `experts.X` with a leading expert axis.
  void stack_experts(const std::string& canonical, TensorGroup group, std::map<int64_t, const Entry*>& experts) {
    const Entry& first = *experts.begin()->second;
    const int64_t count = static_cast<int64_t>(experts.size());
    QINFER_CHECK(experts.begin()->first == 0 && experts.rbegin()->first == count - 1,
                 "{}: per-expert tensors for '{}' are not numbered 0..{} (found {} experts, highest index {})",
                 store_.dir().string(), canonical, count - 1, count, experts.rbegin()->first);
    CanonicalTensor t;
    t.name = canonical;
    t.group = group;
    t.dtype = first.stored->info->dtype;
    t.shape = first.stored->info->shape;
    t.shape.insert(t.shape.begin(), count);
    for (const auto& [index, entry] : experts) {
      const TensorInfo& info = *entry->stored->info;
      QINFER_CHECK(info.dtype == t.dtype && info.shape == first.stored->info->shape,
                   "{}: expert tensor {} is {} {} but {} is {} {}", store_.dir().string(), entry->source,
                   name(info.dtype), shape_str(info.shape), first.source, name(t.dtype),
                   shape_str(first.stored->info->shape));
      t.pieces.push_back(Piece{entry->stored, 0, info.nbytes});
      t.sources.push_back(entry->source);
    }
    t.how = fmt::format("stacked from {} per-expert tensors", count);
    add(std::move(t));
  }

  // HF fused `experts.gate_up_proj` [E, 2I, H]: gate rows first, then up rows, per expert.
  void split_gate_up(const Entry& e, const std::string& base) {
    const TensorInfo& info = *e.stored->info;
    QINFER_CHECK(info.shape.size() == 3 && info.shape[1] % 2 == 0,
                 "{}: tensor '{}' has shape {}, expected [experts, 2 x moe_intermediate_size, hidden_size]",
                 e.stored->file->path().string(), e.source, shape_str(info.shape));
    const uint64_t expert_bytes = info.nbytes / static_cast<uint64_t>(info.shape[0]);
    for (int half = 0; half < 2; ++half) {
      CanonicalTensor t;
      t.name = base + (half == 0 ? ".gate_proj.weight" : ".up_proj.weight");
      t.group = e.group;
      t.dtype = info.dtype;
      t.shape = {info.shape[0], info.shape[1] / 2, info.shape[2]};
      for (int64_t x = 0; x < info.shape[0]; ++x)
        t.pieces.push_back(Piece{e.stored, static_cast<uint64_t>(x) * expert_bytes + half * expert_bytes / 2,
                                 expert_bytes / 2});
      t.sources = {e.source};
      t.how = half == 0 ? "gate half of fused gate_up_proj" : "up half of fused gate_up_proj";
      add(std::move(t));
    }
  }

 private:
  const TensorStore& store_;
};

double mean_of(const CanonicalTensor& t) {
  std::vector<float> values = t.read_f32();
  // A NaN would decide the norm layout below by accident; name the tensor instead.
  if (const auto at = first_non_finite(DType::f32, values.data(), values.size()))
    fail("{}: tensor '{}' holds {} at element {}: non-finite weights make the output garbage (a corrupt download "
         "or a broken conversion)",
         t.pieces.front().source->file->path().string(), t.sources.front(), values[*at], *at);
  if (values.empty()) return 0.0;
  double sum = 0.0;
  for (float v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// Decides whether zero-centred norm gains are stored as γ−1. The artifact's layout decides (raw HF
// conv1d [C,1,K] => γ−1); the stored values cross-check it, since a wrong +1 silently corrupts a model.
void decide_norm_shift(NormalizationPlan& plan, std::optional<bool> hf_conv_layout, const std::string& label) {
  std::vector<CanonicalTensor*> norms;
  for (auto& [name, t] : plan.tensors)
    if (t.group == TensorGroup::text && is_zero_centred_norm(name) && t.shape.size() == 1) norms.push_back(&t);
  if (norms.empty()) return;
  double sum = 0.0;
  for (const CanonicalTensor* t : norms) sum += mean_of(*t);
  const double mean = sum / static_cast<double>(norms.size());
  const bool values_say_raw = std::abs(mean) < std::abs(mean - 1.0);
  if (!hf_conv_layout) {
    plan.shift_norms = values_say_raw;
    plan.shift_reason = fmt::format(
        "no conv1d layout to decide by; the {} zero-centred text norm gains average {:.4f}, so they are stored as {}",
        norms.size(), mean, values_say_raw ? "γ−1 (+1 due)" : "γ (no shift)");
  } else {
    const bool layout_says_raw = *hf_conv_layout;
    QINFER_CHECK(layout_says_raw == values_say_raw,
                 "{}: cannot tell how zero-centred norm gains are stored: the conv1d layout is {} , which means "
                 "{}, but the {} text norm gains average {:.4f}, which looks like {}. Refusing to guess: a wrong +1 "
                 "corrupts the model silently. Check that the checkpoint was converted by one tool, once.",
                 label, layout_says_raw ? "[C, 1, K] (raw HF)" : "[C, K, 1] (MLX-converted)",
                 layout_says_raw ? "gains stored as γ−1 with +1 due" : "gains already stored as γ", norms.size(), mean,
                 values_say_raw ? "γ−1" : "γ");
    plan.shift_norms = layout_says_raw;
    plan.shift_reason =
        fmt::format("conv1d layout {} => {}; cross-checked: the {} text norm gains average {:.4f}",
                    layout_says_raw ? "[C, 1, K] (raw HF)" : "[C, K, 1] (MLX-converted)",
                    layout_says_raw ? "gains stored as γ−1, +1 at load" : "gains stored as γ, no shift",
                    norms.size(), mean);
  }
  if (!plan.shift_norms) return;
  for (auto& [name, t] : plan.tensors)
    if (t.group != TensorGroup::vision && is_zero_centred_norm(name) && t.shape.size() == 1) t.add_one = true;
}

void attach_quantization(NormalizationPlan& plan, const ModelConfig& config, const TensorStore& store) {
  for (auto& [name, t] : plan.tensors) {
    const std::string& source = t.sources.front();
    std::string_view module = source;
    for (std::string_view suffix : {".weight", ".scales", ".biases"}) {
      if (!ends_with(source, suffix)) continue;
      module = std::string_view(source).substr(0, source.size() - suffix.size());
      const std::string module_path(module);
      if (store.find(module_path + ".scales") == nullptr) {
        QINFER_CHECK(t.dtype != DType::u32 || suffix != ".weight",
                     "{}: tensor '{}' is packed uint32 but '{}.scales' is missing", store.dir().string(), source,
                     module_path);
        break;
      }
      QINFER_CHECK(config.quantization.has_value(),
                   "{}: tensor '{}.scales' is stored but config.json has no MLX `quantization` table{}",
                   store.dir().string(), module_path,
                   config.foreign_quantization.empty()
                       ? ""
                       : fmt::format(" (its quantization_config says quant_method '{}')", config.foreign_quantization));
      t.quant = config.quantization->for_module(module_path);
      QINFER_CHECK(t.quant.has_value(),
                   "{}: tensor '{}.scales' is stored but config.json's quantization table says module '{}' is not "
                   "quantized",
                   store.dir().string(), module_path, module_path);
      break;
    }
  }
}

// Why the config expects a per-layer tensor the checkpoint lacks: the layer count, and the layer's kind.
std::string layer_hint(const ModelConfig& config, std::string_view tensor) {
  static constexpr std::string_view kLayers = "model.layers.";
  if (!tensor.starts_with(kLayers)) return "";
  const int64_t layer = std::atoll(std::string(tensor.substr(kLayers.size())).c_str());
  const TextConfig& c = config.text;
  if (layer < 0 || layer >= static_cast<int64_t>(c.layer_types.size())) return "";
  return fmt::format(" ({}: num_hidden_layers is {}; layer {} is {} by layer_types / full_attention_interval)",
                     config_label(config), c.num_hidden_layers, layer, name(c.layer_types[layer]));
}

// A stored shape that disagrees with the config: the first dimension that differs and the field it comes from.
std::string shape_mismatch(const ModelConfig& config, const ExpectedTensor& e, const std::vector<int64_t>& shape) {
  if (shape.size() != e.shape.size() || e.dims.size() != e.shape.size()) return "";
  for (size_t d = 0; d < e.shape.size(); ++d)
    if (shape[d] != e.shape[d])
      return fmt::format(": dimension {} is {}, but {} says {} = {}", d, shape[d], config_label(config), e.dims[d],
                         e.shape[d]);
  return "";
}

void check_quantized(const NormalizationPlan& plan, const ExpectedTensor& e, const CanonicalTensor& weight,
                     const ModelConfig& config, const std::string& label) {
  const QuantSpec& q = *weight.quant;
  const int64_t in = e.shape.back();
  std::vector<int64_t> packed = e.shape;
  packed.back() = in * q.bits / 32;
  QINFER_CHECK(in * q.bits % 32 == 0 && in % q.group_size == 0,
               "{}: tensor '{}' ({}) is quantized {} {}-bit group {}, but its input size {} is not a multiple of the "
               "group size and of 32/bits",
               label, e.name, weight.sources.front(), q.mode, q.bits, q.group_size, in);
  std::vector<int64_t> unpacked = weight.shape;  // the logical shape the stored one stands for
  if (!unpacked.empty()) unpacked.back() = unpacked.back() * 32 / q.bits;
  QINFER_CHECK(weight.dtype == DType::u32 && weight.shape == packed,
               "{}: quantized weight '{}' ({}) is {} {}, expected uint32 {} for logical shape {} at {} bits{}", label,
               e.name, weight.sources.front(), name(weight.dtype), shape_str(weight.shape), shape_str(packed),
               shape_str(e.shape), q.bits, shape_mismatch(config, e, unpacked));
  std::string base = e.name.substr(0, e.name.size() - std::string_view(".weight").size());
  std::vector<int64_t> grouped = e.shape;
  grouped.back() = in / q.group_size;
  const bool affine = q.mode == "affine";
  for (std::string_view part : {".scales", ".biases"}) {
    if (part == ".biases" && !affine) continue;
    const CanonicalTensor* t = plan.find(base + std::string(part));
    QINFER_CHECK(t != nullptr, "{}: quantized weight '{}' has no '{}{}'", label, e.name, base, part);
    const bool dtype_ok = affine ? traits(t->dtype).is_float : t->dtype == DType::u8;
    QINFER_CHECK(dtype_ok && t->shape == grouped, "{}: '{}' ({}) is {} {}, expected {} {}", label, t->name,
                 t->sources.front(), name(t->dtype), shape_str(t->shape), affine ? "a float type" : "uint8",
                 shape_str(grouped));
  }
}

void validate(NormalizationPlan& plan, const std::vector<ExpectedTensor>& expected, const ModelConfig& config,
              const std::string& label) {
  std::set<std::string, std::less<>> known;
  for (const ExpectedTensor& e : expected) {
    known.insert(e.name);
    const CanonicalTensor* t = plan.find(e.name);
    QINFER_CHECK(t != nullptr, "{}: tensor '{}' is missing (expected shape {}){}", label, e.name, shape_str(e.shape),
                 layer_hint(config, e.name));
    if (t->quant && e.quantizable) {
      check_quantized(plan, e, *t, config, label);
      if (e.name.ends_with(".weight")) {
        const std::string base = e.name.substr(0, e.name.size() - 7);
        known.insert(base + ".scales");
        known.insert(base + ".biases");
      }
      continue;
    }
    QINFER_CHECK(!t->quant, "{}: tensor '{}' ({}) is quantized but qinfer expects it unquantized", label, e.name,
                 t->sources.front());
    QINFER_CHECK(traits(t->dtype).is_float, "{}: tensor '{}' ({}) has dtype {}, expected a float type", label, e.name,
                 t->sources.front(), name(t->dtype));
    QINFER_CHECK(t->shape == e.shape, "{}: tensor '{}' ({}) has shape {}, expected {}{}", label, e.name,
                 t->sources.front(), shape_str(t->shape), shape_str(e.shape), shape_mismatch(config, e, t->shape));
  }
  // Tensors the family does not use are reported and left out, as transformers does with a warning.
  for (auto it = plan.tensors.begin(); it != plan.tensors.end();) {
    if (it->second.group != TensorGroup::vision && !known.contains(it->first)) {
      for (const std::string& source : it->second.sources)
        plan.dropped.emplace_back(source, "not a tensor of this model (unused)");
      log_warn("{}: ignoring unexpected tensor '{}'", label, it->second.sources.front());
      it = plan.tensors.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

std::string_view name(Generation generation) { return generation == Generation::hf ? "hf" : "mlx"; }

std::string_view name(TensorGroup group) {
  switch (group) {
    case TensorGroup::text: return "text";
    case TensorGroup::mtp: return "mtp";
    case TensorGroup::vision: return "vision";
  }
  return "?";
}

bool is_zero_centred_norm(std::string_view canonical_name) {
  for (std::string_view n : kZeroCentredNames)
    if (canonical_name == n) return true;
  for (std::string_view s : kZeroCentredSuffixes)
    if (canonical_name.ends_with(s)) return true;
  return false;
}

uint64_t CanonicalTensor::nbytes() const {
  uint64_t total = 0;
  for (const Piece& p : pieces) total += p.nbytes;
  return total;
}

std::vector<std::byte> CanonicalTensor::read_bytes() const {
  std::vector<std::byte> out(nbytes());
  size_t at = 0;
  for (const Piece& p : pieces) {
    std::span<const std::byte> data = p.source->data();
    std::memcpy(out.data() + at, data.data() + p.offset, p.nbytes);
    at += p.nbytes;
  }
  return out;
}

std::vector<std::byte> CanonicalTensor::read_range(uint64_t offset, uint64_t nbytes) const {
  QINFER_CHECK(offset + nbytes <= this->nbytes(), "tensor '{}': byte range [{}, {}) is past its {} bytes", name, offset,
               offset + nbytes, this->nbytes());
  std::vector<std::byte> out(nbytes);
  uint64_t at = 0, piece_start = 0;
  for (const Piece& p : pieces) {
    const uint64_t piece_end = piece_start + p.nbytes;
    const uint64_t begin = std::max(offset, piece_start), end = std::min(offset + nbytes, piece_end);
    if (begin < end) {
      std::memcpy(out.data() + at, p.source->data().data() + p.offset + (begin - piece_start), end - begin);
      at += end - begin;
    }
    piece_start = piece_end;
  }
  return out;
}

std::vector<float> CanonicalTensor::read_f32() const {
  QINFER_CHECK(traits(dtype).is_float, "tensor '{}' has dtype {}, which has no float values", name, qinfer::name(dtype));
  uint64_t count = 1;
  for (int64_t d : shape) count *= static_cast<uint64_t>(d);
  std::vector<std::byte> bytes = read_bytes();
  std::vector<float> out(count);
  convert_to_f32(dtype, bytes.data(), out.data(), count);
  if (add_one)
    for (float& v : out) v += 1.0f;
  return out;
}

const CanonicalTensor* NormalizationPlan::find(std::string_view name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const CanonicalTensor& NormalizationPlan::at(std::string_view name) const {
  const CanonicalTensor* t = find(name);
  QINFER_CHECK(t != nullptr, "no tensor '{}' in the normalized checkpoint", name);
  return *t;
}

size_t NormalizationPlan::count(TensorGroup group) const {
  return static_cast<size_t>(
      std::count_if(tensors.begin(), tensors.end(), [&](const auto& kv) { return kv.second.group == group; }));
}

NormalizationPlan normalize_checkpoint(const ModelConfig& config, const TensorStore& store, const SanitizeRules& rules) {
  const std::string label = store.dir().string();
  PlanBuilder builder(store);
  NormalizationPlan& plan = builder.plan;
  plan.zero_centred_norms = rules.zero_centred_norms;

  // 1. Names onto the canonical prefixes.
  std::vector<Entry> entries;
  std::set<std::string> renames;
  bool mlx_evidence = false;
  for (const auto& [source, stored] : store.tensors()) {
    const PrefixRule* rule = nullptr;
    for (const PrefixRule& r : kPrefixRules) {
      if ((!r.vlm_only || rules.vlm_naming) && std::string_view(source).starts_with(r.from)) {
        rule = &r;
        break;
      }
    }
    if (rule == nullptr) {
      plan.dropped.emplace_back(source, "outside this family's name space");
      log_warn("{}: ignoring tensor '{}' (outside this family's name space)", label, source);
      continue;
    }
    if (rule->from != rule->to) renames.insert(fmt::format("{}* -> {}*", rule->from, rule->to));
    if (rule->from.starts_with("language_model.") || rule->from == "vision_tower.") mlx_evidence = true;
    if (source.ends_with(".scales")) mlx_evidence = true;
    entries.push_back(Entry{std::string(rule->to) + source.substr(rule->from.size()), rule->group, &stored, source});
  }
  plan.renames.assign(renames.begin(), renames.end());

  // 2. Layout fixes: experts, conv1d; everything else is a plain rename.
  std::map<std::pair<std::string, TensorGroup>, std::map<int64_t, const Entry*>> per_expert;
  std::optional<bool> hf_conv_layout;
  for (const Entry& e : entries) {
    const TensorInfo& info = *e.stored->info;
    if (e.group == TensorGroup::vision) {
      builder.add(builder.whole(e));
      continue;
    }
    if (auto expert = parse_expert(e.canonical)) {
      auto& slot = per_expert[{expert->base + "." + expert->rest, e.group}];
      slot[expert->index] = &e;
      continue;
    }
    if (e.canonical.ends_with(".mlp.experts.gate_up_proj")) {
      builder.split_gate_up(e, e.canonical.substr(0, e.canonical.size() - std::string_view(".gate_up_proj").size()));
      continue;
    }
    if (e.canonical.ends_with(".mlp.experts.down_proj")) {
      CanonicalTensor t = builder.whole(e);
      t.name += ".weight";
      builder.add(std::move(t));
      continue;
    }
    if (auto at = e.canonical.find(".mlp.switch_mlp."); at != std::string::npos) {
      CanonicalTensor t = builder.whole(e);
      t.name = e.canonical.substr(0, at) + ".mlp.experts." + e.canonical.substr(at + 16);
      mlx_evidence = true;
      builder.add(std::move(t));
      continue;
    }
    if (e.canonical.ends_with(".conv1d.weight") && info.shape.size() == 3) {
      // [C,1,K] (HF) and [C,K,1] (MLX) hold the same bytes: both are [C,K] row-major.
      const bool hf = info.shape[1] == 1 && info.shape[2] != 1;
      const bool mlx = info.shape[2] == 1 && info.shape[1] != 1;
      QINFER_CHECK(hf || mlx || (info.shape[1] == 1 && info.shape[2] == 1),
                   "{}: conv1d weight '{}' has shape {}, expected [channels, 1, kernel] or [channels, kernel, 1]",
                   e.stored->file->path().string(), e.source, shape_str(info.shape));
      if (hf || mlx) {
        QINFER_CHECK(!hf_conv_layout || *hf_conv_layout == hf,
                     "{}: conv1d weights mix the HF [C,1,K] and MLX [C,K,1] layouts (e.g. '{}')", label, e.source);
        hf_conv_layout = hf;
        if (mlx) mlx_evidence = true;
      }
      CanonicalTensor t = builder.whole(e);
      t.shape = {info.shape[0], hf ? info.shape[2] : info.shape[1]};
      t.how = fmt::format("conv1d {} -> [C, K]", shape_str(info.shape));
      builder.add(std::move(t));
      continue;
    }
    builder.add(builder.whole(e));
  }
  for (auto& [key, experts] : per_expert) builder.stack_experts(key.first, key.second, experts);
  plan.generation = mlx_evidence ? Generation::mlx : Generation::hf;

  // 3. The head: tied models read the embedding.
  if (config.text.tie_word_embeddings) {
    if (const CanonicalTensor* head = plan.find("lm_head.weight")) {
      for (const std::string& source : head->sources) plan.dropped.emplace_back(source, "tied to the embedding");
      plan.tensors.erase("lm_head.weight");
      plan.tensors.erase("lm_head.scales");
      plan.tensors.erase("lm_head.biases");
    }
  }

  // 4. Quantization, norm gains, and the family's expectations.
  attach_quantization(plan, config, store);
  if (rules.zero_centred_norms) decide_norm_shift(plan, hf_conv_layout, label);
  bool with_mtp = plan.count(TensorGroup::mtp) > 0;
  if (rules.expected) validate(plan, rules.expected(config.text, with_mtp), config, label);
  return plan;
}

}  // namespace qinfer::io
