#include "models/quantize.h"

#include <fmt/format.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/safetensors_writer.h"
#include "layers/weights.h"
#include "models/registry.h"

namespace qinfer::models {
namespace {

namespace fs = std::filesystem;

// Canonical name -> the name mlx-lm's convert writes.
std::string mlx_name(std::string name, bool vlm) {
  if (auto at = name.find(".mlp.experts."); at != std::string::npos) name.replace(at, 13, ".mlp.switch_mlp.");
  if (!vlm) return name;
  if (name.starts_with("model.")) return "language_model." + name;
  if (name.starts_with("lm_head.") || name.starts_with("mtp.")) return "language_model." + name;
  if (name.starts_with("visual.")) return "vision_tower." + name.substr(7);
  return name;
}

int layer_index(const std::string& name) {
  static constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  return std::stoi(name.substr(kPrefix.size()));
}

// mlx-lm's mixed recipes: more bits for v_proj / down_proj in the first and last eighth of the layers
// and every third layer between, and for lm_head.
std::optional<std::pair<int, int>> recipe_bits(const std::string& recipe) {
  if (recipe.empty()) return std::nullopt;
  if (recipe == "mixed_2_6") return std::pair{2, 6};
  if (recipe == "mixed_3_4") return std::pair{3, 4};
  if (recipe == "mixed_3_6") return std::pair{3, 6};
  if (recipe == "mixed_4_6") return std::pair{4, 6};
  fail("--recipe {}: expected mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6", recipe);
}

struct Output {
  const io::CanonicalTensor* source;
  std::string name;  // MLX module path + ".weight" (or the plain tensor name)
  std::optional<quant::Layout> layout;
  std::vector<int64_t> shape;  // stored shape of the kept tensor
  DType dtype = DType::bf16;
  bool channels_last = false;  // patch_embed conv3d moved to MLX's channels-last layout
  uint64_t bytes() const {
    uint64_t n = 1;
    for (int64_t d : source->shape) n *= static_cast<uint64_t>(d);
    if (!layout) return storage_bytes(dtype, n);
    const uint64_t groups = n / static_cast<uint64_t>(layout->group_size);
    const bool affine = layout->mode == quant::Mode::affine;
    return n * layout->bits / 8 + groups * (affine ? 4 : 1);
  }
};

std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t last) {
  shape.back() = last;
  return shape;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// A weight that is not finite quantizes into scales that are not either: refused, naming it, as the
// loader refuses it. `first`: the element `data` starts at.
void check_finite(const io::CanonicalTensor& t, DType dtype, const void* data, uint64_t count, uint64_t first = 0) {
  if (!traits(dtype).is_float) return;
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(data), storage_bytes(dtype, count));
  layers::check_finite(t, dtype, std::span(&bytes, 1), false, "", first);
}

// Streams one output (its declared tensors, in order) into the shard writer.
void write_output(io::SafetensorsWriter& writer, const Output& o, ThreadPool& pool, ProgressBar& progress) {
  const io::CanonicalTensor& t = *o.source;
  if (!o.layout) {
    if (t.dtype == o.dtype && !t.add_one && !o.channels_last) {
      const std::vector<std::byte> bytes = t.read_bytes();
      check_finite(t, t.dtype, bytes.data(), bytes.size() / storage_bytes(t.dtype, 1));
      writer.write(bytes);
    } else if (o.channels_last) {
      // [out, C, T, h, w] -> [out, T, h, w, C]
      std::vector<float> v = t.read_f32(), moved(v.size());
      check_finite(t, DType::f32, v.data(), v.size());
      const int64_t O = t.shape[0], C = t.shape[1], rest = t.shape[2] * t.shape[3] * t.shape[4];
      for (int64_t a = 0; a < O; ++a)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t r = 0; r < rest; ++r) moved[(a * rest + r) * C + c] = v[(a * C + c) * rest + r];
      const std::vector<uint16_t> bf16 = to_bf16(moved);
      writer.write(std::as_bytes(std::span(bf16)));
    } else {
      const std::vector<float> v = t.read_f32();
      check_finite(t, DType::f32, v.data(), v.size());
      const std::vector<uint16_t> bf16 = to_bf16(v);
      writer.write(std::as_bytes(std::span(bf16)));
    }
    progress.advance(t.nbytes());
    return;
  }
  const quant::Layout& layout = *o.layout;
  const int64_t in = t.shape.back();
  const int64_t rows = [&] {
    int64_t n = 1;
    for (size_t i = 0; i + 1 < t.shape.size(); ++i) n *= t.shape[i];
    return n;
  }();
  const int64_t words = quant::packed_words(in, layout.bits), groups = in / layout.group_size;
  const uint64_t row_bytes = storage_bytes(t.dtype, static_cast<uint64_t>(in));
  const bool affine = layout.mode == quant::Mode::affine;
  std::vector<uint16_t> scales_out(affine ? static_cast<size_t>(rows * groups) : 0);
  std::vector<uint16_t> biases_out(scales_out.size());
  std::vector<uint8_t> scale_codes_out(affine ? 0 : static_cast<size_t>(rows * groups));
  // Chunks of ~16 MiB of source rows, their rows quantized in parallel (each row on its own: the
  // output does not depend on the thread count), written in order.
  const int64_t chunk = std::max<int64_t>(1, (16 << 20) / static_cast<int64_t>(row_bytes));
  std::vector<uint32_t> codes(static_cast<size_t>(chunk * words));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t r1 = std::min(rows, r0 + chunk);
    const std::vector<std::byte> raw = t.read_range(static_cast<uint64_t>(r0) * row_bytes, (r1 - r0) * row_bytes);
    check_finite(t, t.dtype, raw.data(), static_cast<uint64_t>((r1 - r0) * in), static_cast<uint64_t>(r0 * in));
    std::fill(codes.begin(), codes.end(), 0u);
    pool.parallel_for(static_cast<size_t>(r1 - r0), [&](size_t begin, size_t end) {
      std::vector<float> values(static_cast<size_t>(in)), scales(groups), biases(groups);
      std::vector<uint8_t> scale_codes(groups);
      for (size_t i = begin; i < end; ++i) {
        convert_to_f32(t.dtype, raw.data() + i * row_bytes, values.data(), values.size());
        quant::quantize_row(layout, values.data(), in, codes.data() + i * words, scales.data(), biases.data(),
                            scale_codes.data());
        const size_t at = (static_cast<size_t>(r0) + i) * groups;
        for (int64_t g = 0; g < groups; ++g) {
          if (affine) {
            scales_out[at + g] = f32_to_bf16(scales[g]);
            biases_out[at + g] = f32_to_bf16(biases[g]);
          } else {
            scale_codes_out[at + g] = scale_codes[g];
          }
        }
      }
    });
    writer.write(std::as_bytes(std::span(codes.data(), static_cast<size_t>((r1 - r0) * words))));
    progress.advance((r1 - r0) * row_bytes);
  }
  if (affine) {
    writer.write(std::as_bytes(std::span(scales_out)));
    writer.write(std::as_bytes(std::span(biases_out)));
  } else {
    writer.write(std::as_bytes(std::span(scale_codes_out)));
  }
}

std::vector<io::TensorDeclaration> declarations(const Output& o) {
  const std::string base = o.name.ends_with(".weight") ? o.name.substr(0, o.name.size() - 7) : o.name;
  if (!o.layout) return {{o.name, o.dtype, o.shape}};
  const std::vector<int64_t>& s = o.source->shape;
  const int64_t in = s.back();
  const bool affine = o.layout->mode == quant::Mode::affine;
  std::vector<io::TensorDeclaration> d = {
      {o.name, DType::u32, with_last(s, quant::packed_words(in, o.layout->bits))},
      {base + ".scales", affine ? DType::bf16 : DType::u8, with_last(s, in / o.layout->group_size)}};
  if (affine) d.push_back({base + ".biases", DType::bf16, with_last(s, in / o.layout->group_size)});
  return d;
}

}  // namespace

QuantizeReport quantize_checkpoint(const fs::path& in, const fs::path& out, const QuantizeOptions& options) {
  quant::validate(options.layout);
  const auto recipe = recipe_bits(options.recipe);
  QINFER_CHECK(!recipe || options.layout.mode == quant::Mode::affine, "--recipe works with --mode affine only");
  QINFER_CHECK(fs::absolute(in) != fs::absolute(out), "--out must differ from --model");
  Checkpoint ck = open_checkpoint(in);
  QINFER_CHECK(!ck.config.quantization && ck.config.foreign_quantization.empty(),
               "{}: the checkpoint is already quantized; quantize from its unquantized weights", in.string());
  const bool vlm = ck.family->rules.vlm_naming;
  const io::TextConfig& c = ck.config.text;

  std::set<std::string> quantizable;
  for (const io::ExpectedTensor& e : ck.family->rules.expected(c, ck.plan.count(io::TensorGroup::mtp) > 0))
    if (e.quantizable) quantizable.insert(e.name);

  io::json qconfig = {{"group_size", options.layout.group_size}, {"bits", recipe ? recipe->first : options.layout.bits},
                      {"mode", std::string(quant::traits(options.layout.mode).name)}};
  std::vector<Output> outputs;
  for (const auto& [name, t] : ck.plan.tensors) {
    Output o{&t, mlx_name(name, vlm)};
    const bool eligible = quantizable.contains(name) && t.shape.back() % options.layout.group_size == 0 &&
                          t.group != io::TensorGroup::vision;
    if (eligible) {
      quant::Layout layout = options.layout;
      if (recipe) {
        const int i = layer_index(name), n = static_cast<int>(c.num_hidden_layers);
        const bool more = i >= 0 && (i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2);
        const bool high = name.starts_with("lm_head.") ||
                          (more && (name.find("v_proj") != std::string::npos || name.find("down_proj") != std::string::npos));
        layout.bits = high ? recipe->second : recipe->first;
      }
      // Routers and shared-expert gates stay at 8 bits, as mlx-lm's model predicates keep them.
      if (name.ends_with(".mlp.gate.weight") || name.ends_with(".shared_expert_gate.weight"))
        layout = {quant::Mode::affine, 8, 64};
      const bool differs = layout.mode != options.layout.mode || layout.bits != qconfig["bits"].get<int>() ||
                           layout.group_size != options.layout.group_size;
      if (differs) {
        const std::string module = o.name.substr(0, o.name.size() - 7);
        qconfig[module] = {{"group_size", layout.group_size}, {"bits", layout.bits}};
        if (layout.mode != quant::Mode::affine) qconfig[module]["mode"] = std::string(quant::traits(layout.mode).name);
      }
      QINFER_CHECK(t.shape.back() % layout.group_size == 0, "tensor '{}': input size {} is not a multiple of {}", name,
                   t.shape.back(), layout.group_size);
      o.layout = layout;
    } else {
      o.shape = t.shape;
      // A_log stays in its stored precision (mlx-lm's cast predicate); everything else becomes bf16.
      o.dtype = name.ends_with(".A_log") && traits(t.dtype).is_float ? t.dtype : DType::bf16;
      QINFER_CHECK(traits(t.dtype).is_float, "tensor '{}' has dtype {}, which cannot be converted", name,
                   qinfer::name(t.dtype));
      if (name.ends_with(".conv1d.weight")) o.shape = {t.shape[0], t.shape[1], 1};
      if (name == "visual.patch_embed.proj.weight" && t.shape.size() == 5 && ck.plan.generation == io::Generation::hf) {
        o.channels_last = true;
        o.shape = {t.shape[0], t.shape[2], t.shape[3], t.shape[4], t.shape[1]};
      }
    }
    outputs.push_back(o);
  }

  // Shards by size, each tensor (with its scales / biases) whole in one shard.
  std::vector<std::vector<const Output*>> shards(1);
  uint64_t in_shard = 0, total_in = 0, total_out = 0;
  for (const Output& o : outputs) {
    if (in_shard > 0 && in_shard + o.bytes() > options.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&o);
    in_shard += o.bytes();
    total_in += o.source->nbytes();
    total_out += o.bytes();
  }

  fs::create_directories(out);
  QuantizeReport report;
  report.bytes_in = total_in;
  report.bytes_out = total_out;
  report.shards = static_cast<int>(shards.size());
  io::json weight_map = io::json::object();
  ProgressBar progress("quantizing", total_in, ProgressBar::Unit::bytes);
  // A failure part way (a weight that is not finite, a full disk) leaves no shard behind that a
  // later load could take for a whole model.
  std::vector<fs::path> written;
  auto remove_written = [&] {
    std::error_code ignored;
    for (const fs::path& f : written) fs::remove(f, ignored);
  };
  try {
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string file = shards.size() == 1
                                   ? "model.safetensors"
                                   : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
      std::vector<io::TensorDeclaration> decl;
      for (const Output* o : shards[s])
        for (io::TensorDeclaration& d : declarations(*o)) {
          weight_map[d.name] = file;
          decl.push_back(std::move(d));
        }
      written.push_back(out / file);
      io::SafetensorsWriter writer(out / file, decl, {{"format", "mlx"}});
      for (const Output* o : shards[s]) {
        write_output(writer, *o, options.pool ? *options.pool : global_thread_pool(), progress);
        (o->layout ? report.quantized : report.kept) += 1;
      }
      writer.finish();
    }
  } catch (const Error& e) {
    remove_written();
    throw Error(fmt::format("{}; nothing was written", e.what()));
  } catch (...) {
    remove_written();
    throw;
  }
  progress.finish();
  if (shards.size() > 1) {
    io::json index = {{"metadata", {{"total_size", total_out}}}, {"weight_map", weight_map}};
    std::ofstream(out / "model.safetensors.index.json") << index.dump(4);
  }
  io::json config = ck.config.raw;
  config["quantization"] = qconfig;
  config["quantization_config"] = qconfig;
  std::ofstream(out / "config.json") << config.dump(4);
  // Tokenizer, chat template, generation and processor configs travel unchanged.
  for (const auto& entry : fs::directory_iterator(in)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file == "config.json" || file.ends_with(".safetensors") ||
        file == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), out / file, fs::copy_options::overwrite_existing);
  }
  return report;
}

}  // namespace qinfer::models
