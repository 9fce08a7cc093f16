#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "core/error.h"
#include "io/file.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/utf8.h"

namespace qinfer::tokenizer {
namespace {

using io::json;
using io::JsonObject;

// What ByteLevel(use_regex=true) splits with (HF tokenizers' GPT-2 pattern).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

std::string describe(const json& value) {
  std::string text = value.dump();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

std::string type_of(const json& node, const std::string& where) {
  QINFER_CHECK(node.is_object(), "{}: expected an object, got {}", where, describe(node));
  auto it = node.find("type");
  QINFER_CHECK(it != node.end() && it->is_string(), "{}: missing the string field `type`", where);
  return it->get<std::string>();
}

// Code points below U+0300 are all stable under NFC, so text without them needs no normalization.
bool may_change_under_nfc(std::string_view text) {
  for (char c : text)
    if (static_cast<uint8_t>(c) >= 0xCC) return true;
  return false;
}

// normalizer: null, NFC, or a Sequence of those.
bool read_normalizer(const json& node, const std::string& where) {
  if (node.is_null()) return false;
  const std::string type = type_of(node, where);
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const json& list = node.contains("normalizers") ? node["normalizers"] : json();
    QINFER_CHECK(list.is_array(), "{}.normalizers: expected an array", where);
    bool any = false;
    for (size_t i = 0; i < list.size(); ++i)
      any |= read_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i));
    return any;
  }
  fail("{}: normalizer type {:?} is not supported (qinfer supports null, NFC, or a Sequence of NFC)", where, type);
}

bool bool_field(const json& node, const char* key, bool fallback, const std::string& where) {
  auto it = node.find(key);
  if (it == node.end() || it->is_null()) return fallback;
  QINFER_CHECK(it->is_boolean(), "{}.{}: expected true or false, got {}", where, key, describe(*it));
  return it->get<bool>();
}

std::string string_field(const json& node, const char* key, const std::string& where) {
  auto it = node.find(key);
  QINFER_CHECK(it != node.end() && it->is_string(), "{}.{}: expected a string", where, key);
  return it->get<std::string>();
}

// pre_tokenizer: Split(Regex, Isolated) steps and a final ByteLevel, possibly inside a Sequence.
void read_pre_tokenizer(const json& node, const std::string& where, std::vector<SplitRegex>& splits,
                        bool& byte_level) {
  QINFER_CHECK(!node.is_null(), "{}: is null; qinfer needs a byte-level pre-tokenizer", where);
  const std::string type = type_of(node, where);
  QINFER_CHECK(!byte_level, "{}: a {} step after ByteLevel is not supported", where, type);
  if (type == "Sequence") {
    const json& list = node.contains("pretokenizers") ? node["pretokenizers"] : json();
    QINFER_CHECK(list.is_array(), "{}.pretokenizers: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), splits, byte_level);
  } else if (type == "Split") {
    const std::string behavior = string_field(node, "behavior", where);
    QINFER_CHECK(behavior == "Isolated", "{}.behavior: {:?} is not supported (only Isolated)", where, behavior);
    QINFER_CHECK(!bool_field(node, "invert", false, where), "{}.invert: true is not supported", where);
    const json& pattern = node.contains("pattern") ? node["pattern"] : json();
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      splits.emplace_back(pattern["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      splits.emplace_back("\\Q" + pattern["String"].get<std::string>() + "\\E", where + ".pattern.String");
    } else {
      fail("{}.pattern: expected {{\"Regex\": ...}} or {{\"String\": ...}}, got {}", where, describe(pattern));
    }
  } else if (type == "ByteLevel") {
    QINFER_CHECK(!bool_field(node, "add_prefix_space", false, where), "{}.add_prefix_space: true is not supported",
                 where);
    if (bool_field(node, "use_regex", true, where)) splits.emplace_back(kGpt2Pattern, where + " (GPT-2 regex)");
    byte_level = true;
  } else {
    fail("{}: pre-tokenizer type {:?} is not supported (qinfer supports Split with a regex, ByteLevel, and a "
         "Sequence of them)", where, type);
  }
}

std::string special_token_string(const json& node, const std::string& where) {
  if (node.is_null()) return "";
  if (node.is_string()) return node.get<std::string>();
  QINFER_CHECK(node.is_object() && node.contains("content") && node["content"].is_string(),
               "{}: expected a string or an object with `content`, got {}", where, describe(node));
  return node["content"].get<std::string>();
}

AddedToken read_added_token(const json& node, const std::string& where) {
  QINFER_CHECK(node.is_object(), "{}: expected an object, got {}", where, describe(node));
  AddedToken t;
  t.content = string_field(node, "content", where);
  QINFER_CHECK(!t.content.empty() && is_valid_utf8(t.content), "{}.content: must be non-empty UTF-8", where);
  t.special = bool_field(node, "special", false, where);
  t.single_word = bool_field(node, "single_word", false, where);
  t.lstrip = bool_field(node, "lstrip", false, where);
  t.rstrip = bool_field(node, "rstrip", false, where);
  t.normalized = bool_field(node, "normalized", !t.special, where);
  return t;
}

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> bytes;  // per id: what the ByteLevel decoder makes of the token
  std::vector<uint8_t> special;    // per id
  StringMap<int32_t> by_bytes;     // raw bytes of byte-level vocabulary entries
  StringMap<int32_t> by_string;    // added token contents and vocabulary entries outside the byte alphabet
  std::vector<AddedToken> added;
  std::unique_ptr<Bpe> bpe;
  bool ignore_merges = false;
  bool nfc = false;
  std::vector<SplitRegex> splits;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  std::vector<int32_t> template_before, template_after;  // post-processor ids around the text
  TokenizerConfig config;

  void read_model(const json& model, const std::string& where);
  void read_post_processor(const json& node, const std::string& where, bool& seen_template);
  void read_config(const json& config_json, const std::string& label);
  void finish();

  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_words(std::string_view text, std::vector<int32_t>& ids) const;
};

void Tokenizer::Impl::read_model(const json& model, const std::string& where) {
  QINFER_CHECK(model.is_object(), "{}: expected an object", where);
  if (model.contains("type")) {
    const std::string type = string_field(model, "type", where);
    QINFER_CHECK(type == "BPE", "{}.type: {:?} is not supported (only BPE)", where, type);
  }
  QINFER_CHECK(!bool_field(model, "byte_fallback", false, where), "{}.byte_fallback: true is not supported", where);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    QINFER_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()),
                 "{}.{}: {} is not supported (only empty)", where, key, it == model.end() ? "" : describe(*it));
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null())
    QINFER_CHECK(it->is_number() && it->get<double>() == 0.0, "{}.dropout: {} is not supported", where, describe(*it));
  ignore_merges = bool_field(model, "ignore_merges", false, where);

  const json& vocab = model.contains("vocab") ? model["vocab"] : json();
  QINFER_CHECK(vocab.is_object(), "{}.vocab: expected an object of token -> id", where);
  by_bytes.reserve(vocab.size());
  std::string raw;
  for (const auto& [token, id_node] : vocab.items()) {
    QINFER_CHECK(id_node.is_number_integer() && id_node.get<int64_t>() >= 0 && id_node.get<int64_t>() < INT32_MAX,
                 "{}.vocab[{:?}]: expected a non-negative id, got {}", where, token, describe(id_node));
    const auto id = static_cast<int32_t>(id_node.get<int64_t>());
    if (static_cast<size_t>(id) >= bytes.size()) bytes.resize(static_cast<size_t>(id) + 1);
    QINFER_CHECK(bytes[id].empty(), "{}.vocab[{:?}]: id {} is used twice", where, token, id);
    if (byte_level_to_bytes(token, raw)) {
      bytes[id] = raw;
      by_bytes.emplace(raw, id);
    } else {  // HF's ByteLevel decoder emits such a token's own UTF-8
      bytes[id] = token;
      by_string.emplace(token, id);
    }
  }

  std::array<int32_t, 256> byte_tokens;
  for (int b = 0; b < 256; ++b) {
    auto it = by_bytes.find(std::string(1, static_cast<char>(b)));
    QINFER_CHECK(it != by_bytes.end(), "{}.vocab: has no token for byte 0x{:02X}; not a byte-level BPE vocabulary",
                 where, b);
    byte_tokens[b] = it->second;
  }

  const json& merges = model.contains("merges") ? model["merges"] : json();
  QINFER_CHECK(merges.is_array(), "{}.merges: expected an array", where);
  std::vector<Merge> list;
  list.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string_view left, right;
    if (m.is_string()) {  // legacy "a b" form
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      QINFER_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                   "{}.merges[{}]: expected \"left right\", got {}", where, i, describe(m));
      left = std::string_view(s).substr(0, space), right = std::string_view(s).substr(space + 1);
    } else {
      QINFER_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                   "{}.merges[{}]: expected \"left right\" or [\"left\", \"right\"], got {}", where, i, describe(m));
      left = m[0].get_ref<const std::string&>(), right = m[1].get_ref<const std::string&>();
    }
    const auto lookup = [&](std::string_view token) -> int32_t {
      if (byte_level_to_bytes(token, raw)) {
        if (auto it = by_bytes.find(raw); it != by_bytes.end()) return it->second;
      } else if (auto it = by_string.find(token); it != by_string.end()) {
        return it->second;
      }
      fail("{}.merges[{}]: {:?} is not in the vocabulary", where, i, token);
    };
    joined.assign(left).append(right);
    list.push_back({lookup(left), lookup(right), lookup(joined)});
  }
  bpe = std::make_unique<Bpe>(byte_tokens, list);
}

void Tokenizer::Impl::read_post_processor(const json& node, const std::string& where, bool& seen_template) {
  if (node.is_null()) return;
  const std::string type = type_of(node, where);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = node.contains("processors") ? node["processors"] : json();
    QINFER_CHECK(list.is_array(), "{}.processors: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), seen_template);
    return;
  }
  QINFER_CHECK(type == "TemplateProcessing",
               "{}: post-processor type {:?} is not supported (qinfer supports ByteLevel, TemplateProcessing and a "
               "Sequence of them)", where, type);
  QINFER_CHECK(!seen_template, "{}: a second TemplateProcessing is not supported", where);
  seen_template = true;
  const json& single = node.contains("single") ? node["single"] : json();
  const json& specials = node.contains("special_tokens") ? node["special_tokens"] : json::object();
  QINFER_CHECK(single.is_array(), "{}.single: expected an array", where);
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item = fmt::format("{}.single[{}]", where, i);
    const json& piece = single[i];
    if (piece.contains("Sequence")) {
      const std::string id = string_field(piece["Sequence"], "id", item + ".Sequence");
      QINFER_CHECK(id == "A" && !seen_sequence, "{}: only one sequence, $A, is supported in a single template", item);
      seen_sequence = true;
    } else if (piece.contains("SpecialToken")) {
      const std::string name = string_field(piece["SpecialToken"], "id", item + ".SpecialToken");
      QINFER_CHECK(specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array(),
                   "{}: special token {:?} has no ids in {}.special_tokens", item, name, where);
      for (const json& id : specials[name]["ids"]) {
        QINFER_CHECK(id.is_number_integer(), "{}.special_tokens[{:?}].ids: expected integers", where, name);
        (seen_sequence ? template_after : template_before).push_back(id.get<int32_t>());
      }
    } else {
      fail("{}: expected a Sequence or a SpecialToken, got {}", item, describe(piece));
    }
  }
  QINFER_CHECK(seen_sequence, "{}.single: has no $A", where);
}

void Tokenizer::Impl::read_config(const json& c, const std::string& label) {
  const JsonObject top(c, label);
  if (auto it = c.find("chat_template"); it != c.end() && !it->is_null()) {
    if (it->is_string()) {
      config.chat_template = it->get<std::string>();
    } else {  // a list of named templates: the one named "default"
      QINFER_CHECK(it->is_array(), "{}: chat_template: expected a string or a list of named templates", label);
      for (const json& named : *it)
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template"))
          config.chat_template = named["template"].get<std::string>();
      QINFER_CHECK(!config.chat_template.empty(), "{}: chat_template: no template is named \"default\"", label);
    }
  }
  config.bos_token = special_token_string(c.value("bos_token", json()), top.where("bos_token"));
  config.eos_token = special_token_string(c.value("eos_token", json()), top.where("eos_token"));
  config.pad_token = special_token_string(c.value("pad_token", json()), top.where("pad_token"));
  config.unk_token = special_token_string(c.value("unk_token", json()), top.where("unk_token"));
  if (auto it = c.find("additional_special_tokens"); it != c.end() && !it->is_null()) {
    QINFER_CHECK(it->is_array(), "{}: expected an array", top.where("additional_special_tokens"));
    for (size_t i = 0; i < it->size(); ++i)
      config.additional_special_tokens.push_back(
          special_token_string((*it)[i], fmt::format("{}[{}]", top.where("additional_special_tokens"), i)));
  }
  // added_tokens_decoder repeats tokenizer.json's added tokens; it may add more, never contradict.
  if (auto it = c.find("added_tokens_decoder"); it != c.end() && !it->is_null()) {
    QINFER_CHECK(it->is_object(), "{}: expected an object of id -> token", top.where("added_tokens_decoder"));
    for (const auto& [key, node] : it->items()) {
      const std::string where = fmt::format("{}[{:?}]", top.where("added_tokens_decoder"), key);
      int32_t id = -1;
      try {
        size_t used = 0;
        id = std::stoi(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      QINFER_CHECK(id >= 0, "{}: the key must be a token id", where);
      AddedToken token = read_added_token(node, where);
      token.id = id;
      auto same = std::find_if(added.begin(), added.end(), [&](const AddedToken& t) { return t.id == id; });
      if (same == added.end()) {
        added.push_back(token);
      } else {
        QINFER_CHECK(same->content == token.content, "{}: content {:?} differs from tokenizer.json's {:?} for id {}",
                     where, token.content, same->content, id);
      }
    }
  }
  // transformers registers the configured special tokens as special in the backend tokenizer.
  for (AddedToken& t : added) {
    const auto& extra = config.additional_special_tokens;
    if (t.content == config.bos_token || t.content == config.eos_token || t.content == config.pad_token ||
        t.content == config.unk_token || std::find(extra.begin(), extra.end(), t.content) != extra.end())
      t.special = true;
  }
}

void Tokenizer::Impl::finish() {
  std::vector<AddedTokenPattern> raw, normalized;
  std::string mapped;
  for (const AddedToken& t : added) {
    if (static_cast<size_t>(t.id) >= bytes.size()) bytes.resize(static_cast<size_t>(t.id) + 1);
    // HF's ByteLevel decoder maps an added token like any other when all its characters are in the
    // byte alphabet ("café" decodes to "caf\xE9"), and copies its UTF-8 otherwise.
    bytes[t.id] = byte_level_to_bytes(t.content, mapped) ? mapped : t.content;
    by_string[t.content] = t.id;
  }
  special.assign(bytes.size(), 0);
  // Special tokens first: among identical contents HF matches the special one.
  for (int pass = 0; pass < 2; ++pass) {
    for (const AddedToken& t : added) {
      if (t.special != (pass == 0)) continue;
      special[t.id] = t.special;
      AddedTokenPattern p{t.content, t.id, t.single_word, t.lstrip, t.rstrip};
      if (t.normalized) {
        if (nfc) p.text = tokenizer::nfc(p.text);
        normalized.push_back(std::move(p));
      } else {
        raw.push_back(std::move(p));
      }
    }
  }
  raw_matcher = AddedTokenMatcher(std::move(raw));
  normalized_matcher = AddedTokenMatcher(std::move(normalized));
  for (const auto* list : {&template_before, &template_after})
    for (int32_t id : *list)
      QINFER_CHECK(id >= 0 && size_t(id) < bytes.size(), "post_processor: special token id {} is out of range", id);
}

namespace {

// Calls on_text for the stretches between added tokens and appends the added tokens' ids.
template <typename OnText>
void split_added(const AddedTokenMatcher& matcher, std::string_view text, std::vector<int32_t>& ids, OnText on_text) {
  if (matcher.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  std::vector<AddedTokenMatcher::Match> matches;
  matcher.find(text, matches);
  size_t at = 0;
  for (const auto& m : matches) {
    if (m.start > at) on_text(text.substr(at, m.start - at));
    ids.push_back(m.id);
    at = m.end;
  }
  if (at < text.size()) on_text(text.substr(at));
}

}  // namespace

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  split_added(raw_matcher, text, ids, [&](std::string_view part) { encode_normalized(part, ids); });
}

void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<int32_t>& ids) const {
  std::string normalized;
  if (nfc && may_change_under_nfc(text)) {
    normalized = tokenizer::nfc(text);
    text = normalized;
  }
  split_added(normalized_matcher, text, ids, [&](std::string_view part) { encode_words(part, ids); });
}

void Tokenizer::Impl::encode_words(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> pieces, next;
  pieces.assign(1, text);
  for (const SplitRegex& regex : splits) {
    next.clear();
    for (std::string_view piece : pieces) regex.split(piece, next);
    std::swap(pieces, next);
  }
  for (std::string_view word : pieces) {
    if (ignore_merges) {
      if (auto it = by_bytes.find(word); it != by_bytes.end()) {
        ids.push_back(it->second);
        continue;
      }
    }
    bpe->encode(word, ids);
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(const json& tokenizer_json, const std::string& label, const json* config,
                               const std::string& config_label) {
  QINFER_CHECK(tokenizer_json.is_object(), "{}: expected a JSON object", label);
  auto impl = std::make_unique<Impl>();
  const auto field = [&](const char* key) -> const json& {
    static const json null;
    auto it = tokenizer_json.find(key);
    return it == tokenizer_json.end() ? null : *it;
  };
  impl->read_model(field("model"), label + ": model");

  const json& added = field("added_tokens");
  QINFER_CHECK(added.is_null() || added.is_array(), "{}: added_tokens: expected an array", label);
  for (size_t i = 0; added.is_array() && i < added.size(); ++i) {
    const std::string where = fmt::format("{}: added_tokens[{}]", label, i);
    AddedToken token = read_added_token(added[i], where);
    QINFER_CHECK(added[i].contains("id") && added[i]["id"].is_number_integer() && added[i]["id"].get<int64_t>() >= 0 &&
                     added[i]["id"].get<int64_t>() < INT32_MAX,
                 "{}.id: expected a non-negative integer", where);
    token.id = added[i]["id"].get<int32_t>();
    impl->added.push_back(std::move(token));
  }

  impl->nfc = read_normalizer(field("normalizer"), label + ": normalizer");
  bool byte_level = false;
  read_pre_tokenizer(field("pre_tokenizer"), label + ": pre_tokenizer", impl->splits, byte_level);
  bool seen_template = false;
  impl->read_post_processor(field("post_processor"), label + ": post_processor", seen_template);
  const json& decoder = field("decoder");
  QINFER_CHECK(!decoder.is_null(), "{}: decoder: is null; qinfer needs the ByteLevel decoder", label);
  const std::string decoder_type = type_of(decoder, label + ": decoder");
  QINFER_CHECK(decoder_type == "ByteLevel", "{}: decoder: type {:?} is not supported (only ByteLevel)", label,
               decoder_type);

  if (config) impl->read_config(*config, config_label);
  impl->finish();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const auto tokenizer_path = dir / "tokenizer.json";
  QINFER_CHECK(std::filesystem::exists(tokenizer_path), "{}: no tokenizer.json (qinfer reads HF tokenizer.json)",
               dir.string());
  const json tokenizer_json = io::read_json_file(tokenizer_path);
  const auto config_path = dir / "tokenizer_config.json";
  std::optional<json> config;
  if (std::filesystem::exists(config_path)) config = io::read_json_file(config_path);
  Tokenizer t = from_json(tokenizer_json, tokenizer_path.string(), config ? &*config : nullptr, config_path.string());
  // Newer transformers save the template beside the config; it takes precedence there too.
  if (const auto jinja = dir / "chat_template.jinja"; std::filesystem::exists(jinja))
    t.impl_->config.chat_template = io::read_model_file(jinja);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t valid = valid_utf8_prefix(text);
  QINFER_CHECK(valid == text.size(), "text to encode is not valid UTF-8 (at byte {} of {})", valid, text.size());
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = impl_->template_before;
  impl_->encode_text(text, ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->template_after.begin(), impl_->template_after.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string joined;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    joined += token_bytes(id);
  }
  return to_valid_utf8(joined);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  QINFER_CHECK(id >= 0 && id < vocab_size(), "token id {} is out of range (vocabulary size {})", id, vocab_size());
  return impl_->bytes[id];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->by_string.find(token); it != impl_->by_string.end()) return it->second;
  std::string raw;
  if (byte_level_to_bytes(token, raw))
    if (auto it = impl_->by_bytes.find(raw); it != impl_->by_bytes.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->bytes.size()); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return "";
  pending_ += tokenizer_->token_bytes(id);
  // Everything before the last lead byte is settled: ill-formed bytes there can only become U+FFFD.
  const size_t ready = pending_.size() - incomplete_utf8_suffix(pending_);
  std::string out = to_valid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace qinfer::tokenizer
