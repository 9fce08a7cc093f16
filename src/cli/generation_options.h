#pragma once
// What the commands share: the backend of --device, the ranks of --tensor-parallel, loading a model
// with its tokenizer and chat template, and the sampling flags.
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "engine/generate.h"
#include "engine/reasoning.h"
#include "hub/hub.h"
#include "models/tensor_parallel.h"
#include "tokenizer/chat_template.h"

namespace qinfer::cli {

// A model on --device, split over --tensor-parallel ranks: a Model and its backend for 1, else a
// models::TensorParallelModel (which owns its ranks' backends; `ops` is then null).
struct DeviceModel {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<models::Runner> model;
};

struct LoadedModel {
  std::filesystem::path dir;
  models::Checkpoint checkpoint;
  DeviceModel device;
  models::Runner& model() { return *device.model; }
  tokenizer::Tokenizer tokenizer;
  std::optional<tokenizer::ChatTemplate> chat_template;
  std::vector<int32_t> stop_ids;
};

// The backend named by --device: cpu, ref (the scalar reference) or cuda[:N] (CUDA builds).
std::unique_ptr<Ops> make_ops(const std::string& device);

// The device of tensor-parallel rank `rank`: cpu and ref ranks share the host; GPU ranks take
// consecutive GPUs from the one named (cuda:2 with 4 ranks: GPUs 2, 3, 4, 5).
std::string rank_device(const std::string& device, int rank);
// A group of `ranks` ranks on `device` (rank_device), loaded at once.
std::unique_ptr<models::TensorParallelModel> load_ranks(const models::Checkpoint& checkpoint, const std::string& device,
                                                        int ranks);
DeviceModel load_device_model(const models::Checkpoint& checkpoint, const std::string& device, int tensor_parallel);
// --tensor-parallel N, --tp-processes P / --tp-process I / --tp-address HOST:PORT (a group over
// processes; models::Placement), --precision fast|exact (the cuda backend's prompt GEMMs and
// attention), --kv-cache-dtype and --rope-scaling yarn:FACTOR, the same on every command that takes
// --device.
void add_device_flags(CLI::App* cmd, int& tensor_parallel);
// models::open_checkpoint, then --rope-scaling on its config: how every command that takes
// add_device_flags opens its model.
models::Checkpoint load_checkpoint(const std::string& dir);
// For commands whose requests reach one process (serve, chat): process 0 of a group over processes
// leads it and goes on (false); every other process follows it until it stops (true: the command
// has nothing left to do). False for a single process.
bool follow_the_group(LoadedModel& m);
// Whether this process leads (process 0 of a group over processes, or the only one); known before
// the model loads.
bool leads_the_group();
// The --precision in effect: "fast" or "exact".
std::string precision_name();

std::unique_ptr<LoadedModel> load_model(const std::string& dir, bool need_template, const std::string& device = "cpu",
                                        int tensor_parallel = 1);

// The model used when no --model is given: the bundled demo model, models/demo/ of the source tree
// (found beside the binary's build folder, or at the source path this binary was built from).
// Throws naming the places it looked when there is none.
std::string default_model_dir();
// model_folder(`model`), or default_model_dir() when it is empty (logged, so the user knows what runs).
std::string model_or_default(const std::string& model);
// The folder of a --model value: the folder itself when it exists, else the snapshot of a Hugging Face
// name org/name[@revision], from the cache or downloaded (hub::resolve_model).
std::string model_folder(const std::string& model);
// --hf-token, beside --model on every command that takes one (HF_TOKEN when not given).
void add_hub_flags(CLI::App* cmd);
// HubOptions::from_env() with --hf-token over HF_TOKEN.
hub::HubOptions hub_options();

struct GenerationFlags {
  engine::GenerationOptions options;
  std::string think = "show";  // show | hide
  bool thinking = true;        // enable_thinking for the template
  std::string device = "cpu";  // cpu | cuda[:N]
  int tensor_parallel = 1;
};
void add_generation_flags(CLI::App* cmd, GenerationFlags& flags);

// Writes a reply to stdout as it streams: all of it, or with `hide` only what follows the reasoning
// block (which `prompt`, the rendered template, may have opened itself).
class ReplyPrinter {
 public:
  ReplyPrinter(bool hide, std::string_view prompt);
  void operator()(std::string_view chunk);
  void finish();  // the held-back rest

 private:
  void write(std::string_view text);
  std::optional<engine::ReasoningSplitter> reasoning_;
};

}  // namespace qinfer::cli
