// `qinfer bench`: prefill and decode speed of a model on a device, with decode's achieved memory
// bandwidth next to a bandwidth probe measured in the same process.
//   qinfer bench (--model DIR | --shape NAME [--bits B]) [--device cpu|cuda[:N]] [--tensor-parallel N]
//                [--batch 1,8,32] [--prompt 512,8192] [--gen 128] [--context 128] [--json]
//   qinfer bench --shape NAME --print-config
//   qinfer bench --shape NAME [--bits B] --save DIR
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "io/json.h"
#include "models/eval.h"
#include "models/quantize.h"
#include "models/random_checkpoint.h"
#include "parallel/sharding.h"
#ifdef QINFER_HAVE_CUDA
#include "backend/cuda/bandwidth.h"
#include "backend/cuda/device.h"
#endif

namespace qinfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes one decode step of `batch` sequences at `context` cached tokens each must read: every
// matrix once (of MoE experts, the share a batch is expected to touch), one embedding row per
// sequence, the head, each attention layer's KV and each recurrent state (read + write). Over
// `ranks` tensor-parallel ranks, what all of them read: the split tensors once, the replicated ones
// (embeddings, head, norms, router) once per rank.
double decode_step_bytes(const models::Checkpoint& ck, int64_t batch, int64_t context, DType kv_dtype, int ranks = 1) {
  const io::TextConfig& c = ck.config.text;
  double expert_share = 1.0;
  if (c.num_experts > 0) {
    // Distinct experts of batch × k draws: E·(1 − (1 − k/E)^batch).
    const double k_over_e = static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
    expert_share = 1.0 - std::pow(1.0 - k_over_e, static_cast<double>(batch));
  }
  const parallel::ShardPlan plan = parallel::plan_shards(c, 0, ranks);
  double bytes = 0;
  for (const auto& [name, t] : ck.plan.tensors) {
    if (t.group != io::TensorGroup::text) continue;
    std::string weight = name;  // scales and biases follow their weight
    if (name.ends_with(".scales") || name.ends_with(".biases")) weight.replace(weight.size() - 7, 7, ".weight");
    const bool replicated = parallel::slice_of(weight, parallel::logical_shape(t), plan).kind ==
                            parallel::Slice::replicated;
    double b = static_cast<double>(t.nbytes()) * (replicated ? ranks : 1);
    if (name.starts_with("model.embed_tokens.")) {
      bytes += b * static_cast<double>(batch) / static_cast<double>(c.vocab_size);  // one row each
      if (c.tie_word_embeddings) bytes += b;  // ... and the whole table as the head
      continue;
    }
    if (name.find(".mlp.experts.") != std::string::npos) b *= expert_share;
    bytes += b;
  }
  for (const io::LayerKind kind : c.layer_types) {
    if (kind == io::LayerKind::full_attention) {
      const auto elements = static_cast<uint64_t>(context * c.num_key_value_heads * c.head_dim);
      bytes += static_cast<double>(batch) * 2.0 * static_cast<double>(storage_bytes(kv_dtype, elements));
    } else {
      bytes += static_cast<double>(batch) * 2.0 *
               static_cast<double>(c.linear_num_value_heads * c.linear_value_head_dim * c.linear_key_head_dim * 4);
    }
  }
  return bytes;
}

double weight_bytes(const models::Checkpoint& ck) {
  double bytes = 0;
  for (const auto& [name, t] : ck.plan.tensors)
    if (t.group == io::TensorGroup::text) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t count, int64_t vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(std::min<int64_t>(vocab, 100000)));
  return tokens;
}

struct Probe {
  double gbs = 0;
  std::string what, device_name;
};

// The ceiling decode is measured against, on the bench's device, in the same process.
Probe bandwidth_probe(const std::string& device) {
  if (device == "cpu" || device == "ref") {
    ThreadPool& pool = global_thread_pool();
    return {measure_read_bandwidth_gbs(pool), fmt::format("multi-threaded read, {} threads", pool.size()),
            fmt::format("cpu, {} threads", pool.size())};
  }
#ifdef QINFER_HAVE_CUDA
  const int index = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  std::string name = device;
  for (const cuda::DeviceInfo& info : cuda::list_devices())
    if (info.index == index) name = info.name;
  return {cuda::measure_copy_bandwidth_gbs(), "device-to-device copy, read + write", name};
#else
  fail("--device {}: this build has no CUDA backend", device);
#endif
}

struct PrefillResult {
  int64_t tokens = 0;
  double seconds = 0;
};

struct DecodeResult {
  int64_t batch = 0;
  double step_s = 0, bytes = 0;
  double host_s = 0;  // of a step, the time until forward() returns (the host's share when it is the bottleneck)
  std::optional<double> device_s;  // of a step, the device's time from its first work to its last (GPUs)
};

// One forward over a fresh `tokens`-token prompt; the second of two runs (the first warms up
// kernels, GEMM plans and the memory pool).
PrefillResult measure_prefill(models::Runner& model, int64_t tokens, std::mt19937& rng) {
  const std::vector<int32_t> prompt = random_tokens(rng, tokens, model.config().vocab_size);
  double seconds = 0;
  for (int run = 0; run < 2; ++run) {
    ModelCache cache = model.cache_for(tokens + 1);
    SequenceCache seq = cache.sequence(0);
    models::Batch batch;
    batch.sequences.push_back({prompt, &seq, false});
    const auto start = Clock::now();
    const Tensor logits = to_host(model.ops(), model.forward(batch, cache));
    seconds = seconds_since(start);
  }
  return {tokens, seconds};
}

// `batch` sequences prefilled with `context` tokens, then `gen` steps picked by `sampling`;
// the median step (forward + sampling + the ids back to the host).
DecodeResult measure_decode(models::Runner& model, const models::Checkpoint& ck, int ranks, int64_t batch,
                            int64_t context, int64_t gen, const SamplingParams& sampling, std::mt19937& rng) {
  ModelCache cache = model.cache_for(context + gen + 1, batch);
  std::vector<SequenceCache> seqs;
  for (int64_t s = 0; s < batch; ++s) seqs.push_back(cache.sequence(s));
  models::Batch prefill;
  for (SequenceCache& seq : seqs)
    prefill.sequences.push_back({random_tokens(rng, context, model.config().vocab_size), &seq, false});
  Tensor logits = model.forward(prefill, cache);
  const std::vector<SamplingParams> params(static_cast<size_t>(batch), sampling);
  const std::vector<std::vector<int32_t>> history(static_cast<size_t>(batch));
  std::vector<uint64_t> step_index(static_cast<size_t>(batch), 0);
  std::vector<int32_t> next;
  model.ops().sample(logits, params, history, step_index, next);
  std::vector<double> steps, host, device;
  for (int64_t i = 0; i < gen; ++i) {
    models::Batch step;
    for (size_t s = 0; s < seqs.size(); ++s) step.sequences.push_back({{next[s]}, &seqs[s], false});
    const auto start = Clock::now();
    model.ops().begin_device_timing();
    logits = model.forward(step, cache);
    host.push_back(seconds_since(start));
    model.ops().sample(logits, params, history, step_index, next);
    const std::optional<double> on_device = model.ops().end_device_timing();
    steps.push_back(seconds_since(start));
    if (on_device) device.push_back(*on_device);
  }
  return {batch, median(steps), decode_step_bytes(ck, batch, context + gen / 2, model.ops().kv_dtype(), ranks),
          median(host), device.empty() ? std::optional<double>() : median(device)};
}

}  // namespace

void add_bench_command(CLI::App& app) {
  struct Options {
    std::string model, shape, device = "cpu", save;
    std::vector<int64_t> batch{1}, prompt{128};
    int64_t gen = 32, context = 128;
    int32_t bits = 0;
    int tensor_parallel = 1;
    bool json = false, print_config = false;
    SamplingParams sampling{.temperature = 0.0f, .seed = 1};
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed, and decode GB/s against a bandwidth probe");
  auto* model_opt = cmd->add_option("--model", o->model, "checkpoint folder, or a Hugging Face name "
                  "org/name[@revision] (default: the bundled demo model)");
  add_hub_flags(cmd);
  auto* shape_opt = cmd->add_option(
      "--shape", o->shape, "random weights of a released shape: qwen3-8b, qwen3-30b-a3b, qwen3_5-9b, qwen3_5-27b, ...");
  model_opt->excludes(shape_opt);
  cmd->add_option("--bits", o->bits, "with --shape: MLX affine-quantize the random weights to 2..8 bits (group 64) first");
  cmd->add_option("--device", o->device, "cpu (default) or cuda[:N]");
  add_device_flags(cmd, o->tensor_parallel);
  cmd->add_option("--batch", o->batch, "decode batch sizes, comma-separated (default 1)")->delimiter(',');
  cmd->add_option("--prompt", o->prompt, "prefill lengths to time, comma-separated (default 128)")->delimiter(',');
  cmd->add_option("--gen", o->gen, "decode steps to time per batch size (default 32)");
  cmd->add_option("--context", o->context, "tokens each decode sequence holds before the timed steps (default 128)");
  cmd->add_option("--temp", o->sampling.temperature, "decode picks: temperature (default 0: greedy)");
  cmd->add_option("--top-k", o->sampling.top_k, "decode picks: top-k (default 0: off)");
  cmd->add_option("--top-p", o->sampling.top_p, "decode picks: top-p (default 1: off)");
  cmd->add_flag("--json", o->json, "print one JSON object instead of the table");
  cmd->add_flag("--print-config", o->print_config, "with --shape: print the config.json of the shape and exit");
  cmd->add_option("--save", o->save,
                  "with --shape: write the random checkpoint (quantized with --bits) into this new folder and exit");
  cmd->callback([o] {
    if (o->print_config) {
      QINFER_CHECK(!o->shape.empty(), "--print-config needs --shape");
      fmt::print("{}\n", models::released_shape(o->shape).dump(2));
      return;
    }
    QINFER_CHECK(o->save.empty() || !o->shape.empty(), "--save needs --shape");
    if (!o->save.empty()) {
      QINFER_CHECK(!std::filesystem::exists(o->save), "--save {}: the folder exists already", o->save);
      const std::filesystem::path target = o->save;
      if (o->bits == 0) {
        models::write_random_checkpoint(target, models::released_shape(o->shape), 1);
        return;
      }
      const std::filesystem::path bf16 = target.string() + ".bf16-tmp";
      models::write_random_checkpoint(bf16, models::released_shape(o->shape), 1);
      models::QuantizeOptions q;
      q.layout = {quant::Mode::affine, o->bits, 64};
      models::quantize_checkpoint(bf16, target, q);
      std::filesystem::remove_all(bf16);
      return;
    }
    if (o->shape.empty()) o->model = model_or_default(o->model);
    QINFER_CHECK(o->bits == 0 || !o->shape.empty(), "--bits needs --shape (quantize a real checkpoint with qinfer quantize)");
    QINFER_CHECK(o->gen > 0 && o->context > 0, "--gen and --context must be positive");
    for (int64_t b : o->batch) QINFER_CHECK(b > 0 && b <= 4096, "--batch {}: batch sizes must be in 1..4096", b);
    for (int64_t p : o->prompt) QINFER_CHECK(p > 0, "--prompt {}: prefill lengths must be positive", p);
    std::filesystem::path dir = o->model;
    std::filesystem::path scratch;
    struct Cleanup {
      std::filesystem::path path;
      ~Cleanup() {
        std::error_code ignored;
        if (!path.empty()) std::filesystem::remove_all(path, ignored);
      }
    } cleanup;
    if (!o->shape.empty()) {
      scratch = std::filesystem::temp_directory_path() / fmt::format("qinfer-bench-{}-{}", o->shape, ::getpid());
      cleanup.path = scratch;
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

    auto start = Clock::now();
    models::Checkpoint ck = load_checkpoint(dir);
    const DeviceModel device = load_device_model(ck, o->device, o->tensor_parallel);  // weights on the device(s)
    models::Runner& model = *device.model;
    const int ranks = o->tensor_parallel;
    const double load_s = seconds_since(start);
    const double loaded_bytes = weight_bytes(ck);
    uint64_t params = 0;
    for (const auto& [name, t] : ck.plan.tensors) {
      if (t.group != io::TensorGroup::text || name.ends_with(".scales") || name.ends_with(".biases")) continue;
      uint64_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      params += t.quant ? n * 32 / static_cast<uint64_t>(t.quant->bits) : n;  // packed codes hold 32/bits each
    }
    const Probe probe = bandwidth_probe(o->device);
    // Ranks on GPUs read from N memories at once; host ranks share one.
    const double ceiling_gbs = probe.gbs * (model.ops().device() == Device::cuda ? ranks : 1);

    std::mt19937 rng(7);
    std::vector<PrefillResult> prefills;
    for (int64_t p : o->prompt) {
      log_info("bench: prefill of {} tokens", p);
      prefills.push_back(measure_prefill(model, p, rng));
    }
    std::vector<DecodeResult> decodes;
    for (int64_t b : o->batch) {
      log_info("bench: decode at batch {}", b);
      decodes.push_back(measure_decode(model, ck, ranks, b, o->context, o->gen, o->sampling, rng));
    }

    const std::string weights = ck.config.quantization
                                    ? fmt::format("MLX {} {}-bit g{}", ck.config.quantization->global.mode,
                                                  ck.config.quantization->global.bits,
                                                  ck.config.quantization->global.group_size)
                                    : (ck.config.text.dtype.empty() ? std::string("?") : ck.config.text.dtype);
    const std::string model_name = o->shape.empty() ? o->model : o->shape;
    const std::string precision = o->device.starts_with("cuda") ? precision_name() : "exact";  // host backends: f32
    if (o->json) {
      io::json out = {{"model", model_name},
                      {"family", ck.family->name},
                      {"weights", weights},
                      {"params_b", static_cast<double>(params) / 1e9},
                      {"device", probe.device_name},
                      {"tensor_parallel", ranks},
                      {"precision", precision},
                      {"kv_cache", name(model.ops().kv_dtype())},
                      {"load_s", load_s},
                      {"load_gbs", loaded_bytes / load_s / 1e9},
                      {"copy_probe_gbs", probe.gbs},
                      {"probe", probe.what},
                      {"decode_context", o->context},
                      {"decode_sampling", {{"temperature", o->sampling.temperature},
                                           {"top_k", o->sampling.top_k},
                                           {"top_p", o->sampling.top_p}}},
                      {"prefill", io::json::array()},
                      {"decode", io::json::array()}};
      for (const PrefillResult& p : prefills)
        out["prefill"].push_back({{"tokens", p.tokens}, {"seconds", p.seconds}, {"tok_s", p.tokens / p.seconds}});
      for (const DecodeResult& d : decodes) {
        const double gbs = d.bytes / d.step_s / 1e9;
        out["decode"].push_back({{"batch", d.batch},
                                 {"ms_per_step", d.step_s * 1e3},
                                 {"host_ms_per_step", d.host_s * 1e3},
                                 {"device_ms_per_step", d.device_s ? io::json(*d.device_s * 1e3) : io::json()},
                                 {"tok_s", static_cast<double>(d.batch) / d.step_s},
                                 {"bytes_per_step", d.bytes},
                                 {"gbs", gbs},
                                 {"fraction_of_probe", gbs / ceiling_gbs}});
      }
      fmt::print("{}\n", out.dump(2));
      return;
    }
    fmt::print("model            {} ({}, {:.2f} B parameters, weights {})\n", model_name, ck.family->name,
               static_cast<double>(params) / 1e9, weights);
    fmt::print("device           {}{}, {} precision, {} KV cache; load {:.1f} s ({:.2f} GB/s)\n", probe.device_name,
               ranks > 1 ? fmt::format(", tensor parallel {}", ranks) : "", precision, name(model.ops().kv_dtype()),
               load_s, loaded_bytes / load_s / 1e9);
    fmt::print("bandwidth probe  {:.1f} GB/s ({}){}\n", probe.gbs, probe.what,
               ceiling_gbs != probe.gbs ? fmt::format("; x {} GPUs = {:.1f} GB/s", ranks, ceiling_gbs) : "");
    for (const PrefillResult& p : prefills)
      fmt::print("prefill          {} tokens in {:.3f} s: {:.1f} tok/s\n", p.tokens, p.seconds, p.tokens / p.seconds);
    for (const DecodeResult& d : decodes) {
      const double gbs = d.bytes / d.step_s / 1e9;
      const std::string device = d.device_s ? fmt::format(", device {:.2f}", *d.device_s * 1e3) : "";
      fmt::print(
          "decode batch {:<4} {:.2f} ms/step (host {:.2f}{}): {:.1f} tok/s; {:.1f} MB/step -> {:.1f} GB/s = {:.1f}% of "
          "the probe\n",
          d.batch, d.step_s * 1e3, d.host_s * 1e3, device, static_cast<double>(d.batch) / d.step_s, d.bytes / 1e6, gbs,
          100.0 * gbs / ceiling_gbs);
    }
    fmt::print("(decode: median over {} steps after a {}-token prompt per sequence; {})\n", o->gen, o->context,
               o->sampling.temperature <= 0.0f
                   ? std::string("greedy")
                   : fmt::format("sampled at temperature {}, top-k {}, top-p {}", o->sampling.temperature,
                                 o->sampling.top_k, o->sampling.top_p));
  });
}

}  // namespace qinfer::cli
