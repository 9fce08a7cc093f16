// `qinfer quantize`: an MLX-quantized copy of a checkpoint, streamed tensor by tensor.
//   qinfer quantize --model IN --out OUT [--bits 4] [--group-size 64] [--mode affine|mxfp4|nvfp4|mxfp8]
//                   [--recipe mixed_2_6|mixed_3_4|mixed_3_6|mixed_4_6]
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/progress.h"
#include "models/quantize.h"

namespace qinfer::cli {

void add_quantize_command(CLI::App& app) {
  struct Options {
    std::string model, out, mode = "affine", recipe;
    int bits = 0, group_size = 0;
    double shard_gb = 5.0;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write an MLX-quantized copy of a checkpoint (MLX naming and layout)");
  cmd->add_option("--model", o->model,
                  "input checkpoint folder (HF or MLX-converted, unquantized), or a Hugging Face name "
                  "org/name[@revision]")->required();
  add_hub_flags(cmd);
  cmd->add_option("--out", o->out, "output folder")->required();
  cmd->add_option("--mode", o->mode, "affine (default), mxfp4, nvfp4 or mxfp8");
  cmd->add_option("--bits", o->bits, "affine bits: 2, 3, 4 (default), 5, 6 or 8");
  cmd->add_option("--group-size", o->group_size, "affine group size: 32, 64 (default) or 128");
  cmd->add_option("--recipe", o->recipe, "mixed-precision recipe: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6");
  cmd->add_option("--shard-gb", o->shard_gb, "largest output shard, in GB (default 5)");
  cmd->callback([o] {
    models::QuantizeOptions options;
    options.layout.mode = quant::parse_mode(o->mode);
    const quant::ModeTraits& traits = quant::traits(options.layout.mode);
    options.layout.bits = o->bits ? o->bits : (traits.bits ? traits.bits : 4);
    options.layout.group_size = o->group_size ? o->group_size : (traits.group_size ? traits.group_size : 64);
    options.recipe = o->recipe;
    options.shard_bytes = static_cast<uint64_t>(o->shard_gb * 1e9);
    const models::QuantizeReport r = models::quantize_checkpoint(model_folder(o->model), o->out, options);
    fmt::print("{}: {} tensors quantized, {} kept, {} -> {} in {} shard(s)\n", o->out, r.quantized, r.kept,
               format_bytes(r.bytes_in), format_bytes(r.bytes_out), r.shards);
  });
}

}  // namespace qinfer::cli
