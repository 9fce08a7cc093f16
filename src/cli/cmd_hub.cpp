// `qinfer pull`, `qinfer ls`, `qinfer rm`: models by Hugging Face name in the huggingface_hub cache.
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/progress.h"
#include "hub/hub.h"

namespace qinfer::cli {

void add_hub_commands(CLI::App& app) {
  auto name = std::make_shared<std::string>();
  CLI::App* pull = app.add_subcommand(
      "pull", "Download a model by Hugging Face name into the cache (HF_HUB_CACHE; resumes a broken download)");
  pull->add_option("name", *name, "org/name[@revision] (revision: a branch, tag or commit; default main)")->required();
  add_hub_flags(pull);
  pull->callback([name] {
    const auto snapshot = hub::pull(*name, hub_options());
    fmt::print("{}\n", snapshot.string());
  });

  CLI::App* ls = app.add_subcommand("ls", "List the models in the Hugging Face cache");
  ls->callback([] {
    const hub::HubOptions options = hub_options();
    const std::vector<hub::CachedModel> models = hub::list_cached(options);
    if (models.empty()) {
      fmt::print(stderr, "no models in {}\n", options.cache_dir.string());
      return;
    }
    fmt::print("{:<40} {:<24} {:>10}  {:<14} {}\n", "NAME", "REVISION -> COMMIT", "SIZE", "FAMILY", "QUANTIZATION");
    for (const hub::CachedModel& m : models) {
      std::string refs;
      for (const auto& [revision, commit] : m.refs)
        refs += (refs.empty() ? "" : ", ") + revision + " -> " + commit.substr(0, 12);
      fmt::print("{:<40} {:<24} {:>10}  {:<14} {}\n", m.repo, refs.empty() ? "(no refs)" : refs, format_bytes(m.bytes),
                 m.family.empty() ? "?" : m.family, m.quantization.empty() ? "-" : m.quantization);
    }
  });

  auto target = std::make_shared<std::string>();
  CLI::App* rm = app.add_subcommand("rm", "Remove a model (every revision) from the Hugging Face cache");
  rm->add_option("name", *target, "org/name")->required();
  rm->callback([target] {
    const uint64_t bytes = hub::remove_cached(*target, hub_options());
    fmt::print("removed {} ({})\n", *target, format_bytes(bytes));
  });
}

}  // namespace qinfer::cli
