#include "cli/generation_options.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#ifdef QINFER_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace qinfer::cli {

std::string default_model_dir() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path().parent_path() / "models" / "demo");  // build/qinfer
    candidates.push_back(exe.parent_path() / "models" / "demo");                // installed beside it
  }
  candidates.push_back(fs::path(QINFER_SOURCE_DIR) / "models" / "demo");
  std::string looked;
  std::vector<std::string> seen;
  for (const fs::path& candidate : candidates) {
    const std::string dir = candidate.lexically_normal().string();
    if (std::find(seen.begin(), seen.end(), dir) != seen.end()) continue;
    seen.push_back(dir);
    if (fs::exists(fs::path(dir) / "config.json", ec)) return dir;
    looked += (looked.empty() ? "" : ", ") + dir;
  }
  fail("no --model given and the bundled demo model is not where it should be (looked in {})", looked);
}

namespace {
std::string hf_token;  // --hf-token of this process's command
}  // namespace

void add_hub_flags(CLI::App* cmd) {
  cmd->add_option("--hf-token", hf_token,
                  "Hugging Face token for gated or private models named org/name (default: HF_TOKEN)");
}

hub::HubOptions hub_options() {
  hub::HubOptions options = hub::HubOptions::from_env();
  if (!hf_token.empty()) options.token = hf_token;
  return options;
}

std::string model_folder(const std::string& model) { return hub::resolve_model(model, hub_options()).string(); }

std::string model_or_default(const std::string& model) {
  if (!model.empty()) return model_folder(model);
  std::string dir = default_model_dir();
  log_info("no --model given: using the bundled demo model at {}", dir);
  return dir;
}

namespace {
// --precision of this process's command (one command runs per process).
bool exact_precision = false;
// --kv-cache-dtype: none for auto (the backend's choice, Ops::kv_dtype).
std::optional<DType> kv_cache_dtype;
// --rope-scaling yarn:FACTOR[:ORIGINAL]: none for the config's own rotary scaling.
struct YarnFlag {
  double factor = 0;
  std::optional<int64_t> original;
};
std::optional<YarnFlag> yarn_flag;
// --tp-processes, --tp-process, --tp-address.
struct {
  int count = 1, index = 0;
  std::string address;
} processes;

// --rope-scaling yarn:FACTOR[:ORIGINAL]: FACTOR a number above 1, ORIGINAL a positive count of positions.
YarnFlag parse_rope_scaling(const std::string& value) {
  constexpr std::string_view kPrefix = "yarn:";
  QINFER_CHECK(value.starts_with(kPrefix),
               "--rope-scaling {}: expected yarn:FACTOR or yarn:FACTOR:ORIGINAL (YaRN is the scaling supported)", value);
  const char* first = value.data() + kPrefix.size();
  const char* last = value.data() + value.size();
  const char* colon = std::find(first, last, ':');
  YarnFlag flag;
  const auto [end, error] = std::from_chars(first, colon, flag.factor);
  QINFER_CHECK(first != colon && error == std::errc() && end == colon && std::isfinite(flag.factor) && flag.factor > 1,
               "--rope-scaling {}: FACTOR must be a number above 1 (yarn:4 stretches a 32768-position context to "
               "131072)", value);
  if (colon != last) {
    int64_t original = 0;
    const auto [o_end, o_error] = std::from_chars(colon + 1, last, original);
    QINFER_CHECK(colon + 1 != last && o_error == std::errc() && o_end == last && original > 0,
                 "--rope-scaling {}: ORIGINAL must be a positive whole number of positions (yarn:4:32768, as the "
                 "Qwen3 model cards give it)", value);
    flag.original = original;
  }
  return flag;
}

// N of "cuda" (0) or "cuda:N".
int cuda_index(const std::string& device) {
  const std::string index = device.size() > 5 ? device.substr(5) : "0";
  QINFER_CHECK(!index.empty() && index.size() < 4 && index.find_first_not_of("0123456789") == std::string::npos,
               "--device {}: expected cuda or cuda:N with N a GPU index", device);
  return std::stoi(index);
}
}  // namespace

namespace {
std::unique_ptr<Ops> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_ops(global_thread_pool());
  if (device == "ref") return make_ref_ops();
  if (device == "cuda" || device.starts_with("cuda:")) {
#ifdef QINFER_HAVE_CUDA
    return make_cuda_ops(cuda_index(device), exact_precision ? Precision::exact : Precision::fast);
#else
    fail("--device {}: this build has no CUDA backend (configure with -DQINFER_CUDA=ON where nvcc is installed)",
         device);
#endif
  }
  fail("--device {}: expected cpu, ref or cuda[:N]", device);
}
}  // namespace

std::unique_ptr<Ops> make_ops(const std::string& device) {
  std::unique_ptr<Ops> ops = make_backend(device);
  if (kv_cache_dtype) ops->set_kv_dtype(*kv_cache_dtype);
  return ops;
}

std::string rank_device(const std::string& device, int rank) {
  if (!(device == "cuda" || device.starts_with("cuda:"))) return device;
  return fmt::format("cuda:{}", cuda_index(device) + rank);
}

bool leads_the_group() { return processes.index == 0; }

bool follow_the_group(LoadedModel& m) {
  if (processes.count == 1) return false;
  auto* group = dynamic_cast<models::TensorParallelModel*>(m.device.model.get());
  QINFER_CHECK(group != nullptr, "--tp-processes {}: the model did not load as a tensor-parallel group",
               processes.count);
  if (processes.index == 0) {
    group->lead();
    return false;
  }
  log_info("tensor parallel: process {} follows process 0 until it stops", processes.index);
  group->follow();
  return true;
}

std::unique_ptr<models::TensorParallelModel> load_ranks(const models::Checkpoint& checkpoint, const std::string& device,
                                                        int ranks) {
  models::Placement placement;
  int local = ranks;
  if (processes.count > 1) {
    QINFER_CHECK(ranks % processes.count == 0, "--tensor-parallel {}: not divisible over --tp-processes {}", ranks,
                 processes.count);
    QINFER_CHECK(!processes.address.empty(), "--tp-processes {}: needs --tp-address HOST:PORT (where process 0 "
                 "listens)", processes.count);
    local = ranks / processes.count;
    placement.first_rank = processes.index * local;
    placement.size = ranks;
  }
  // Every rank's backend first, so that a bad device fails before any thread starts.
  std::vector<std::unique_ptr<Ops>> ops;
  std::vector<int> gpus;
  for (int r = 0; r < local; ++r) {
    const std::string d = rank_device(device, r);
    ops.push_back(make_ops(d));
    if (ops.back()->device() == Device::cuda) gpus.push_back(std::stoi(d.substr(5)));
  }
  if (processes.count > 1) {
    log_info("tensor parallel: process {} of {} (ranks {}..{} of {}), meeting at {}", processes.index,
             processes.count, placement.first_rank, placement.first_rank + local - 1, ranks, processes.address);
    placement.processes = parallel::ProcessGroup::join(processes.address, processes.index, processes.count);
    // Every process runs the same command; process 0 speaks for the group on standard output.
    if (processes.index != 0) {
      std::fflush(stdout);
      const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (null >= 0) dup2(null, STDOUT_FILENO), close(null);
    }
  }
  return std::make_unique<models::TensorParallelModel>(checkpoint, std::move(ops), std::move(gpus),
                                                       std::move(placement));
}

DeviceModel load_device_model(const models::Checkpoint& checkpoint, const std::string& device, int tensor_parallel) {
  QINFER_CHECK(tensor_parallel >= 1, "--tensor-parallel {}: must be at least 1", tensor_parallel);
  if (tensor_parallel > 1 || processes.count > 1) return {nullptr, load_ranks(checkpoint, device, tensor_parallel)};
  DeviceModel m{make_ops(device), nullptr};
  m.model = std::make_unique<models::Model>(checkpoint, *m.ops);
  return m;
}

models::Checkpoint load_checkpoint(const std::string& dir) {
  models::Checkpoint checkpoint = models::open_checkpoint(dir);
  if (yarn_flag) io::apply_yarn(checkpoint.config.text, yarn_flag->factor, yarn_flag->original);
  return checkpoint;
}

std::string precision_name() { return exact_precision ? "exact" : "fast"; }

void add_device_flags(CLI::App* cmd, int& tensor_parallel) {
  cmd->add_option("--tensor-parallel", tensor_parallel,
                  "split the model over N ranks: threads sharing the host (cpu, ref), or GPUs cuda:K..K+N-1 over "
                  "NCCL (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp-processes", processes.count,
                  "run the --tensor-parallel ranks in P processes (one per host), each started with this same command on "
                  "its own GPUs (or one cpu rank each); process 0 prints, and serves the requests of serve and chat "
                  "while the others follow it (default 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp-process", processes.index, "this process's index in 0..P-1 (--tp-processes)")
      ->check(CLI::Range(0, 63));
  cmd->add_option("--tp-address", processes.address,
                  "HOST:PORT where process 0 listens and the others connect (--tp-processes)");
  cmd->add_option_function<std::string>(
         "--precision", [](const std::string& value) { exact_precision = value == "exact"; },
         "cuda prompt processing: fast (default; bf16 operands in its GEMMs and attention, as PyTorch and vLLM run a "
         "bf16 model) or exact (bf16-pair GEMMs and TF32 attention, within ~1e-3 of an f32 forward; 2-3x the "
         "GEMM work). Decode steps are exact either way, except one-token MLX affine 4/8-bit products: fast reads "
         "x there as 16-bit integers per chunk of 16-32 elements (within ~1.5e-5 of the chunk's largest)")
      ->check(CLI::IsMember({"fast", "exact"}));
  cmd->add_option_function<std::string>(
         "--kv-cache-dtype",
         [](const std::string& value) {
           kv_cache_dtype = value == "auto"       ? std::nullopt
                            : value == "bfloat16" ? std::optional<DType>(DType::bf16)
                                                  : std::optional<DType>(DType::f32);
         },
         "elements of the KV cache: auto (default; bfloat16 on cuda with --precision fast, as PyTorch and vLLM keep a "
         "bf16 model's cache, else float32), bfloat16 (half the memory and the bytes a decode step reads) or float32")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32"}));
  cmd->add_option_function<std::string>(
         "--rope-scaling", [](const std::string& value) { yarn_flag = parse_rope_scaling(value); },
         "yarn:FACTOR[:ORIGINAL]: YaRN rotary scaling by FACTOR over the model's original context (ORIGINAL "
         "positions, else config.json's original_max_position_embeddings, else its max_position_embeddings), as "
         "the Qwen model cards describe (Qwen3: yarn:4:32768); the model then reads FACTOR x that many positions "
         "(default: config.json's rope scaling)");
}

std::unique_ptr<LoadedModel> load_model(const std::string& dir, bool need_template, const std::string& device,
                                        int tensor_parallel) {
  models::Checkpoint checkpoint = load_checkpoint(dir);
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir);
  auto loaded = std::unique_ptr<LoadedModel>(
      new LoadedModel{dir, std::move(checkpoint), {}, std::move(tok), std::nullopt, {}});
  loaded->device = load_device_model(loaded->checkpoint, device, tensor_parallel);
  if (need_template) loaded->chat_template = tokenizer::ChatTemplate::from_model_dir(dir);
  loaded->stop_ids = engine::stop_ids(dir, loaded->checkpoint.config, loaded->tokenizer);
  return loaded;
}

void add_generation_flags(CLI::App* cmd, GenerationFlags& f) {
  SamplingParams& s = f.options.sampling;
  s.temperature = 0.7f;
  s.top_p = 0.8f;
  s.top_k = 20;
  cmd->add_option("-n,--max-tokens", f.options.max_tokens, "most tokens to generate (default 512)");
  cmd->add_option("--temp", s.temperature, "temperature; 0 = greedy (default 0.7)");
  cmd->add_option("--top-p", s.top_p, "nucleus sampling mass (default 0.8)");
  cmd->add_option("--top-k", s.top_k, "keep the k most likely tokens; 0 = off (default 20)");
  cmd->add_option("--min-p", s.min_p, "drop tokens below min-p x the top probability (default 0)");
  cmd->add_option("--repetition-penalty", s.repetition_penalty, "HF repetition penalty (default 1 = off)");
  cmd->add_option("--presence-penalty", s.presence_penalty, "OpenAI presence penalty (default 0)");
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "OpenAI frequency penalty (default 0)");
  cmd->add_option("--seed", s.seed, "sampling seed (default 0)");
  cmd->add_option("--stop", f.options.stop, "stop string (repeatable)");
  cmd->add_option("--think", f.think, "show or hide <think> reasoning in the output (default show)")
      ->check(CLI::IsMember({"show", "hide"}));
  cmd->add_flag("!--no-thinking", f.thinking, "ask the template to turn thinking off (enable_thinking=false)");
  cmd->add_option("--device", f.device, "cpu (default), ref or cuda[:N]");
  add_device_flags(cmd, f.tensor_parallel);
}

ReplyPrinter::ReplyPrinter(bool hide, std::string_view prompt) {
  if (hide) reasoning_.emplace(engine::prompt_opens_reasoning(prompt));
}

void ReplyPrinter::operator()(std::string_view chunk) {
  write(reasoning_ ? reasoning_->push(chunk).content : std::string(chunk));
}

void ReplyPrinter::finish() {
  if (reasoning_) write(reasoning_->finish().content);
}

void ReplyPrinter::write(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace qinfer::cli
