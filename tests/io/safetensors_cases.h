#pragma once
// Small safetensors files, one per validation rule of parse_safetensors plus a few valid ones.
// safetensors_test.cpp checks the error each broken case gives; tests/fuzz/make_corpus.cpp writes
// them to tests/fuzz/corpus/ as the fuzzer's seeds (a test checks the committed copies match).
#include <string>
#include <vector>

#include "../support/safetensors_writer.h"
#include "io/safetensors.h"

namespace qinfer::testing {

struct SafetensorsCase {
  std::string name;                 // corpus file: <name>.safetensors
  std::vector<std::byte> bytes;
  std::vector<std::string> errors;  // substrings of the expected Error message; empty when valid
};

inline std::vector<SafetensorsCase> safetensors_cases() {
  auto file = [](std::string_view header, size_t payload_bytes = 0) {
    return safetensors_bytes(header, std::vector<std::byte>(payload_bytes, std::byte{0x3c}));
  };
  // A header holding one tensor "w" with the given entry body.
  auto one = [&](std::string_view body, size_t payload_bytes = 0) {
    return file(R"({"w":{)" + std::string(body) + "}}", payload_bytes);
  };
  const std::string f32x2 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";

  std::vector<SafetensorsCase> cases = {
      // --- the 8-byte length prefix
      {"empty_file", {}, {"0 bytes", "too short"}},
      {"short_file", std::vector<std::byte>(5), {"5 bytes", "too short"}},
      {"header_past_eof", safetensors_bytes(100, "{}"), {"header length 100", "past the end"}},
      {"header_over_limit", safetensors_bytes(io::kMaxHeaderBytes + 1, "{}"),
       {"header length 104857601", "exceeds"}},
      {"header_length_max", safetensors_bytes(~uint64_t{0}, "{}"), {"exceeds"}},
      // --- JSON shape of the header
      {"invalid_json", file(R"({"w":{"dtype":)"), {"header is not valid JSON"}},
      {"invalid_utf8", file("{\"\xff\":{}}"), {"header is not valid JSON"}},
      {"header_not_object", file("[1,2]"), {"header is a JSON array", "expected an object"}},
      {"entry_not_object", file(R"({"w":5})"), {"tensor 'w'", "JSON number", "expected an object"}},
      {"missing_dtype", one(R"("shape":[2],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "missing key 'dtype'"}},
      {"missing_shape", one(R"("dtype":"F32","data_offsets":[0,8])", 8),
       {"tensor 'w'", "missing key 'shape'"}},
      {"missing_offsets", one(R"("dtype":"F32","shape":[2])", 8),
       {"tensor 'w'", "missing key 'data_offsets'"}},
      {"extra_key", one(f32x2 + R"(,"offset":0)", 8), {"tensor 'w'", "unexpected key 'offset'"}},
      {"duplicate_tensor",
       file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            16),
       {"'w' appears twice in the header"}},
      {"duplicate_key", one(f32x2 + R"(,"dtype":"F16")", 8),
       {"'w' in the header has key 'dtype' twice"}},
      // --- dtype and shape
      {"unknown_dtype", one(R"("dtype":"F12","shape":[2],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "unknown dtype 'F12'"}},
      {"lowercase_dtype", one(R"("dtype":"f32","shape":[2],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "unknown dtype 'f32'"}},
      {"dtype_not_string", one(R"("dtype":32,"shape":[2],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "dtype is a JSON number"}},
      {"shape_not_array", one(R"("dtype":"F32","shape":2,"data_offsets":[0,8])", 8),
       {"tensor 'w'", "shape is a JSON number"}},
      {"shape_negative", one(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "shape [-2] is not a list of non-negative integers"}},
      {"shape_float", one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "not a list of non-negative integers"}},
      {"shape_string", one(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "not a list of non-negative integers"}},
      {"shape_extent_too_big",
       one(R"("dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "extent above 2^63 - 1"}},
      {"shape_numel_overflow",
       one(R"("dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "more elements than fit in 64 bits"}},
      {"shape_bytes_overflow",
       one(R"("dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "larger than 2^64 bytes"}},
      // --- data_offsets
      {"offsets_not_array", one(R"("dtype":"F32","shape":[2],"data_offsets":8)", 8),
       {"tensor 'w'", "data_offsets 8 is not a pair"}},
      {"offsets_one", one(R"("dtype":"F32","shape":[2],"data_offsets":[8])", 8),
       {"tensor 'w'", "data_offsets [8] is not a pair"}},
      {"offsets_three", one(R"("dtype":"F32","shape":[2],"data_offsets":[0,8,8])", 8),
       {"tensor 'w'", "is not a pair"}},
      {"offsets_negative", one(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])", 8),
       {"tensor 'w'", "is not a pair of non-negative integers"}},
      {"offsets_reversed", one(R"("dtype":"F32","shape":[0],"data_offsets":[8,0])", 8),
       {"tensor 'w'", "data_offsets [8, 0] have end before begin"}},
      {"offsets_past_end", one(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])", 8),
       {"tensor 'w'", "run past the end of the data (8 bytes)", "truncated"}},
      {"span_mismatch", one(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])", 8),
       {"tensor 'w'", "span 8 bytes", "needs 12 bytes"}},
      {"span_f4_odd", one(R"("dtype":"F4","shape":[3],"data_offsets":[0,1])", 1),
       {"tensor 'w'", "span 1 bytes", "needs 2 bytes"}},
      // --- how tensors tile the data region
      {"overlap",
       file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12),
       {"tensor 'b' (bytes [4, 12)) overlaps tensor 'a' (bytes [0, 8))"}},
      {"overlap_identical",
       file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
            8),
       {"overlaps tensor"}},
      {"overlap_empty_inside",
       file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            8),
       {"tensor 'e' (bytes [4, 4)) overlaps tensor 'a'"}},
      {"hole",
       file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            12),
       {"bytes [4, 8) of the data belong to no tensor", "before tensor 'b'"}},
      {"hole_at_start", one(R"("dtype":"F32","shape":[1],"data_offsets":[4,8])", 8),
       {"bytes [0, 4)", "before tensor 'w'"}},
      {"trailing_bytes", one(f32x2, 12), {"4 trailing bytes after the last tensor"}},
      {"trailing_bytes_no_tensors", file("{}", 3), {"3 trailing bytes"}},
      // --- __metadata__
      {"metadata_not_object", file(R"({"__metadata__":["a"]})"), {"__metadata__ is a JSON array"}},
      {"metadata_not_string", file(R"({"__metadata__":{"format":1}})"),
       {"__metadata__ 'format' is a JSON number, expected a string"}},
      {"metadata_twice", file(R"({"__metadata__":{},"__metadata__":{}})"),
       {"'__metadata__' appears twice"}},
      // --- valid files
      {"valid_empty", file("{}"), {}},
      {"valid_empty_padded", file("{}      "), {}},
      {"valid_one", one(f32x2, 8), {}},
      {"valid_scalar", one(R"("dtype":"BF16","shape":[],"data_offsets":[0,2])", 2), {}},
      {"valid_unordered",
       file(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[5,8]},)"
            R"("b":{"dtype":"F8_E8M0","shape":[1,1],"data_offsets":[4,5]},)"
            R"("c":{"dtype":"F4","shape":[7],"data_offsets":[0,4]}})",
            8),
       {}},
      {"valid_zero_sized",
       file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
            R"("b":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
            R"("c":{"dtype":"I64","shape":[3,0],"data_offsets":[4,4]},)"
            R"("d":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
            4),
       {}},
      {"valid_writer", SafetensorsWriter()
                           .metadata("format", "pt")
                           .add_filled("model.embed_tokens.weight", DType::bf16, {4, 3})
                           .add_filled("model.layers.0.mlp.experts.scales", DType::e8m0, {2, 2})
                           .add_filled("model.layers.0.mlp.experts.weight", DType::u32, {2, 1})
                           .add_filled("model.norm.weight", DType::f32, {3})
                           .add_filled("lm_head.weight", DType::f8_e4m3, {4, 3})
                           .bytes(),
       {}},
  };
  return cases;
}

}  // namespace qinfer::testing
