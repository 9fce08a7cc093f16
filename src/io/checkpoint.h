#pragma once
// Checkpoint normalization: the stored tensors of a checkpoint (HF or MLX-converted, dense or
// MLX-quantized) mapped onto one canonical name space, without reading tensor bytes. The plan says,
// for every canonical tensor, which stored bytes make it up and what is due at load (a +1 on a
// zero-centred norm gain stored as γ−1); families describe their rules, this file applies them.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"

namespace qinfer::io {

enum class Generation { hf, mlx };
std::string_view name(Generation generation);

// Text tensors feed the language model; MTP tensors are kept for drafting; vision tensors are set
// aside for the vision tower.
enum class TensorGroup { text, mtp, vision };
std::string_view name(TensorGroup group);

struct Piece {
  const StoredTensor* source;
  uint64_t offset;  // within the source tensor's bytes
  uint64_t nbytes;
};

struct CanonicalTensor {
  std::string name;
  TensorGroup group = TensorGroup::text;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;  // concatenated in order
  bool add_one = false;       // zero-centred norm gain stored as γ−1: +1 at load
  std::optional<QuantSpec> quant;  // set on packed weights and their scales / biases
  std::vector<std::string> sources;
  std::string how;  // what was done beyond a rename, for the plan ("stacked 8 experts", ...)

  uint64_t nbytes() const;
  std::vector<std::byte> read_bytes() const;
  // `nbytes` bytes starting `offset` bytes into the tensor (across pieces): row ranges for streaming.
  std::vector<std::byte> read_range(uint64_t offset, uint64_t nbytes) const;
  // Values as f32 with any due +1 applied; float dtypes only.
  std::vector<float> read_f32() const;
};

struct NormalizationPlan {
  Generation generation = Generation::hf;
  bool zero_centred_norms = false;  // the family has (1+w) norms at all
  bool shift_norms = false;         // ... and this artifact stores them as γ−1
  std::string shift_reason;
  std::map<std::string, CanonicalTensor, std::less<>> tensors;
  std::vector<std::pair<std::string, std::string>> dropped;  // stored name, why
  std::vector<std::string> renames;  // "from-prefix -> to-prefix" rules that applied
  std::vector<std::string> notes;

  const CanonicalTensor* find(std::string_view name) const;
  const CanonicalTensor& at(std::string_view name) const;
  size_t count(TensorGroup group) const;
};

// What a family expects to find after normalization.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;  // logical shape (unpacked)
  bool quantizable = false;    // a Linear / Embedding / SwitchLinear weight MLX may quantize
  // Per dimension, the config.json fields it comes from ("num_key_value_heads x head_dim"), so a
  // shape that disagrees with the config names the field.
  std::vector<std::string> dims = {};
};

// The family-specific facts normalization needs.
struct SanitizeRules {
  bool vlm_naming = false;          // model.language_model.* / language_model.* / model.visual.* / vision_tower.*
  bool zero_centred_norms = false;  // Qwen3-Next / Qwen3.5: (1+w) gains, stored γ−1 by HF
  // Expected tensors of the text model (and the MTP head when `with_mtp`).
  std::vector<ExpectedTensor> (*expected)(const TextConfig& config, bool with_mtp) = nullptr;
};

NormalizationPlan normalize_checkpoint(const ModelConfig& config, const TensorStore& store, const SanitizeRules& rules);

// Canonical names of zero-centred norm gains (HF stores γ−1 for these; linear_attn.norm is not one).
bool is_zero_centred_norm(std::string_view canonical_name);

}  // namespace qinfer::io
