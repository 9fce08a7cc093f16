// `qinfer eval`: logits for token ids, the oracle interface tests and outside checks use.
//   qinfer eval --model DIR --ids 1,2,3 [--mode prefill|decode|chunked:N|cached:N] [--device cpu|ref|cuda[:N]]
//               [--logits OUT.bin] [--greedy N] [--tensor-parallel N]
#include <fmt/format.h>

#include <fstream>
#include <filesystem>
#include <functional>
#include <sstream>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "engine/cached_logits.h"
#include "models/eval.h"
#include "models/tensor_parallel.h"

namespace qinfer::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    QINFER_CHECK(!item.empty() && item.size() < 11 && item.find_first_not_of("0123456789") == std::string::npos,
                 "--ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    const long long id = std::stoll(item);
    QINFER_CHECK(id <= INT32_MAX, "--ids: token id {} is too large", id);
    ids.push_back(static_cast<int32_t>(id));
  }
  QINFER_CHECK(!ids.empty(), "--ids: no token ids given");
  return ids;
}

struct Options {
  std::string model, ids, mode = "prefill", device = "cpu", logits, dump;
  int32_t greedy = 0;
  int tensor_parallel = 1;
};

void write_logits(const std::string& path, const Tensor& logits) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(logits.data), static_cast<std::streamsize>(logits.nbytes()));
  QINFER_CHECK(out.good(), "--logits {}: cannot write the file", path);
}

// cached:N — through the engine's prefix cache; prints the tokens the prompt took from it.
void evaluate_cached(const Options& o, const std::vector<int32_t>& ids, models::EvalMode mode, models::Runner& model) {
  const engine::CachedLogits r = engine::cached_prompt_logits(model, ids, mode.chunk);
  if (!o.logits.empty()) write_logits(o.logits, r.logits);
  fmt::print("{{\"cached\":{}}}\n", r.cached);
}

// The prompt's logits (and dump, and greedy tokens) from `model`; only `write` writes them out.
void evaluate(const Options& o, const std::vector<int32_t>& ids, models::EvalMode mode, models::Model& model, Ops& ops,
              bool write) {
  if (!o.logits.empty() || !o.dump.empty()) {
    io::json manifest = io::json::object();
    std::function<void(const std::string&, const Tensor&)> dump;
    if (!o.dump.empty()) {
      std::filesystem::create_directories(o.dump);
      dump = [&](const std::string& name, const Tensor& value) {
        const Tensor host = to_host(ops, value);
        std::ofstream out(std::filesystem::path(o.dump) / (name + ".bin"), std::ios::binary);
        out.write(static_cast<const char*>(host.data), static_cast<std::streamsize>(host.nbytes()));
        QINFER_CHECK(out.good(), "--dump {}: cannot write {}.bin", o.dump, name);
        manifest[name] = value.shape;
      };
    }
    Tensor logits = models::prompt_logits(model, ids, mode, dump);
    if (!o.dump.empty()) {
      std::ofstream(std::filesystem::path(o.dump) / "manifest.json") << manifest.dump(1) << "\n";
    }
    if (!o.logits.empty() && write) write_logits(o.logits, logits);
  }
  if (o.greedy > 0) {
    std::vector<int32_t> tokens = models::greedy_continuation(model, ids, o.greedy);
    if (write) fmt::print("{{\"greedy\":[{}]}}\n", fmt::join(tokens, ","));
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("eval", "Logits (and greedy tokens) for a prompt of token ids");
  cmd->add_option("--model", o->model, "checkpoint folder, or a Hugging Face name "
                  "org/name[@revision]")->required();
  add_hub_flags(cmd);
  cmd->add_option("--ids", o->ids, "comma-separated token ids")->required();
  cmd->add_option("--mode", o->mode,
                  "prefill | decode | chunked:N | cached:N: after an earlier request of the first N ids left them in "
                  "the prefix cache, printing {\"cached\": K}, the tokens reused (default prefill)");
  cmd->add_option("--device", o->device, "cpu (default), ref or cuda[:N]");
  cmd->add_option("--logits", o->logits, "write float32 little-endian logits [L, V] here");
  cmd->add_option("--dump", o->dump,
                  "write every named intermediate (model.layers.{i}.*) as f32 .bin files plus manifest.json here "
                  "(prefill mode)");
  cmd->add_option("--greedy", o->greedy, "print {\"greedy\":[...]} with N greedy tokens after the prompt");
  add_device_flags(cmd, o->tensor_parallel);
  cmd->callback([o] {
    const std::vector<int32_t> ids = parse_ids(o->ids);
    const models::EvalMode mode = models::parse_eval_mode(o->mode);
    QINFER_CHECK(o->greedy >= 0, "--greedy: must not be negative");
    QINFER_CHECK(mode.kind != models::EvalMode::cached || o->greedy == 0,
                 "--greedy does not go with --mode cached:N (the greedy tokens of a cached prompt are the same)");
    QINFER_CHECK(o->dump.empty() || mode.kind == models::EvalMode::prefill,
                 "--dump needs --mode prefill (one forward, so each name is written once)");
    QINFER_CHECK(o->dump.empty() || o->tensor_parallel == 1,
                 "--dump needs --tensor-parallel 1 (a rank's intermediates hold only its heads)");
    models::Checkpoint checkpoint = load_checkpoint(model_folder(o->model));
    for (int32_t id : ids)
      QINFER_CHECK(id < checkpoint.config.text.vocab_size, "--ids: token id {} is outside the vocabulary (0..{})", id,
                   checkpoint.config.text.vocab_size - 1);
    if (o->tensor_parallel == 1) {
      const std::unique_ptr<Ops> ops = make_ops(o->device);
      models::Model model(checkpoint, *ops);
      if (mode.kind == models::EvalMode::cached) evaluate_cached(*o, ids, mode, model);
      else evaluate(*o, ids, mode, model, *ops, true);
      return;
    }
    // Every rank runs the same forwards; rank 0 writes the results.
    const auto group = load_ranks(checkpoint, o->device, o->tensor_parallel);
    if (mode.kind == models::EvalMode::cached) {
      evaluate_cached(*o, ids, mode, *group);
      return;
    }
    group->for_each_rank(
        [&](models::Model& model) { evaluate(*o, ids, mode, model, model.ops(), model.shard().rank == 0); });
  });
}

}  // namespace qinfer::cli
