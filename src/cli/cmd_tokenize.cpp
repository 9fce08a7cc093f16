// `qinfer tokenize`: text to token ids and back, line by line (the tokenizer's oracle interface).
//   qinfer tokenize --model DIR [--decode] [--special] < lines
// Encoding reads one JSON string per line and writes one JSON array of ids per line; --decode reads
// arrays and writes strings. DIR needs only tokenizer.json (and tokenizer_config.json).
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::cli {
namespace {

using io::json;

json parse_line(const std::string& line, size_t number) {
  if (io::json_too_deep(line)) fail("stdin line {}: nested deeper than {} levels", number, io::kMaxJsonDepth);
  try {
    return json::parse(line);
  } catch (const json::parse_error& e) {
    // nlohmann also rejects ill-formed UTF-8 and unpaired surrogate escapes here.
    fail("stdin line {}: not valid JSON: {}", number, e.what());
  }
}

std::string encode_line(const tokenizer::Tokenizer& tok, const json& value, size_t number, bool special) {
  QINFER_CHECK(value.is_string(), "stdin line {}: expected a JSON string, got {}", number, value.type_name());
  return json(tok.encode(value.get_ref<const std::string&>(), special)).dump();
}

std::string decode_line(const tokenizer::Tokenizer& tok, const json& value, size_t number, bool special) {
  QINFER_CHECK(value.is_array(), "stdin line {}: expected a JSON array of token ids, got {}", number,
               value.type_name());
  std::vector<int32_t> ids;
  for (const json& id : value) {
    QINFER_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < tok.vocab_size(),
                 "stdin line {}: {} is not a token id (the vocabulary has {})", number, id.dump(), tok.vocab_size());
    ids.push_back(id.get<int32_t>());
  }
  return json(tok.decode(ids, /*skip_special_tokens=*/!special)).dump();
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string model;
    bool decode = false, special = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Token ids for JSON strings on stdin, one per line (--decode: text for JSON arrays of ids)");
  cmd->add_option("--model", o->model, "folder with tokenizer.json (and tokenizer_config.json), or a Hugging Face name "
                  "org/name[@revision]")->required();
  add_hub_flags(cmd);
  cmd->add_flag("--decode", o->decode, "read JSON arrays of ids, write JSON strings");
  cmd->add_flag("--special", o->special,
                "encoding: add the tokenizer's own special tokens (its post-processor's BOS/EOS; Qwen adds none); "
                "decoding: keep special tokens in the text (they are dropped by default)");
  cmd->callback([o] {
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(model_folder(o->model));
    std::ios::sync_with_stdio(false);
    std::string line;
    for (size_t number = 1; std::getline(std::cin, line); ++number) {
      const json value = parse_line(line, number);
      const bool special = o->special;
      std::cout << (o->decode ? decode_line(tok, value, number, special) : encode_line(tok, value, number, special))
                << '\n'
                << std::flush;  // one answer per line, so a caller can drive it through a pipe
    }
  });
}

}  // namespace qinfer::cli
