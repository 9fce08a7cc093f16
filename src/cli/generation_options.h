#pragma once
// What `run` and `chat` share: loading a model with its tokenizer and chat template, and the
// sampling flags.
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "engine/generate.h"
#include "tokenizer/chat_template.h"

namespace qinfer::cli {

struct LoadedModel {
  std::filesystem::path dir;
  models::Checkpoint checkpoint;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<models::Model> model;
  tokenizer::Tokenizer tokenizer;
  std::optional<tokenizer::ChatTemplate> chat_template;
  std::vector<int32_t> stop_ids;
};

// The backend named by --device: cpu, ref (the scalar reference) or cuda[:N] (CUDA builds).
std::unique_ptr<Ops> make_ops(const std::string& device);

std::unique_ptr<LoadedModel> load_model(const std::string& dir, bool need_template, const std::string& device = "cpu");

// The model used when no --model is given: the bundled demo model, models/demo/ of the source tree
// (found beside the binary's build folder, or at the source path this binary was built from).
// Throws naming the places it looked when there is none.
std::string default_model_dir();
// `model` itself, or default_model_dir() when it is empty (logged, so the user knows what runs).
std::string model_or_default(const std::string& model);

struct GenerationFlags {
  engine::GenerationOptions options;
  std::string think = "show";  // show | hide
  bool thinking = true;        // enable_thinking for the template
  std::string device = "cpu";  // cpu | cuda[:N]
};
void add_generation_flags(CLI::App* cmd, GenerationFlags& flags);

}  // namespace qinfer::cli
