// `qinfer bench`: prefill and decode speed of a model on a device, with decode's achieved memory
// bandwidth next to a bandwidth probe measured in the same process.
//   qinfer bench (--model DIR | --shape qwen3_5-0.8b) [--device cpu] [--prompt 128] [--decode 32]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "models/eval.h"
#include "models/quantize.h"
#include "models/random_checkpoint.h"

namespace qinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes one decode step must read: every matrix once (only the routed share of MoE experts, one
// embedding row), the head, each attention layer's KV so far and each recurrent state (read + write).
double decode_step_bytes(const models::Checkpoint& ck, int64_t context) {
  const io::TextConfig& c = ck.config.text;
  double bytes = 0;
  for (const auto& [name, t] : ck.plan.tensors) {
    if (t.group != io::TensorGroup::text) continue;
    double b = static_cast<double>(t.nbytes());
    if (name == "model.embed_tokens.weight") {
      bytes += b / static_cast<double>(c.vocab_size);  // one row
      if (c.tie_word_embeddings) bytes += b;          // ... and the whole table as the head
      continue;
    }
    if (name.find(".mlp.experts.") != std::string::npos)
      b *= static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
    bytes += b;
  }
  for (const io::LayerKind kind : c.layer_types) {
    if (kind == io::LayerKind::full_attention)
      bytes += 2.0 * static_cast<double>(context * c.num_key_value_heads * c.head_dim * 4);
    else
      bytes += 2.0 * static_cast<double>(c.linear_num_value_heads * c.linear_value_head_dim * c.linear_key_head_dim * 4);
  }
  return bytes;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

void add_bench_command(CLI::App& app) {
  struct Options {
    std::string model, shape, device = "cpu";
    int32_t prompt = 128, decode = 32, bits = 0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed, and decode GB/s against a bandwidth probe");
  auto* model_opt = cmd->add_option("--model", o->model, "checkpoint folder (default: the bundled demo model)");
  auto* shape_opt =
      cmd->add_option("--shape", o->shape, "random weights of a released shape: qwen3_5-0.8b, qwen3_5-4b, qwen3-0.6b, ...");
  model_opt->excludes(shape_opt);
  cmd->add_option("--bits", o->bits, "with --shape: MLX affine-quantize the random weights to 2..8 bits (group 64) first");
  cmd->add_option("--device", o->device, "cpu (default)");
  cmd->add_option("--prompt", o->prompt, "prompt tokens for the prefill measurement (default 128)");
  cmd->add_option("--decode", o->decode, "decode steps to time (default 32)");
  cmd->callback([o] {
    if (o->shape.empty()) o->model = model_or_default(o->model);
    QINFER_CHECK(o->device == "cpu", "--device {}: this build benchmarks the cpu backend", o->device);
    QINFER_CHECK(o->prompt > 0 && o->decode > 0, "--prompt and --decode must be positive");
    std::filesystem::path dir = o->model;
    std::filesystem::path scratch;
    if (!o->shape.empty()) {
      scratch = std::filesystem::temp_directory_path() / fmt::format("qinfer-bench-{}-{}", o->shape, ::getpid());
      models::write_random_checkpoint(scratch / "bf16", models::released_shape(o->shape), 1);
      dir = scratch / "bf16";
      if (o->bits > 0) {
        models::QuantizeOptions q;
        q.layout = {quant::Mode::affine, o->bits, 64};
        models::quantize_checkpoint(dir, scratch / "quantized", q);
        std::filesystem::remove_all(dir);
        dir = scratch / "quantized";
      }
    }
    QINFER_CHECK(o->bits == 0 || !o->shape.empty(), "--bits needs --shape (quantize a real checkpoint with qinfer quantize)");
    struct Cleanup {
      std::filesystem::path path;
      ~Cleanup() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove_all(path, ignored);
      }
    } cleanup{scratch};

    ThreadPool& pool = global_thread_pool();
    auto start = Clock::now();
    models::Checkpoint ck = models::open_checkpoint(dir);
    std::unique_ptr<Ops> ops = make_cpu_ops(pool);
    models::Model model(ck, *ops);
    const double load_s = seconds_since(start);
    uint64_t params = 0;
    for (const auto& [name, t] : ck.plan.tensors) {
      if (t.group != io::TensorGroup::text || name.ends_with(".scales") || name.ends_with(".biases")) continue;
      uint64_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      params += t.quant ? n * 32 / static_cast<uint64_t>(t.quant->bits) : n;  // packed codes hold 32/bits each
    }

    const double probe = measure_read_bandwidth_gbs(pool);
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(static_cast<size_t>(o->prompt));
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(std::min<int64_t>(ck.config.text.vocab_size, 100000)));
    ModelCache cache = models::make_cache(model, o->prompt + o->decode + 1);
    SequenceCache seq;
    start = Clock::now();
    models::Batch batch;
    batch.sequences.push_back({prompt, &seq, false});
    Tensor logits = model.forward(batch, cache);
    const double prefill_s = seconds_since(start);

    std::vector<double> steps;
    int32_t token = 0;
    for (int32_t i = 0; i < o->decode; ++i) {
      const float* row = logits.ptr<float>();
      token = static_cast<int32_t>(std::max_element(row, row + ck.config.text.vocab_size) - row);
      models::Batch step;
      step.sequences.push_back({{token}, &seq, false});
      start = Clock::now();
      logits = model.forward(step, cache);
      steps.push_back(seconds_since(start));
    }
    const double step_s = median(steps);
    const double bytes = decode_step_bytes(ck, o->prompt + o->decode / 2);
    const double gbs = bytes / step_s / 1e9;
    const std::string weights = ck.config.quantization
                                    ? fmt::format("MLX {} {}-bit", ck.config.quantization->global.mode,
                                                  ck.config.quantization->global.bits)
                                    : (ck.config.text.dtype.empty() ? std::string("?") : ck.config.text.dtype);
    fmt::print("model            {} ({}, {:.2f} B parameters, weights {})\n", o->shape.empty() ? o->model : o->shape,
               ck.family->name, static_cast<double>(params) / 1e9, weights);
    fmt::print("device           cpu, {} threads; load {:.1f} s\n", pool.size(), load_s);
    fmt::print("prefill          {} tokens in {:.3f} s: {:.1f} tok/s\n", o->prompt, prefill_s, o->prompt / prefill_s);
    fmt::print("decode (batch 1) median {:.2f} ms/token over {} steps: {:.2f} tok/s\n", step_s * 1e3, o->decode,
               1.0 / step_s);
    fmt::print("decode bytes     {:.1f} MB per token -> {:.2f} GB/s\n", bytes / 1e6, gbs);
    fmt::print("bandwidth probe  {:.2f} GB/s (multi-threaded read, same process)\n", probe);
    fmt::print("ratio            {:.1f}% of the probe\n", 100.0 * gbs / probe);
  });
}

}  // namespace qinfer::cli
