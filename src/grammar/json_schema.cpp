#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "grammar/regex.h"
#include "grammar/utf8_text.h"

namespace qinfer::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Bounds past this are "unbounded" on their open side and refused on the other: integer ranges
// stay within int64 arithmetic (a cap of 10^(digits) - 1 never overflows).
constexpr uint64_t kMaxBoundMagnitude = 100'000'000'000'000'000ull;  // 10^17
// allOf members and $refs merged into each other: deeper than this is a cycle of merges.
constexpr int kMaxMergeDepth = 32;

// Keywords that assert nothing about the value (OpenAPI's discriminator only names the property
// its oneOf alternatives already constrain), and definition containers, reached through $ref.
const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description",  "default",         "examples",         "example",   "$schema",    "$id",
    "id",    "$comment",     "deprecated",      "readOnly",         "writeOnly", "$anchor",    "discriminator",
    "xml",   "externalDocs", "contentEncoding", "contentMediaType", "$defs",     "definitions"};
const std::set<std::string, std::less<>> kSupported = {"type",
                                                       "enum",
                                                       "const",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "prefixItems",
                                                       "additionalItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "uniqueItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "pattern",
                                                       "format",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "nullable"};

bool is_annotation(std::string_view key) { return kAnnotations.contains(key) || key.starts_with("x-"); }

// Keywords that assert something (annotations and definition containers do not).
bool has_assertions(const Json& schema) {
  if (!schema.is_object()) return schema.is_boolean() && !schema.get<bool>();
  for (const auto& [key, value] : schema.items())
    if (!is_annotation(key)) return true;
  return false;
}

}  // namespace

std::string json_pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}
namespace {

std::string child(const std::string& path, std::string_view key) { return path + "/" + json_pointer_token(key); }
std::string child(const std::string& path, size_t index) { return path + "/" + std::to_string(index); }
std::string where(const std::string& path) { return path.empty() ? "the root" : path; }

[[noreturn]] void unsupported(std::string_view keyword, const std::string& path) {
  fail("json_schema: \"{}\" at {} is not supported", keyword, where(path));
}

// Type sets: kNumber includes the integers; kInteger alone is the integers only.
enum : int { kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kString = 16, kNumber = 32, kInteger = 64 };
constexpr int kAnyType = kNull | kBoolean | kObject | kArray | kString | kNumber;

int type_bit(const Json& name, const std::string& path) {
  if (name.is_string()) {
    const std::string& s = name.get_ref<const std::string&>();
    if (s == "null") return kNull;
    if (s == "boolean") return kBoolean;
    if (s == "object") return kObject;
    if (s == "array") return kArray;
    if (s == "string") return kString;
    if (s == "number") return kNumber;
    if (s == "integer") return kInteger;
  }
  fail("json_schema: \"type\" at {} has {}, which is not a JSON Schema type", where(path), name.dump());
}

int declared_types(const Json& type, const std::string& path) {
  if (!type.is_array()) return type_bit(type, path);
  QINFER_CHECK(!type.empty(), "json_schema: \"type\" at {} is an empty list", where(path));
  int mask = 0;
  for (const Json& t : type) mask |= type_bit(t, path);
  return mask;
}

int intersect_types(int a, int b) {
  int r = a & b;
  if (((a & kNumber) && (b & kInteger)) || ((b & kNumber) && (a & kInteger))) r |= kInteger;
  return r;
}

Json types_json(int mask) {
  Json names = Json::array();
  for (auto [bit, name] : {std::pair{kNull, "null"},
                           {kBoolean, "boolean"},
                           {kObject, "object"},
                           {kArray, "array"},
                           {kString, "string"},
                           {kNumber, "number"},
                           {kInteger, "integer"}})
    if (mask & bit) names.push_back(name);
  return names.size() == 1 ? names[0] : names;
}

int json_type(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return kNull;
    case Json::value_t::boolean: return kBoolean;
    case Json::value_t::object: return kObject;
    case Json::value_t::array: return kArray;
    case Json::value_t::string: return kString;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return kNumber | kInteger;
    default: {
      const double d = v.get<double>();
      return std::isfinite(d) && d == std::floor(d) ? (kNumber | kInteger) : kNumber;
    }
  }
}

// Whether a value is of one of the types (an integral number is an integer and a number).
bool value_has_type(const Json& v, int mask) {
  const int t = json_type(v);
  if (t & kInteger) return mask & (kNumber | kInteger);
  return t & mask;
}

int64_t count_keyword(const Json& schema, std::string_view key, const std::string& path) {
  const Json& v = schema.at(key);
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    const uint64_t n = v.get<uint64_t>();
    return n > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(n);
  }
  if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() == std::floor(v.get<double>()))
    return v.get<double>() >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(v.get<double>());
  fail("json_schema: \"{}\" at {} must be a non-negative integer, not {}", key, where(path), v.dump());
}

// A decimal number exactly as written in the schema (a double as its shortest round-trip text).
struct Decimal {
  bool negative = false;
  uint64_t int_part = 0;
  std::string fraction;  // digits after the point, without trailing zeros
  bool huge = false;     // int_part past kMaxBoundMagnitude (int_part is then meaningless)
  bool zero() const { return !huge && int_part == 0 && fraction.empty(); }
};

Decimal decimal_of(const Json& v, std::string_view key, const std::string& path) {
  Decimal d;
  if (v.is_number_unsigned()) {
    d.int_part = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    d.negative = i < 0;
    d.int_part = d.negative ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  } else if (v.is_number_float() && std::isfinite(v.get<double>())) {
    const std::string text = fmt::format("{}", v.get<double>());  // e.g. "-1.5e-07", "0.1", "1e+30"
    size_t i = 0;
    if (text[i] == '-') d.negative = true, ++i;
    std::string digits;
    int64_t point = -1;
    for (; i < text.size() && text[i] != 'e'; ++i) {
      if (text[i] == '.')
        point = static_cast<int64_t>(digits.size());
      else
        digits += text[i];
    }
    if (point < 0) point = static_cast<int64_t>(digits.size());
    if (i < text.size()) point += std::stoll(text.substr(i + 1));
    std::string int_digits, fraction;
    if (point <= 0) {
      fraction = std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (point >= static_cast<int64_t>(digits.size())) {
      int_digits = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
    } else {
      int_digits = digits.substr(0, static_cast<size_t>(point));
      fraction = digits.substr(static_cast<size_t>(point));
    }
    int_digits.erase(0, std::min(int_digits.find_first_not_of('0'), int_digits.size()));
    while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
    d.fraction = fraction;
    if (int_digits.size() > 18)
      d.huge = true;
    else
      d.int_part = int_digits.empty() ? 0 : std::stoull(int_digits);
  } else {
    fail("json_schema: \"{}\" at {} must be a number, not {}", key, where(path), v.dump());
  }
  if (d.int_part > kMaxBoundMagnitude) d.huge = true;
  if (d.zero()) d.negative = false;
  return d;
}

int compare_magnitude(const Decimal& a, const Decimal& b) {
  if (a.huge != b.huge) return a.huge ? 1 : -1;
  if (a.int_part != b.int_part) return a.int_part < b.int_part ? -1 : 1;
  return a.fraction == b.fraction ? 0 : a.fraction < b.fraction ? -1 : 1;  // no trailing zeros: lexicographic
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int m = compare_magnitude(a, b);
  return a.negative ? -m : m;
}

struct Bound {
  Decimal value;
  bool exclusive = false;
  std::string keyword;  // for messages
};

// The tighter of minimum / exclusiveMinimum (or the maximums): draft 4's boolean form included.
std::optional<Bound> bound_of(const Json& schema, bool lower, const std::string& path) {
  const char* inclusive_key = lower ? "minimum" : "maximum";
  const char* exclusive_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
  std::optional<Bound> best;
  auto consider = [&](Bound b) {
    if (!best) {
      best = std::move(b);
      return;
    }
    const int c = compare(b.value, best->value);
    if ((lower ? c > 0 : c < 0) || (c == 0 && b.exclusive)) best = std::move(b);
  };
  const bool draft4_exclusive = schema.contains(exclusive_key) && schema[exclusive_key].is_boolean();
  if (schema.contains(inclusive_key))
    consider({decimal_of(schema[inclusive_key], inclusive_key, path),
              draft4_exclusive && schema[exclusive_key].get<bool>(), inclusive_key});
  if (schema.contains(exclusive_key) && !draft4_exclusive)
    consider({decimal_of(schema[exclusive_key], exclusive_key, path), true, exclusive_key});
  if (best && best->value.huge) {
    // Past the digit bounds on the open side: the digit bounds are tighter.
    if (best->value.negative == lower) return std::nullopt;
    fail("json_schema: \"{}\" at {} is beyond the supported range of numbers (magnitude 10^17)", best->keyword,
         where(path));
  }
  return best;
}

int64_t signed_int(const Decimal& d) {
  return d.negative ? -static_cast<int64_t>(d.int_part) : static_cast<int64_t>(d.int_part);
}
int64_t integer_lower(const Bound& b) {
  if (b.value.fraction.empty()) return signed_int(b.value) + (b.exclusive ? 1 : 0);
  return b.value.negative ? signed_int(b.value) : signed_int(b.value) + 1;  // the ceiling
}
int64_t integer_upper(const Bound& b) {
  if (b.value.fraction.empty()) return signed_int(b.value) - (b.exclusive ? 1 : 0);
  return b.value.negative ? signed_int(b.value) - 1 : signed_int(b.value);  // the floor
}

uint64_t pow10(int n) {
  uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}
int digit_count(uint64_t v) { return static_cast<int>(std::to_string(v).size()); }
// The largest magnitude an open side allows: kMaxIntegerDigits digits, or as many as the other
// side's bound has.
uint64_t open_cap(uint64_t other) { return std::max(pow10(kMaxIntegerDigits), pow10(digit_count(other))) - 1; }

// The schema a "$ref" inside the document names, and its JSON pointer (the rule's key and the
// path of its messages).
std::pair<const Json*, std::string> resolve(const Json& root, const std::string& ref, const std::string& path) {
  if (!ref.starts_with("#"))
    fail("json_schema: \"$ref\" \"{}\" at {} is not supported: only references inside the schema (\"#/...\") are", ref,
         where(path));
  // The fragment is a URI fragment: percent-escapes first, then the pointer's ~1 and ~0.
  std::string fragment;
  for (size_t i = 1; i < ref.size(); ++i) {
    if (ref[i] == '%' && i + 2 < ref.size() && std::isxdigit(static_cast<unsigned char>(ref[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(ref[i + 2]))) {
      fragment += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      fragment += ref[i];
    }
  }
  if (!fragment.empty() && fragment[0] != '/')
    fail("json_schema: \"$ref\" \"{}\" at {} is not supported: only JSON pointers (\"#/...\") are, not anchors", ref,
         where(path));
  const Json* target = &root;
  for (size_t start = 1; start <= fragment.size() && !fragment.empty();) {
    size_t end = fragment.find('/', start);
    if (end == std::string::npos) end = fragment.size();
    std::string token;
    for (size_t i = start; i < end; ++i) {
      if (fragment[i] == '~' && i + 1 < end && (fragment[i + 1] == '0' || fragment[i + 1] == '1')) {
        token += fragment[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        token += fragment[i];
      }
    }
    const Json* next = nullptr;
    if (target->is_object() && target->contains(token)) {
      next = &(*target)[token];
    } else if (target->is_array() && !token.empty() && token.size() < 10 &&
               token.find_first_not_of("0123456789") == std::string::npos && std::stoull(token) < target->size()) {
      next = &(*target)[std::stoull(token)];
    }
    if (!next) fail("json_schema: \"$ref\" \"{}\" at {} refers to nothing in the schema", ref, where(path));
    target = next;
    start = end + 1;
  }
  return {target, fragment};
}

Json merge_allof(const Json& a, const Json& b, const std::string& path, int depth, const Json& root);

class Builder {
 public:
  Builder(Grammar& g, const Json& root, const JsonSchemaOptions& options) : g_(g), root_(root), options_(options) {}

  // The value a schema admits (no surrounding whitespace).
  Element schema(const Json& s, const std::string& path);
  // A $ref target, one rule per target, so recursive schemas refer back to it.
  Element pointer(const std::string& ref, const std::string& path);

  Element any_value();
  Element any_object();
  Sequence ws_inner() { return options_.any_whitespace ? Sequence{whitespace()} : Sequence{}; }
  Element whitespace() {
    if (!ws_) ws_ = repeat("ws", {chars(" \t\n\r")}, 0, kMaxJsonWhitespace);
    return *ws_;
  }

 private:
  Sequence ws_separator() {
    if (options_.any_whitespace) return {whitespace()};
    if (!space_) space_ = optional("space", {g_.byte(' ')});
    return {*space_};
  }

  // Rule names unique by construction: Grammar::unique_name searches every name given, which a
  // schema of thousands of rules (a maxLength, a maxItems) would make quadratic per rule.
  std::string fresh_name(std::string_view base) { return fmt::format("{}.{}", base, ++named_); }
  // Grammar::repeat's rules (right-recursive, one optional copy per count past the minimum),
  // named as above.
  Element repeat(std::string_view base, const Sequence& item, int64_t min, int64_t max) {
    Sequence body;
    for (int64_t i = 0; i < min; ++i) body.insert(body.end(), item.begin(), item.end());
    if (max < 0) {
      const int32_t tail = g_.add_rule(fresh_name(std::string(base) + "-tail"));
      Sequence more = item;
      more.push_back(Grammar::rule(tail));
      g_.add_alternative(tail, std::move(more));
      g_.add_alternative(tail, {});
      body.push_back(Grammar::rule(tail));
    } else if (max > min) {
      int32_t previous = -1;
      for (int64_t j = 1; j <= max - min; ++j) {
        const int32_t opt = g_.add_rule(fresh_name(std::string(base) + "-opt"));
        Sequence more = item;
        if (previous >= 0) more.push_back(Grammar::rule(previous));
        g_.add_alternative(opt, std::move(more));
        g_.add_alternative(opt, {});
        previous = opt;
      }
      body.push_back(Grammar::rule(previous));
    }
    return g_.choice(fresh_name(base), {std::move(body)});
  }
  Element optional(std::string_view base, const Sequence& item) { return repeat(base, item, 0, 1); }

  // A byte set from a spec of single bytes and ranges ("0-9a-fA-F").
  Element chars(std::string_view spec) {
    ByteSet set;
    for (size_t i = 0; i < spec.size(); ++i) {
      if (i + 2 < spec.size() && spec[i + 1] == '-') {
        set.add_range(static_cast<uint8_t>(spec[i]), static_cast<uint8_t>(spec[i + 2]));
        i += 2;
      } else {
        set.add(static_cast<uint8_t>(spec[i]));
      }
    }
    return g_.bytes(set);
  }
  Element digit_range(int lo, int hi) { return g_.bytes(digit_set(lo, hi)); }
  static ByteSet digit_set(int lo, int hi) {
    ByteSet set;
    set.add_range(static_cast<uint8_t>('0' + lo), static_cast<uint8_t>('0' + hi));
    return set;
  }
  Element cached(const std::string& key, const std::function<Element()>& make) {
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    const Element e = make();
    cache_.emplace(key, e);
    return e;
  }

  Element types(const Json& s, int mask, const std::string& path);
  Element enumeration(const Json& s, const std::string& path);
  Element object(const Json& s, const std::string& path);
  Element object_of(std::vector<Sequence> members, const std::vector<bool>& required,
                    std::optional<Sequence> additional);
  Element array(const Json& s, const std::string& path);
  Element string(const Json& s, const std::string& path);
  Element integer(const Json& s, const std::string& path);
  Element number(const Json& s, const std::string& path);

  Element string_char();
  Element plain_char();
  Element any_string();
  Element key_excluding(const std::vector<std::string>& names);
  Element format(const std::string& name, const std::string& path);
  Element json_safe(Element e, const std::string& path);

  Element any_integer();
  Element any_number();
  std::vector<Sequence> unsigned_range(uint64_t lo, uint64_t hi);
  void same_length_range(std::string_view lo, std::string_view hi, Sequence prefix, std::vector<Sequence>& out);
  Element integer_range(int64_t lo, int64_t hi);
  Element optional_fraction();
  std::optional<Element> fraction(const std::string* lo, bool lo_exclusive, const std::string* hi, bool hi_exclusive);
  void nonnegative_decimals(const Bound& lo, const std::optional<Bound>& hi, const Sequence& prefix,
                            std::vector<Sequence>& out);

  Grammar& g_;
  const Json& root_;
  JsonSchemaOptions options_;
  std::optional<Element> ws_, space_, value_, object_;
  std::map<std::string, int32_t> pointers_;
  std::map<std::string, Element> cache_;
  int64_t named_ = 0;
};

// ---- schemas

Element Builder::schema(const Json& s, const std::string& path) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    fail("json_schema: the schema at {} is false, which admits no value", where(path));
  }
  QINFER_CHECK(s.is_object(), "json_schema: the schema at {} must be an object or a boolean, not {}", where(path),
               s.dump());
  for (const auto& [key, value] : s.items()) {
    if (is_annotation(key)) continue;
    if (!kSupported.contains(key)) unsupported(key, path);
    if (key == "uniqueItems" && !(value.is_boolean() && !value.get<bool>())) unsupported(key, path);
  }

  if (s.contains("allOf")) {
    const Json& all = s["allOf"];
    QINFER_CHECK(all.is_array() && !all.empty(), "json_schema: \"allOf\" at {} must be a non-empty array", where(path));
    Json rest = s;
    rest.erase("allOf");
    // One member and nothing else: the member itself, so that a $ref in it stays a shared rule.
    if (all.size() == 1 && !has_assertions(rest)) return schema(all[0], child(child(path, "allOf"), 0));
    Json merged = rest;
    for (size_t i = 0; i < all.size(); ++i)
      merged = merge_allof(merged, all[i], child(child(path, "allOf"), i), 0, root_);
    return schema(merged, path);
  }
  if (s.contains("$ref")) {
    Json rest = s;
    rest.erase("$ref");
    QINFER_CHECK(s["$ref"].is_string(), "json_schema: \"$ref\" at {} must be a string", where(path));
    if (!has_assertions(rest)) return pointer(s["$ref"].get<std::string>(), path);
    return schema(merge_allof(rest, Json{{"$ref", s["$ref"]}}, path, 0, root_), path);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) {
    if (s.contains("anyOf") && s.contains("oneOf"))
      fail("json_schema: \"oneOf\" together with \"anyOf\" at {} is not supported", where(path));
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    const Json& alternatives = s[key];
    QINFER_CHECK(alternatives.is_array() && !alternatives.empty(),
                 "json_schema: \"{}\" at {} must be a non-empty array", key, where(path));
    Json rest = s;
    rest.erase(key);
    const bool distribute = has_assertions(rest);
    std::vector<Sequence> alts;
    for (size_t i = 0; i < alternatives.size(); ++i) {
      const std::string at = child(child(path, key), i);
      // Keywords beside anyOf apply to every alternative: each alternative is merged with them.
      alts.push_back(
          {distribute ? schema(merge_allof(rest, alternatives[i], at, 0, root_), at) : schema(alternatives[i], at)});
    }
    return alts.size() == 1 ? alts[0][0] : g_.choice(fresh_name("any-of"), std::move(alts));
  }
  if (s.contains("enum") || s.contains("const")) return enumeration(s, path);

  int mask = 0;
  if (s.contains("type")) {
    mask = declared_types(s["type"], path);
  } else {
    // No type: the kinds the keywords constrain (a value of another kind would satisfy them
    // vacuously, which is no answer anyone wants), or any value.
    for (const auto& [key, value] : s.items()) {
      if (key == "properties" || key == "required" || key == "additionalProperties") mask |= kObject;
      if (key == "items" || key == "prefixItems" || key == "additionalItems" || key == "minItems" || key == "maxItems")
        mask |= kArray;
      if (key == "minLength" || key == "maxLength" || key == "pattern" || key == "format") mask |= kString;
      if (key == "minimum" || key == "maximum" || key == "exclusiveMinimum" || key == "exclusiveMaximum")
        mask |= kNumber;
    }
    if (mask == 0) mask = kAnyType;
  }
  if (s.contains("nullable")) {
    QINFER_CHECK(s["nullable"].is_boolean(), "json_schema: \"nullable\" at {} must be a boolean", where(path));
    if (s["nullable"].get<bool>()) mask |= kNull;
  }
  return types(s, mask, path);
}

Element Builder::types(const Json& s, int mask, const std::string& path) {
  if (mask & kNumber) mask &= ~kInteger;
  std::vector<Sequence> alts;
  if (mask & kObject) alts.push_back({object(s, path)});
  if (mask & kArray) alts.push_back({array(s, path)});
  if (mask & kString) alts.push_back({string(s, path)});
  if (mask & kNumber) alts.push_back({number(s, path)});
  if (mask & kInteger) alts.push_back({integer(s, path)});
  if (mask & kBoolean)
    alts.push_back({cached("boolean", [&] {
      return g_.choice("boolean", {g_.literal("true"), g_.literal("false")});
    })});
  if (mask & kNull) alts.push_back({cached("null", [&] { return g_.choice("null", {g_.literal("null")}); })});
  if (alts.size() == 1) return alts[0][0];
  return g_.choice(fresh_name("value"), std::move(alts));
}

Element Builder::pointer(const std::string& ref, const std::string& path) {
  const auto [target, fragment] = resolve(root_, ref, path);
  if (auto it = pointers_.find(fragment); it != pointers_.end()) return Grammar::rule(it->second);
  // The rule exists before its body, so that references inside the body come back to it.
  const int32_t id = g_.add_rule(fresh_name("#" + fragment));
  pointers_.emplace(fragment, id);
  g_.add_alternative(id, {schema(*target, fragment)});
  return Grammar::rule(id);
}

Element Builder::enumeration(const Json& s, const std::string& path) {
  for (const auto& [key, value] : s.items())
    if (!is_annotation(key) && key != "enum" && key != "const" && key != "type" && key != "nullable")
      fail("json_schema: \"{}\" together with \"{}\" at {} is not supported", key,
           s.contains("enum") ? "enum" : "const", where(path));
  std::vector<Json> values;
  if (s.contains("enum")) {
    QINFER_CHECK(s["enum"].is_array() && !s["enum"].empty(), "json_schema: \"enum\" at {} must be a non-empty array",
                 where(path));
    for (const Json& v : s["enum"])
      if (!s.contains("const") || v == s["const"]) values.push_back(v);
  } else {
    values.push_back(s["const"]);
  }
  QINFER_CHECK(!values.empty(), "json_schema: \"enum\" and \"const\" at {} have no value in common", where(path));
  int mask = s.contains("type") ? declared_types(s["type"], path) : kAnyType | kInteger;
  if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) {
    mask |= kNull;
    values.push_back(nullptr);
  }
  std::vector<Sequence> alts;
  for (const Json& v : values) {
    if (value_has_type(v, mask)) alts.push_back(g_.literal(v.dump()));
  }
  QINFER_CHECK(!alts.empty(), "json_schema: no value of \"enum\" / \"const\" at {} is of the schema's \"type\"",
               where(path));
  return g_.choice(fresh_name("enum"), std::move(alts));
}

// ---- objects

// '{' first_0 '}' where first_i is what may follow when no member is written yet and after_i what
// may follow a member, from declared member i on: an optional member is taken or skipped, and a
// comma precedes every member but the first. Additional members come after the declared ones.
Element Builder::object_of(std::vector<Sequence> members, const std::vector<bool>& required,
                           std::optional<Sequence> additional) {
  const size_t n = members.size();
  auto comma = [&](const Sequence& member, Element next) {
    Sequence s = ws_inner();
    s.push_back(g_.byte(','));
    for (Element e : ws_separator()) s.push_back(e);
    s.insert(s.end(), member.begin(), member.end());
    s.push_back(next);
    return s;
  };
  const int32_t after_end = g_.add_rule(fresh_name("members-end"));
  g_.add_alternative(after_end, ws_inner());
  const int32_t first_end = g_.add_rule(fresh_name("members-none"));
  g_.add_alternative(first_end, {});
  if (additional) {
    g_.add_alternative(after_end, comma(*additional, Grammar::rule(after_end)));
    Sequence first = *additional;
    first.push_back(Grammar::rule(after_end));
    g_.add_alternative(first_end, std::move(first));
  }
  Element after = Grammar::rule(after_end), first = Grammar::rule(first_end);
  for (size_t k = n; k-- > 0;) {
    std::vector<Sequence> after_alts{comma(members[k], after)};
    Sequence take = members[k];
    take.push_back(after);
    std::vector<Sequence> first_alts{std::move(take)};
    if (!required[k]) {
      after_alts.push_back({after});
      first_alts.push_back({first});
    }
    after = g_.choice(fresh_name("members"), std::move(after_alts));
    first = g_.choice(fresh_name("members-first"), std::move(first_alts));
  }
  Sequence body{g_.byte('{')};
  for (Element e : ws_inner()) body.push_back(e);
  body.push_back(first);
  body.push_back(g_.byte('}'));
  return g_.choice(fresh_name("object"), {std::move(body)});
}

Element Builder::object(const Json& s, const std::string& path) {
  std::vector<std::string> required_names;
  if (s.contains("required")) {
    QINFER_CHECK(s["required"].is_array(), "json_schema: \"required\" at {} must be an array of strings", where(path));
    for (const Json& name : s["required"]) {
      QINFER_CHECK(name.is_string(), "json_schema: \"required\" at {} must be an array of strings", where(path));
      if (std::find(required_names.begin(), required_names.end(), name.get<std::string>()) == required_names.end())
        required_names.push_back(name.get<std::string>());
    }
  }
  auto is_required = [&](const std::string& name) {
    return std::find(required_names.begin(), required_names.end(), name) != required_names.end();
  };
  Json additional = options_.strict ? Json(false) : Json(true);
  if (s.contains("additionalProperties")) additional = s["additionalProperties"];
  QINFER_CHECK(additional.is_boolean() || additional.is_object(),
               "json_schema: \"additionalProperties\" at {} must be a schema or a boolean", where(path));
  const bool additional_allowed = !(additional.is_boolean() && !additional.get<bool>());

  auto member = [&](const std::string& name, Element value) {
    Sequence m = g_.literal(Json(name).dump());
    for (Element e : ws_inner()) m.push_back(e);
    m.push_back(g_.byte(':'));
    for (Element e : ws_separator()) m.push_back(e);
    m.push_back(value);
    return m;
  };
  std::vector<Sequence> members;
  std::vector<bool> required;
  std::vector<std::string> declared;
  if (s.contains("properties")) {
    QINFER_CHECK(s["properties"].is_object(), "json_schema: \"properties\" at {} must be an object", where(path));
    for (const auto& [name, property] : s["properties"].items()) {
      declared.push_back(name);
      const std::string at = child(child(path, "properties"), name);
      if (property.is_boolean() && !property.get<bool>()) {
        // Never present: a required one is a contradiction.
        QINFER_CHECK(!is_required(name),
                     "json_schema: the required property \"{}\" at {} is false, which admits no value", name,
                     where(at));
        continue;
      }
      members.push_back(member(name, schema(property, at)));
      required.push_back(is_required(name));
    }
  }
  // Required names without a property schema are additional properties that must be there.
  for (const std::string& name : required_names) {
    if (std::find(declared.begin(), declared.end(), name) != declared.end()) continue;
    QINFER_CHECK(additional_allowed,
                 "json_schema: the required property \"{}\" at {} is not in \"properties\" and additional properties "
                 "are not allowed",
                 name, where(path));
    declared.push_back(name);
    members.push_back(member(name, schema(additional, child(path, "additionalProperties"))));
    required.push_back(true);
  }
  std::optional<Sequence> extra;
  if (additional_allowed) {
    Sequence m{declared.empty() ? any_string() : key_excluding(declared)};
    for (Element e : ws_inner()) m.push_back(e);
    m.push_back(g_.byte(':'));
    for (Element e : ws_separator()) m.push_back(e);
    m.push_back(schema(additional, child(path, "additionalProperties")));
    extra = std::move(m);
  }
  return object_of(std::move(members), required, std::move(extra));
}

// A JSON string key, written without escapes, that is none of `names`: a trie of the names over
// code points, where leaving the trie is free and ending is allowed except on a name.
Element Builder::key_excluding(const std::vector<std::string>& names) {
  struct Node {
    std::map<uint32_t, int> children;
    bool terminal = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& name : names) {
    std::vector<uint32_t> cps;
    bool plain = true;
    for (size_t i = 0; i < name.size() && plain;) {
      const int64_t cp = utf8::decode(name, i);
      plain = cp >= 0x20 && cp != '"' && cp != '\\';
      cps.push_back(static_cast<uint32_t>(cp));
    }
    if (!plain) continue;  // a key written without escapes cannot be this name
    int node = 0;
    for (uint32_t cp : cps) {
      const auto found = trie[node].children.find(cp);
      int next = found == trie[node].children.end() ? -1 : found->second;
      if (next < 0) {
        next = static_cast<int>(trie.size());
        trie[node].children.emplace(cp, next);
        trie.emplace_back();
      }
      node = next;
    }
    trie[node].terminal = true;
  }
  const Element quote = g_.byte('"');
  const Element free_tail = cached("plain-string-tail", [&] {
    Sequence tail{repeat("plain-chars", {plain_char()}, 0, -1), quote};
    return g_.choice("plain-string-rest", {std::move(tail)});
  });
  std::vector<int32_t> rules(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rules[i] = g_.add_rule(fresh_name("key"));
  for (size_t i = 0; i < trie.size(); ++i) {
    const Node& node = trie[i];
    if (!node.terminal) g_.add_alternative(rules[i], {quote});
    std::vector<CodePointRange> excluded = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    for (const auto& [cp, next] : node.children) {
      std::string bytes;
      utf8::append(bytes, cp);
      Sequence step = g_.literal(bytes);
      step.push_back(Grammar::rule(rules[next]));
      g_.add_alternative(rules[i], std::move(step));
      excluded.emplace_back(cp, cp);
    }
    g_.add_alternative(rules[i], {g_.utf8_class(excluded, true), free_tail});
  }
  return g_.choice(fresh_name("key-string"), {{quote, Grammar::rule(rules[0])}});
}

// ---- arrays

Element Builder::array(const Json& s, const std::string& path) {
  std::vector<Element> prefix;
  Json rest = true;
  std::string rest_path = child(path, "items");
  if (s.contains("prefixItems")) {
    QINFER_CHECK(s["prefixItems"].is_array(), "json_schema: \"prefixItems\" at {} must be an array", where(path));
    for (size_t i = 0; i < s["prefixItems"].size(); ++i)
      prefix.push_back(schema(s["prefixItems"][i], child(child(path, "prefixItems"), i)));
    if (s.contains("items")) rest = s["items"];
    QINFER_CHECK(!rest.is_array(), "json_schema: \"items\" at {} must be a schema beside \"prefixItems\"", where(path));
  } else if (s.contains("items") && s["items"].is_array()) {
    // Draft 4-7 tuples: items is the list, additionalItems the rest.
    for (size_t i = 0; i < s["items"].size(); ++i)
      prefix.push_back(schema(s["items"][i], child(child(path, "items"), i)));
    if (s.contains("additionalItems")) rest = s["additionalItems"], rest_path = child(path, "additionalItems");
  } else if (s.contains("items")) {
    rest = s["items"];
  }
  QINFER_CHECK(rest.is_boolean() || rest.is_object(), "json_schema: \"items\" at {} must be a schema", where(path));
  const bool rest_allowed = !(rest.is_boolean() && !rest.get<bool>());
  const int64_t k = static_cast<int64_t>(prefix.size());
  const int64_t min = s.contains("minItems") ? count_keyword(s, "minItems", path) : 0;
  int64_t max = s.contains("maxItems") ? count_keyword(s, "maxItems", path) : -1;
  if (!rest_allowed) max = max < 0 ? k : std::min(max, k);
  QINFER_CHECK(max < 0 || min <= max, "json_schema: no array at {} has at least {} and at most {} items", where(path),
               min, max);
  QINFER_CHECK(min <= kMaxJsonCount, "json_schema: \"minItems\" at {} is larger than {}", where(path), kMaxJsonCount);
  if (max > std::max(min, k) + kMaxJsonCount) max = std::max(min, k) + kMaxJsonCount;
  const Element rest_item = rest_allowed ? schema(rest, rest_path) : Element{};
  auto item = [&](int64_t i) { return i < k ? prefix[static_cast<size_t>(i)] : rest_item; };

  // after(i): i items written. Past the prefix and the minimum an unbounded array repeats one state.
  const int64_t last = max < 0 ? std::max({min, k, int64_t{1}}) : max;
  std::vector<int32_t> after(static_cast<size_t>(last) + 1);
  for (int64_t i = 1; i <= last; ++i) after[i] = g_.add_rule(fresh_name("items"));
  for (int64_t i = 1; i <= last; ++i) {
    if (i >= min) g_.add_alternative(after[i], ws_inner());
    if (max < 0 || i < max) {
      Sequence more = ws_inner();
      more.push_back(g_.byte(','));
      for (Element e : ws_separator()) more.push_back(e);
      more.push_back(item(i));
      more.push_back(Grammar::rule(after[std::min(i + 1, last)]));
      g_.add_alternative(after[i], std::move(more));
    }
  }
  std::vector<Sequence> first;
  if (min == 0) first.push_back({});
  if (max != 0) first.push_back({item(0), Grammar::rule(after[1])});
  Sequence body{g_.byte('[')};
  for (Element e : ws_inner()) body.push_back(e);
  body.push_back(g_.choice(fresh_name("items-first"), std::move(first)));
  body.push_back(g_.byte(']'));
  return g_.choice(fresh_name("array"), {std::move(body)});
}

// ---- strings

Element Builder::plain_char() {
  return cached("plain-char", [&] { return g_.utf8_class({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true); });
}

// One character of a JSON string: a plain one or an escape. \u escapes name scalar values (a
// surrogate only as the high half of a pair), so that each escape is one code point of the length.
Element Builder::string_char() {
  return cached("string-char", [&] {
    const Element hex = chars("0-9a-fA-F");
    const Element bs = g_.byte('\\'), u = g_.byte('u');
    Sequence high{bs, u, chars("dD"), chars("89abAB"), hex, hex};
    Sequence pair = high;
    for (Element e : {bs, u, chars("dD"), chars("c-fC-F"), hex, hex}) pair.push_back(e);
    return g_.choice("char", {{plain_char()},
                              {bs, chars("\"\\/bfnrt")},
                              {bs, u, chars("0-9a-cA-CeEfF"), hex, hex, hex},
                              {bs, u, chars("dD"), chars("0-7"), hex, hex},
                              std::move(pair)});
  });
}

Element Builder::any_string() {
  return cached("string", [&] {
    const Element quote = g_.byte('"');
    return g_.choice("string", {{quote, repeat("chars", {string_char()}, 0, -1), quote}});
  });
}

Element Builder::string(const Json& s, const std::string& path) {
  const bool has_length = s.contains("minLength") || s.contains("maxLength");
  const char* length_key = s.contains("minLength") ? "minLength" : "maxLength";
  if (s.contains("pattern") && s.contains("format"))
    fail("json_schema: \"format\" together with \"pattern\" at {} is not supported", where(path));
  const Element quote = g_.byte('"');
  if (s.contains("pattern") || s.contains("format")) {
    const char* key = s.contains("pattern") ? "pattern" : "format";
    if (has_length)
      fail("json_schema: \"{}\" together with \"{}\" at {} is not supported", length_key, key, where(path));
    QINFER_CHECK(s[key].is_string(), "json_schema: \"{}\" at {} must be a string", key, where(path));
    const std::string& text = s[key].get_ref<const std::string&>();
    Element content;
    if (s.contains("pattern")) {
      try {
        content = compile_regex(g_, text);
      } catch (const Error& e) {
        fail("json_schema: \"pattern\" at {}: {}", where(path), e.what());
      }
      content = json_safe(content, path);
    } else {
      content = format(text, path);
    }
    return g_.choice(fresh_name("string"), {{quote, content, quote}});
  }
  if (!has_length) return any_string();
  const int64_t min = s.contains("minLength") ? count_keyword(s, "minLength", path) : 0;
  int64_t max = s.contains("maxLength") ? count_keyword(s, "maxLength", path) : -1;
  QINFER_CHECK(max < 0 || min <= max, "json_schema: no string at {} has at least {} and at most {} characters",
               where(path), min, max);
  QINFER_CHECK(min <= kMaxJsonCount, "json_schema: \"minLength\" at {} is larger than {}", where(path), kMaxJsonCount);
  if (max > min + kMaxJsonCount) max = min + kMaxJsonCount;
  return g_.choice(fresh_name("string"), {{quote, repeat("chars", {string_char()}, min, max), quote}});
}

// A copy of the rules under `e` without the bytes a JSON string must escape: raw content is then
// always a valid string body, and the pattern matches exactly what the string holds.
Element Builder::json_safe(Element e, const std::string& path) {
  ByteSet forbidden;
  forbidden.add_range(0, 0x1F);
  forbidden.add('"');
  forbidden.add('\\');
  auto restrict = [&](int32_t set) {
    ByteSet s = g_.byte_sets()[set];
    for (int w = 0; w < 4; ++w) s.words[w] &= ~forbidden.words[w];
    return s;
  };
  auto fail_empty = [&] {
    fail(
        "json_schema: \"pattern\" at {} matches no string without characters that need escaping (\", \\ and "
        "control characters)",
        where(path));
  };
  if (e.kind == Element::Kind::bytes) {
    const ByteSet s = restrict(e.index);
    if (s.empty()) fail_empty();
    return g_.bytes(s);
  }
  // The rules reachable from e, their alternatives with restricted sets (an emptied set drops its
  // alternative), then only the productive rules are kept.
  std::map<int32_t, std::vector<std::vector<std::pair<bool, int32_t>>>> alts;  // rule -> (is rule, index)
  std::vector<int32_t> todo{e.index};
  while (!todo.empty()) {
    const int32_t r = todo.back();
    todo.pop_back();
    if (alts.contains(r)) continue;
    auto& out = alts[r];
    const std::vector<Sequence> source = g_.rules()[r].alternatives;
    for (const Sequence& alt : source) {
      std::vector<std::pair<bool, int32_t>> copy;
      bool ok = true;
      for (const Element& x : alt) {
        if (x.kind == Element::Kind::rule) {
          copy.emplace_back(true, x.index);
          todo.push_back(x.index);
        } else {
          const ByteSet s = restrict(x.index);
          if (s.empty()) {
            ok = false;
            break;
          }
          copy.emplace_back(false, g_.add_byte_set(s));
        }
      }
      if (ok) out.push_back(std::move(copy));
    }
  }
  std::set<int32_t> productive;
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& [r, list] : alts) {
      if (productive.contains(r)) continue;
      for (const auto& alt : list)
        if (std::all_of(alt.begin(), alt.end(), [&](auto x) { return !x.first || productive.contains(x.second); })) {
          productive.insert(r);
          changed = true;
          break;
        }
    }
  }
  if (!productive.contains(e.index)) fail_empty();
  std::map<int32_t, int32_t> copies;
  for (int32_t r : productive) copies[r] = g_.add_rule(fresh_name(g_.rules()[r].name + "-json"));
  for (int32_t r : productive)
    for (const auto& alt : alts[r]) {
      if (!std::all_of(alt.begin(), alt.end(), [&](auto x) { return !x.first || productive.contains(x.second); }))
        continue;
      Sequence seq;
      for (auto [is_rule, index] : alt)
        seq.push_back(is_rule ? Grammar::rule(copies[index]) : Element{Element::Kind::bytes, index});
      g_.add_alternative(copies[r], std::move(seq));
    }
  return Grammar::rule(copies[e.index]);
}

Element Builder::format(const std::string& name, const std::string& path) {
  auto seq = [](std::initializer_list<Element> elements) { return Sequence(elements); };
  const Element d = chars("0-9");
  const Element hex = chars("0-9a-fA-F");
  if (name == "date" || name == "date-time") {
    const Element date = cached("date", [&] {
      // Days per month; 29 February only in leap years (divisible by 4, centuries by 400); no year 0.
      const Element year = g_.choice("year", {{chars("1-9"), d, d, d},
                                              {g_.byte('0'), chars("1-9"), d, d},
                                              {g_.byte('0'), g_.byte('0'), chars("1-9"), d},
                                              {g_.byte('0'), g_.byte('0'), g_.byte('0'), chars("1-9")}});
      const std::vector<Sequence> by4 = {
          {g_.byte('0'), chars("48")}, {chars("2468"), chars("048")}, {chars("13579"), chars("26")}};
      std::vector<Sequence> leap;
      for (const Sequence& tail : by4) leap.push_back({d, d, tail[0], tail[1]});
      for (const Sequence& head : by4) leap.push_back({head[0], head[1], g_.byte('0'), g_.byte('0')});
      const Element leap_year = g_.choice("leap-year", std::move(leap));
      std::vector<Sequence> d28 = {{g_.byte('0'), chars("1-9")}, {g_.byte('1'), d}, {g_.byte('2'), chars("0-8")}};
      std::vector<Sequence> d30 = d28;
      d30.push_back(g_.literal("29"));
      d30.push_back(g_.literal("30"));
      std::vector<Sequence> d31 = d30;
      d31.push_back(g_.literal("31"));
      const Element month_day = g_.choice(
          "month-day", {seq({g_.choice("month-31", {{g_.byte('0'), chars("13578")}, {g_.byte('1'), chars("02")}}),
                             g_.byte('-'), g_.choice("day-31", std::move(d31))}),
                        seq({g_.choice("month-30", {{g_.byte('0'), chars("469")}, g_.literal("11")}), g_.byte('-'),
                             g_.choice("day-30", std::move(d30))}),
                        seq({g_.choice("february", {g_.literal("02-")}), g_.choice("day-28", std::move(d28))})});
      return g_.choice("date",
                       {{year, g_.byte('-'), month_day}, {leap_year, g_.choice("leap-day", {g_.literal("-02-29")})}});
    });
    if (name == "date") return date;
    return cached("date-time", [&] { return g_.choice("date-time", {{date, g_.byte('T'), format("time", path)}}); });
  }
  if (name == "time") {
    return cached("time", [&] {
      const Element hour = g_.choice("hour", {{chars("01"), d}, {g_.byte('2'), chars("0-3")}});
      const Element minute = g_.choice("minute", {{chars("0-5"), d}});
      const Element offset = g_.choice("offset", {{g_.byte('Z')}, {chars("+-"), hour, g_.byte(':'), minute}});
      const Element fraction = optional("second-fraction", {g_.byte('.'), repeat("digits", {d}, 1, 9)});
      return g_.choice("time", {{hour, g_.byte(':'), minute, g_.byte(':'), minute, fraction, offset}});
    });
  }
  if (name == "uuid") {
    return cached("uuid", [&] {
      Sequence s;
      for (int group : {8, 4, 4, 4, 12}) {
        if (!s.empty()) s.push_back(g_.byte('-'));
        for (int i = 0; i < group; ++i) s.push_back(hex);
      }
      return g_.choice("uuid", {std::move(s)});
    });
  }
  if (name == "ipv4") {
    return cached("ipv4", [&] {
      // Octets 0-255 without leading zeros.
      const Element octet = g_.choice("octet", {{g_.byte('2'), g_.byte('5'), chars("0-5")},
                                                {g_.byte('2'), chars("0-4"), d},
                                                {g_.byte('1'), d, d},
                                                {chars("1-9"), d},
                                                {d}});
      const Element dot = g_.byte('.');
      return g_.choice("ipv4", {{octet, dot, octet, dot, octet, dot, octet}});
    });
  }
  if (name == "ipv6") {
    return cached("ipv6", [&] {
      // RFC 3986's IPv6address: n groups, or "::" standing for the groups left out.
      const Element h16 = repeat("h16", {hex}, 1, 4);
      const Element colon = g_.byte(':');
      const Element ls32 = g_.choice("ls32", {{h16, colon, h16}, {format("ipv4", path)}});
      auto groups = [&](int n) {
        Sequence s;
        for (int i = 0; i < n; ++i) s.insert(s.end(), {h16, colon});
        return s;
      };
      // [ *k(h16 ":") h16 ] "::"
      auto head = [&](int k) {
        Sequence item{h16, colon};
        Sequence body{repeat("h16-colons", item, 0, k), h16};
        return Sequence{optional("ipv6-head", body), colon, colon};
      };
      std::vector<Sequence> alts;
      Sequence full = groups(6);
      full.push_back(ls32);
      alts.push_back(std::move(full));
      Sequence leading = {colon, colon};
      for (Element e : groups(5)) leading.push_back(e);
      leading.push_back(ls32);
      alts.push_back(std::move(leading));
      for (int k = 0; k <= 4; ++k) {
        Sequence s = head(k);
        for (Element e : groups(4 - k)) s.push_back(e);
        s.push_back(ls32);
        alts.push_back(std::move(s));
      }
      Sequence last_group = head(5);
      last_group.push_back(h16);
      alts.push_back(std::move(last_group));
      alts.push_back(head(6));
      return g_.choice("ipv6", std::move(alts));
    });
  }
  if (name == "email") {
    return cached("email", [&] {
      // A dot-atom local part and a domain of dot-separated labels (no leading or trailing '-').
      const Element atext = chars("a-zA-Z0-9!#$%&'*+/=?^_`{|}~-");
      const Element atom = repeat("atom", {atext}, 1, -1);
      const Element local = g_.choice("local-part", {{atom, repeat("dot-atoms", {g_.byte('.'), atom}, 0, -1)}});
      const Element alnum = chars("a-zA-Z0-9");
      const Element label =
          g_.choice("label", {{alnum, repeat("label-rest", {repeat("hyphens", {g_.byte('-')}, 0, -1), alnum}, 0, -1)}});
      const Element domain = g_.choice("domain", {{label, repeat("dot-labels", {g_.byte('.'), label}, 1, -1)}});
      return g_.choice("email", {{local, g_.byte('@'), domain}});
    });
  }
  fail(
      "json_schema: \"format\" \"{}\" at {} is not supported (supported: date, time, date-time, uuid, email, ipv4, "
      "ipv6)",
      name, where(path));
}

// ---- numbers

Element Builder::any_integer() {
  return cached("integer", [&] {
    const Element minus = optional("minus", {g_.byte('-')});
    const Element magnitude = g_.choice(
        "natural", {{g_.byte('0')}, {chars("1-9"), repeat("digits", {chars("0-9")}, 0, kMaxIntegerDigits - 1)}});
    return g_.choice("integer", {{minus, magnitude}});
  });
}

Element Builder::optional_fraction() {
  return cached("fraction", [&] {
    return optional("fraction", {g_.byte('.'), repeat("digits", {chars("0-9")}, 1, kMaxFractionDigits)});
  });
}

Element Builder::any_number() {
  return cached("number", [&] {
    const Element exponent = optional("exponent", {chars("eE"), optional("sign", {chars("+-")}),
                                                   repeat("digits", {chars("0-9")}, 1, kMaxExponentDigits)});
    return g_.choice("number", {{any_integer(), optional_fraction(), exponent}});
  });
}

// Digit strings of equal length in [lo, hi], leading zeros allowed (they are inner digits): split
// at the first differing digit into lo's tail, the digits between, and hi's tail.
void Builder::same_length_range(std::string_view lo, std::string_view hi, Sequence prefix, std::vector<Sequence>& out) {
  if (lo == hi) {
    for (Element e : g_.literal(lo)) prefix.push_back(e);
    out.push_back(std::move(prefix));
    return;
  }
  if (lo[0] == hi[0]) {
    prefix.push_back(g_.byte(static_cast<uint8_t>(lo[0])));
    same_length_range(lo.substr(1), hi.substr(1), std::move(prefix), out);
    return;
  }
  const size_t n = lo.size() - 1;
  const bool lo_zeros = lo.find_first_not_of('0', 1) == std::string_view::npos;
  const bool hi_nines = hi.find_first_not_of('9', 1) == std::string_view::npos;
  if (!lo_zeros) {
    Sequence p = prefix;
    p.push_back(g_.byte(static_cast<uint8_t>(lo[0])));
    same_length_range(lo.substr(1), std::string(n, '9'), std::move(p), out);
  }
  const int a = lo[0] - '0' + (lo_zeros ? 0 : 1), b = hi[0] - '0' - (hi_nines ? 0 : 1);
  if (a <= b) {
    Sequence p = prefix;
    p.push_back(digit_range(a, b));
    for (size_t i = 0; i < n; ++i) p.push_back(digit_range(0, 9));
    out.push_back(std::move(p));
  }
  if (!hi_nines) {
    Sequence p = prefix;
    p.push_back(g_.byte(static_cast<uint8_t>(hi[0])));
    same_length_range(std::string(n, '0'), hi.substr(1), std::move(p), out);
  }
}

// Naturals in [lo, hi] without leading zeros: one equal-length range per digit count.
std::vector<Sequence> Builder::unsigned_range(uint64_t lo, uint64_t hi) {
  std::vector<Sequence> out;
  for (int n = digit_count(lo); n <= digit_count(hi); ++n) {
    const uint64_t a = std::max(lo, n == 1 ? 0 : pow10(n - 1)), b = std::min(hi, pow10(n) - 1);
    if (a <= b) same_length_range(std::to_string(a), std::to_string(b), {}, out);
  }
  return out;
}

Element Builder::integer_range(int64_t lo, int64_t hi) {
  std::vector<Sequence> alts;
  if (hi >= 0) alts = unsigned_range(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi));
  if (lo < 0) {
    for (Sequence& s : unsigned_range(static_cast<uint64_t>(hi < 0 ? -hi : 1), static_cast<uint64_t>(-lo))) {
      s.insert(s.begin(), g_.byte('-'));
      alts.push_back(std::move(s));
    }
  }
  return g_.choice(fresh_name("integer-range"), std::move(alts));
}

Element Builder::integer(const Json& s, const std::string& path) {
  const std::optional<Bound> lower = bound_of(s, true, path), upper = bound_of(s, false, path);
  if (!lower && !upper) return any_integer();
  const std::optional<int64_t> lo = lower ? std::optional(integer_lower(*lower)) : std::nullopt;
  const std::optional<int64_t> hi = upper ? std::optional(integer_upper(*upper)) : std::nullopt;
  const int64_t a = lo ? *lo : -static_cast<int64_t>(open_cap(static_cast<uint64_t>(std::abs(*hi))));
  const int64_t b = hi ? *hi : static_cast<int64_t>(open_cap(static_cast<uint64_t>(std::abs(*lo))));
  QINFER_CHECK(a <= b, "json_schema: no integer is within the bounds at {}", where(path));
  return integer_range(a, b);
}

// The fraction part ("" or '.' digits) of a decimal whose integer part equals the bounds': the
// digits compare to the bounds' fractions lexicographically (zero-padded), tracked as "equal to the
// lower bound so far" / "equal to the upper bound so far". Absent bounds are open.
std::optional<Element> Builder::fraction(const std::string* lo, bool lo_exclusive, const std::string* hi,
                                         bool hi_exclusive) {
  if (!lo && !hi) return optional_fraction();
  std::map<std::tuple<int, bool, bool>, std::optional<Element>> memo;
  std::function<std::optional<Element>(int, bool, bool)> state = [&](int i, bool on_lo,
                                                                     bool on_hi) -> std::optional<Element> {
    if (!on_lo && !on_hi) {
      return cached(fmt::format("fraction-tail-{}", i),
                    [&] { return repeat("digits", {chars("0-9")}, 0, kMaxFractionDigits - i); });
    }
    if (auto it = memo.find({i, on_lo, on_hi}); it != memo.end()) return it->second;
    std::vector<Sequence> alts;
    // Ending equals the bound exactly when its remaining digits are all zeros (there are none: no
    // trailing zeros), so only an inclusive bound may end there; below a lower bound may not end.
    const bool end_lo = !on_lo || (i >= static_cast<int>(lo->size()) && !lo_exclusive);
    const bool end_hi = !on_hi || !(i >= static_cast<int>(hi->size()) && hi_exclusive);
    if (i >= 1 && end_lo && end_hi) alts.push_back({});
    if (i < kMaxFractionDigits) {
      auto digit_at = [&](const std::string* s) { return i < static_cast<int>(s->size()) ? (*s)[i] - '0' : 0; };
      const int dlo = on_lo ? digit_at(lo) : 0, dhi = on_hi ? digit_at(hi) : 9;
      auto add = [&](int a, int b, bool next_lo, bool next_hi) {
        if (a > b) return;
        if (auto next = state(i + 1, next_lo, next_hi)) alts.push_back({digit_range(a, b), *next});
      };
      if (on_lo && on_hi && dlo == dhi) {
        add(dlo, dhi, true, true);
      } else if (dlo <= dhi) {
        if (on_lo) add(dlo, dlo, true, false);
        add(dlo + (on_lo ? 1 : 0), dhi - (on_hi ? 1 : 0), false, false);
        if (on_hi) add(dhi, dhi, false, true);
      }
    }
    std::optional<Element> result;
    if (!alts.empty()) result = g_.choice(fresh_name("fraction-digits"), std::move(alts));
    memo[{i, on_lo, on_hi}] = result;
    return result;
  };
  std::vector<Sequence> alts;
  const bool zero_ok = (!lo || (lo->empty() && !lo_exclusive)) && (!hi || !(hi->empty() && hi_exclusive));
  if (zero_ok) alts.push_back({});
  if (auto digits = state(0, lo != nullptr, hi != nullptr)) alts.push_back({g_.byte('.'), *digits});
  if (alts.empty()) return std::nullopt;
  return g_.choice(fresh_name("fraction"), std::move(alts));
}

// Decimals (no exponent, no sign) in [lo, hi]: integer parts strictly between the bounds' take any
// fraction, an integer part equal to a bound's takes the fractions that bound allows.
void Builder::nonnegative_decimals(const Bound& lo, const std::optional<Bound>& hi, const Sequence& prefix,
                                   std::vector<Sequence>& out) {
  const uint64_t li = lo.value.int_part, hi_int = hi ? hi->value.int_part : open_cap(li);
  if (li > hi_int) return;
  auto with_int = [&](uint64_t value, std::optional<Element> frac) {
    if (!frac) return;
    Sequence s = prefix;
    for (Element e : g_.literal(std::to_string(value))) s.push_back(e);
    s.push_back(*frac);
    out.push_back(std::move(s));
  };
  if (li == hi_int) {
    with_int(li, fraction(&lo.value.fraction, lo.exclusive, hi ? &hi->value.fraction : nullptr, hi && hi->exclusive));
    return;
  }
  with_int(li, fraction(&lo.value.fraction, lo.exclusive, nullptr, false));
  if (li + 1 < hi_int) {
    for (Sequence& s : unsigned_range(li + 1, hi_int - 1)) {
      s.insert(s.begin(), prefix.begin(), prefix.end());
      s.push_back(optional_fraction());
      out.push_back(std::move(s));
    }
  }
  with_int(hi_int, hi ? fraction(nullptr, false, &hi->value.fraction, hi->exclusive) : optional_fraction());
}

Element Builder::number(const Json& s, const std::string& path) {
  const std::optional<Bound> lower = bound_of(s, true, path), upper = bound_of(s, false, path);
  if (!lower && !upper) return any_number();
  if (lower && upper) {
    const int c = compare(lower->value, upper->value);
    QINFER_CHECK(c < 0 || (c == 0 && !lower->exclusive && !upper->exclusive),
                 "json_schema: no number is within the bounds at {}", where(path));
  }
  std::vector<Sequence> alts;
  const Bound zero_inclusive{}, zero_exclusive{Decimal{}, true, ""};
  // The non-negative values: from max(lower, 0) to upper.
  if (!upper || !upper->value.negative) {
    if (!(upper && upper->value.zero() && upper->exclusive))
      nonnegative_decimals(lower && !lower->value.negative ? *lower : zero_inclusive, upper, {}, alts);
  }
  // The negative values as '-' and their magnitude: above max(-upper, 0) (0 itself is written
  // without the sign), up to -lower.
  if (!lower || lower->value.negative) {
    Bound from = zero_exclusive;
    if (upper && upper->value.negative)
      from = {Decimal{false, upper->value.int_part, upper->value.fraction}, upper->exclusive, ""};
    std::optional<Bound> to;
    if (lower) to = Bound{Decimal{false, lower->value.int_part, lower->value.fraction}, lower->exclusive, ""};
    nonnegative_decimals(from, to, {g_.byte('-')}, alts);
  }
  QINFER_CHECK(!alts.empty(), "json_schema: no number is within the bounds at {}", where(path));
  return g_.choice(fresh_name("number-range"), std::move(alts));
}

// ---- any value

Element Builder::any_value() {
  if (value_) return *value_;
  const int32_t id = g_.add_rule("value");
  value_ = Grammar::rule(id);
  // Lists are the same state repeated; objects use the members chain with only additional members.
  const int32_t after = g_.add_rule("array-items");
  g_.add_alternative(after, ws_inner());
  Sequence more = ws_inner();
  more.push_back(g_.byte(','));
  for (Element e : ws_separator()) more.push_back(e);
  more.push_back(*value_);
  more.push_back(Grammar::rule(after));
  g_.add_alternative(after, std::move(more));
  Sequence list{g_.byte('[')};
  for (Element e : ws_inner()) list.push_back(e);
  list.push_back(optional("array-items-first", {*value_, Grammar::rule(after)}));
  list.push_back(g_.byte(']'));
  g_.add_alternative(id, {any_object()});
  g_.add_alternative(id, std::move(list));
  g_.add_alternative(id, {any_string()});
  g_.add_alternative(id, {any_number()});
  g_.add_alternative(id, g_.literal("true"));
  g_.add_alternative(id, g_.literal("false"));
  g_.add_alternative(id, g_.literal("null"));
  return *value_;
}

Element Builder::any_object() {
  if (object_) return *object_;
  Sequence member{any_string()};
  for (Element e : ws_inner()) member.push_back(e);
  member.push_back(g_.byte(':'));
  for (Element e : ws_separator()) member.push_back(e);
  // The value rule refers to this object: reserve it before building the members.
  const int32_t id = g_.add_rule("object");
  object_ = Grammar::rule(id);
  member.push_back(any_value());
  g_.add_alternative(id, {object_of({}, {}, std::move(member))});
  return *object_;
}

// ---- allOf

// The allOf of two schemas as one: keywords of different members are independent assertions and
// join, those both set combine where the combination is exact (required: union; type:
// intersection; minimums: the larger; properties: per name an allOf), and anything else set twice
// with different values is refused. $refs are resolved first, so merged schemas have none.
Json merge_allof(const Json& a_in, const Json& b_in, const std::string& path, int depth, const Json& root) {
  QINFER_CHECK(depth < kMaxMergeDepth, "json_schema: \"allOf\" / \"$ref\" at {} refer to each other in a cycle",
               where(path));
  auto normalize = [&](const Json& s) -> Json {
    if (s.is_boolean()) return s.get<bool>() ? Json::object() : Json(false);
    QINFER_CHECK(s.is_object(), "json_schema: the schema at {} must be an object or a boolean", where(path));
    Json out = s;
    if (out.contains("$ref")) {
      QINFER_CHECK(out["$ref"].is_string(), "json_schema: \"$ref\" at {} must be a string", where(path));
      const std::string ref = out["$ref"].get<std::string>();
      out.erase("$ref");
      out = merge_allof(out, *resolve(root, ref, path).first, path, depth + 1, root);
    }
    if (out.is_object() && out.contains("allOf")) {
      const Json all = out["allOf"];
      QINFER_CHECK(all.is_array() && !all.empty(), "json_schema: \"allOf\" at {} must be a non-empty array",
                   where(path));
      out.erase("allOf");
      for (const Json& member : all) out = merge_allof(out, member, path, depth + 1, root);
    }
    return out;
  };
  const Json a = normalize(a_in), b = normalize(b_in);
  if (a.is_boolean() || b.is_boolean()) return false;  // normalize leaves only false as a boolean
  auto conj = [&](const Json& x, const Json& y) -> Json {
    if (x.is_boolean() && !x.get<bool>()) return false;
    if (y.is_boolean() && !y.get<bool>()) return false;
    if ((x.is_boolean() && x.get<bool>()) || x == Json::object()) return y;
    if ((y.is_boolean() && y.get<bool>()) || y == Json::object()) return x;
    return Json{{"allOf", Json::array({x, y})}};
  };
  Json out = a;
  for (const auto& [key, value] : b.items()) {
    if (!out.contains(key)) {
      out[key] = value;
      continue;
    }
    Json& mine = out[key];
    if (is_annotation(key) || mine == value) continue;
    if (key == "required" && mine.is_array() && value.is_array()) {
      for (const Json& name : value)
        if (std::find(mine.begin(), mine.end(), name) == mine.end()) mine.push_back(name);
    } else if (key == "type") {
      const int t = intersect_types(declared_types(mine, path), declared_types(value, path));
      QINFER_CHECK(t != 0, "json_schema: the \"allOf\" at {} has types with nothing in common", where(path));
      mine = types_json(t);
    } else if ((key == "minLength" || key == "minItems" || key == "maxLength" || key == "maxItems") &&
               mine.is_number() && value.is_number()) {
      const bool take_larger = key.starts_with("min");
      if ((value > mine) == take_larger) mine = value;
    } else if ((key == "minimum" || key == "maximum") && mine.is_number() && value.is_number()) {
      const int c = compare(decimal_of(value, key, path), decimal_of(mine, key, path));
      if ((key == "minimum") == (c > 0)) mine = value;
    } else if (key != "properties" && key != "additionalProperties") {
      fail("json_schema: \"{}\" in more than one schema of the \"allOf\" at {} is not supported", key, where(path));
    }
  }
  // Draft 4's boolean exclusiveMinimum would change the other schema's minimum.
  for (auto [exclusive, inclusive] : {std::pair{"exclusiveMinimum", "minimum"}, {"exclusiveMaximum", "maximum"}})
    for (auto [x, y] : {std::pair{&a, &b}, {&b, &a}})
      if (x->contains(exclusive) && (*x)[exclusive].is_boolean() && y->contains(inclusive))
        fail("json_schema: a boolean \"{}\" in one schema of the \"allOf\" at {} is not supported", exclusive,
             where(path));
  for (const char* key : {"items", "prefixItems", "additionalItems"})
    for (const char* other : {"items", "prefixItems", "additionalItems"})
      if (a.contains(key) && b.contains(other) && !(std::string_view(key) == other && a[key] == b[other]))
        fail("json_schema: \"{}\" and \"{}\" in different schemas of the \"allOf\" at {} are not supported", key, other,
             where(path));
  // Properties: a name one side declares is, on the other side, its property or its
  // additionalProperties; additionalProperties themselves are the conjunction. An absent
  // additionalProperties is no constraint here (strict mode's default applies to the result).
  if (a.contains("properties") || b.contains("properties") || a.contains("additionalProperties") ||
      b.contains("additionalProperties")) {
    const Json pa = a.value("properties", Json::object()), pb = b.value("properties", Json::object());
    const Json add_a = a.value("additionalProperties", Json(true)), add_b = b.value("additionalProperties", Json(true));
    Json properties = Json::object();
    auto side = [](const Json& props, const Json& additional, const std::string& name) {
      return props.contains(name) ? props[name] : additional;
    };
    for (const Json* props : {&pa, &pb})
      for (const auto& [name, _] : props->items())
        if (!properties.contains(name)) properties[name] = conj(side(pa, add_a, name), side(pb, add_b, name));
    if (!properties.empty()) out["properties"] = properties;
    if (a.contains("additionalProperties") || b.contains("additionalProperties"))
      out["additionalProperties"] = conj(add_a, add_b);
  }
  return out;
}

}  // namespace

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options,
                            const std::string& pointer) {
  Grammar g;
  Builder builder(g, schema, options);
  const Element value = builder.pointer(pointer, pointer == "#" ? "" : pointer.substr(1));
  Sequence root;
  if (options.any_whitespace)
    root = {builder.whitespace(), value, builder.whitespace()};
  else
    root = {value};
  g.set_root(g.add_rule("root"));
  g.add_alternative(g.root(), std::move(root));
  try {
    g.validate();
  } catch (const Error& e) {
    fail("json_schema: the schema cannot be generated: {}", e.what());
  }
  return g;
}

Grammar json_schema_grammar(const io::json& schema, const JsonSchemaOptions& options) {
  return json_schema_grammar(nlohmann::ordered_json(schema), options);
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
  JsonSchemaOptions any_keys = options;
  any_keys.strict = false;  // strict's default would leave only {}
  return json_schema_grammar(nlohmann::ordered_json{{"type", "object"}}, any_keys);
}

}  // namespace qinfer::grammar
