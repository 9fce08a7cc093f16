// `qinfer inspect DIR`: what a checkpoint is and how qinfer will read it, without loading weights.
#include <fmt/format.h>

#include <map>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/progress.h"
#include "models/registry.h"

namespace qinfer::cli {
namespace {

using io::json;

std::string spec_str(const io::QuantSpec& q) { return fmt::format("{} {}-bit group {}", q.mode, q.bits, q.group_size); }

json describe(const models::Checkpoint& ck, bool with_tensors) {
  const io::ModelConfig& c = ck.config;
  const io::NormalizationPlan& plan = ck.plan;
  json out = json::object();
  out["path"] = ck.store.dir().string();
  out["family"] = std::string(ck.family->name);
  out["model_type"] = c.model_type;
  out["text_model_type"] = c.text.model_type;
  out["generation"] = plan.generation == io::Generation::hf ? "HF" : "MLX-converted";

  // What this checkpoint can do: the family's capabilities, where the tensors for them are present.
  const models::Capabilities caps = ck.family->capabilities(c);
  json cap = json::array();
  if (caps.recurrent_state) cap.push_back("recurrent-state");
  if (caps.moe) cap.push_back("moe");
  if (caps.vision && plan.count(io::TensorGroup::vision) > 0) cap.push_back("vision");
  if (caps.mtp && plan.count(io::TensorGroup::mtp) > 0) cap.push_back("mtp");
  if (!caps.embedding_terminator.empty()) cap.push_back(fmt::format("embedding({})", caps.embedding_terminator));
  out["capabilities"] = cap;

  int64_t linear = 0, moe = 0;
  for (int64_t i = 0; i < c.text.num_hidden_layers; ++i) {
    linear += c.text.layer_types[i] == io::LayerKind::linear_attention;
    moe += c.text.is_moe_layer(i);
  }
  out["layers"] = {{"total", c.text.num_hidden_layers}, {"linear_attention", linear},
                   {"full_attention", c.text.num_hidden_layers - linear}, {"moe", moe},
                   {"mtp", c.text.mtp_num_hidden_layers}};
  out["dims"] = {{"hidden", c.text.hidden_size}, {"heads", c.text.num_attention_heads},
                 {"kv_heads", c.text.num_key_value_heads}, {"head_dim", c.text.head_dim},
                 {"vocab", c.text.vocab_size}, {"experts", c.text.num_experts},
                 {"tied_embeddings", c.text.tie_word_embeddings}};

  json quant = json::object();
  if (c.quantization) {
    quant["format"] = "mlx";
    quant["global"] = spec_str(c.quantization->global);
    quant["overrides"] = c.quantization->overrides.size();
    std::map<std::string, int> by_spec;
    for (const auto& [name, t] : plan.tensors)
      if (t.quant && name.ends_with(".weight")) ++by_spec[spec_str(*t.quant)];
    quant["weights"] = by_spec;
  } else if (!c.foreign_quantization.empty()) {
    quant["format"] = c.foreign_quantization;
  } else {
    quant["format"] = "none";
  }
  out["quantization"] = quant;

  uint64_t stored_bytes = ck.store.total_bytes();
  out["stored"] = {{"tensors", ck.store.tensors().size()}, {"bytes", stored_bytes}, {"files", ck.store.files().size()}};
  out["canonical"] = {{"text", plan.count(io::TensorGroup::text)}, {"mtp", plan.count(io::TensorGroup::mtp)},
                      {"vision", plan.count(io::TensorGroup::vision)}};

  json p = json::object();
  p["renames"] = plan.renames;
  p["zero_centred_norms"] = plan.zero_centred_norms;
  p["shift_norms"] = plan.shift_norms;
  p["shift_reason"] = plan.shift_reason;
  json shifted = json::array(), reshaped = json::array();
  for (const auto& [name, t] : plan.tensors) {
    if (t.add_one) shifted.push_back(name);
    if (!t.how.empty()) reshaped.push_back({{"tensor", name}, {"how", t.how}});
  }
  p["shifted"] = shifted;
  p["layout"] = reshaped;
  json dropped = json::array();
  for (const auto& [source, why] : plan.dropped) dropped.push_back({{"tensor", source}, {"why", why}});
  p["dropped"] = dropped;
  out["plan"] = p;

  if (with_tensors) {
    json list = json::array();
    for (const auto& [name, t] : plan.tensors) {
      json row = {{"name", name}, {"group", std::string(io::name(t.group))}, {"dtype", std::string(qinfer::name(t.dtype))},
                  {"shape", t.shape}, {"sources", t.sources}};
      if (t.add_one) row["add_one"] = true;
      if (t.quant) row["quant"] = spec_str(*t.quant);
      list.push_back(row);
    }
    out["tensors"] = list;
  }
  return out;
}

void print_human(const json& d, bool with_tensors) {
  fmt::print("checkpoint    {}\n", d["path"].get<std::string>());
  fmt::print("family        {} (model_type {}, text {})\n", d["family"].get<std::string>(),
             d["model_type"].get<std::string>(), d["text_model_type"].get<std::string>());
  fmt::print("capabilities  {}\n", d["capabilities"].empty() ? "-" : fmt::format("{}", fmt::join(d["capabilities"].get<std::vector<std::string>>(), ", ")));
  fmt::print("generation    {}\n", d["generation"].get<std::string>());
  const json& l = d["layers"];
  fmt::print("layers        {} ({} linear attention, {} full attention, {} MoE; {} MTP)\n", l["total"].get<int64_t>(),
             l["linear_attention"].get<int64_t>(), l["full_attention"].get<int64_t>(), l["moe"].get<int64_t>(),
             l["mtp"].get<int64_t>());
  const json& q = d["quantization"];
  std::string quant = q["format"].get<std::string>();
  if (q.contains("global")) {
    quant = fmt::format("MLX, default {}, {} per-module overrides;", q["global"].get<std::string>(),
                        q["overrides"].get<size_t>());
    for (const auto& [spec, n] : q["weights"].items()) quant += fmt::format(" {} x {}", n.get<int>(), spec);
  }
  fmt::print("quantization  {}\n", quant);
  const json& s = d["stored"];
  fmt::print("stored        {} tensors in {} file(s), {}\n", s["tensors"].get<size_t>(), s["files"].get<size_t>(),
             format_bytes(s["bytes"].get<uint64_t>()));
  const json& k = d["canonical"];
  fmt::print("canonical     {} text, {} mtp (kept for drafting), {} vision (set aside for the vision tower)\n",
             k["text"].get<size_t>(), k["mtp"].get<size_t>(), k["vision"].get<size_t>());
  const json& p = d["plan"];
  fmt::print("normalization plan\n");
  if (p["renames"].empty()) fmt::print("  renames     none (names already canonical)\n");
  for (const auto& r : p["renames"]) fmt::print("  rename      {}\n", r.get<std::string>());
  if (p["zero_centred_norms"].get<bool>())
    fmt::print("  norm gains  {}: {}\n",
               p["shift_norms"].get<bool>() ? fmt::format("+1 on {} zero-centred gains", p["shifted"].size())
                                            : std::string("no shift"),
               p["shift_reason"].get<std::string>());
  std::map<std::string, int> layout_counts;
  for (const auto& row : p["layout"]) ++layout_counts[row["how"].get<std::string>()];
  for (const auto& [how, n] : layout_counts) fmt::print("  layout      {} x {}\n", n, how);
  for (const auto& row : p["dropped"])
    fmt::print("  dropped     {} ({})\n", row["tensor"].get<std::string>(), row["why"].get<std::string>());
  if (with_tensors) {
    fmt::print("tensors\n");
    for (const auto& t : d["tensors"]) {
      fmt::print("  {:<56} {:<6} {:<5} {:<18} <- {}{}{}\n", t["name"].get<std::string>(),
                 t["group"].get<std::string>(), t["dtype"].get<std::string>(),
                 fmt::format("{}", t["shape"].dump()), fmt::join(t["sources"].get<std::vector<std::string>>(), ", "),
                 t.contains("add_one") ? "  (+1)" : "",
                 t.contains("quant") ? "  [" + t["quant"].get<std::string>() + "]" : "");
    }
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  struct Options {
    std::string dir;
    bool json = false;
    bool tensors = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("inspect", "Describe a checkpoint: family, generation, quantization, tensors and "
                                                "the normalization plan (no weights are loaded)");
  cmd->add_option("dir", options->dir, "checkpoint folder (config.json + safetensors), or a Hugging Face name "
                  "org/name[@revision]")->required();
  add_hub_flags(cmd);
  cmd->add_flag("--json", options->json, "print a JSON document instead of text");
  cmd->add_flag("--tensors", options->tensors, "list every canonical tensor and where it comes from");
  cmd->callback([options] {
    models::Checkpoint ck = models::open_checkpoint(model_folder(options->dir));
    json d = describe(ck, options->tensors);
    if (options->json) fmt::print("{}\n", d.dump(2));
    else print_human(d, options->tensors);
  });
}

}  // namespace qinfer::cli
