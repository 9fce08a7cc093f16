#include "tokenizer/jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/pystr.h"

namespace qinfer::jinja {
namespace {

// Self-referencing namespaces would print forever; Python prints `...`, we stop with an error.
constexpr int kMaxNesting = 200;

void check_depth(int depth) {
  if (depth > kMaxNesting) raise(ErrorKind::limit, "value nested more than {} levels deep", kMaxNesting);
}

// Lists share their items, so a small list can print as a huge string ([s] * 1000): the printers
// check the memory budget as their output grows, before it is allocated.
void repr_into(std::string& out, const Value& v, int depth);

void repr_items(std::string& out, const ValueList& items, int depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    repr_into(out, items[i], depth + 1);
  }
}

void repr_dict(std::string& out, const Dict& d, int depth) {
  out += '{';
  bool first = true;
  for (const auto& [k, v] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    repr_into(out, k, depth + 1);
    out += ": ";
    repr_into(out, v, depth + 1);
  }
  out += '}';
}

void repr_into(std::string& out, const Value& v, int depth) {
  check_depth(depth);
  ensure_bytes(out.size() + (v.is_string() ? v.as_string().size() : 0));
  switch (v.kind()) {
    case Kind::undefined: out += "Undefined"; return;
    case Kind::none: out += "None"; return;
    case Kind::boolean: out += v.as_bool() ? "True" : "False"; return;
    case Kind::integer: out += std::to_string(v.as_int()); return;
    case Kind::floating: out += py::float_repr(v.as_float()); return;
    case Kind::string:
      if (v.is_markup()) out += "Markup(" + py::repr(v.as_string()) + ")";
      else out += py::repr(v.as_string());
      return;
    case Kind::list:
      switch (v.flavor()) {
        case ListFlavor::tuple:
          out += '(';
          repr_items(out, v.as_list(), depth);
          out += v.as_list().size() == 1 ? ",)" : ")";
          return;
        case ListFlavor::iterator:
        case ListFlavor::failed_iterator: out += fmt::format("<{} object>", v.list_type_name()); return;
        case ListFlavor::view:
          out += v.list_type_name();
          out += "([";
          repr_items(out, v.as_list(), depth);
          out += "])";
          return;
        case ListFlavor::list:
          out += '[';
          repr_items(out, v.as_list(), depth);
          out += ']';
          return;
      }
      return;
    case Kind::dict: repr_dict(out, v.as_dict(), depth); return;
    case Kind::namespace_:
      out += "<Namespace ";
      repr_dict(out, v.as_dict(), depth);
      out += '>';
      return;
    case Kind::macro: out += "<Macro " + py::repr(v.as_macro().name) + ">"; return;
    case Kind::function: out += "<built-in function " + v.as_function().name + ">"; return;
    case Kind::object: out += "<" + v.as_object().type_name() + " object>"; return;
  }
}

std::string repr_of(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  ensure_bytes(out.size() + s.size());
  out += '"';
  auto escape_code = [&](unsigned c) { out += fmt::format("\\u{:04x}", c); };
  if (!ensure_ascii) {
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      switch (ch) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20) escape_code(c);
          else out += ch;
      }
    }
  } else {
    for (char32_t c : py::decode(s)) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
          } else if (c > 0xffff) {
            const unsigned v = c - 0x10000;
            escape_code(0xd800 | (v >> 10));
            escape_code(0xdc00 | (v & 0x3ff));
          } else {
            escape_code(c);
          }
      }
    }
  }
  out += '"';
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return py::float_repr(f);
}

void json_at(std::string& out, const Value& v, const JsonOptions& o, int depth) {
  check_depth(depth);
  auto newline = [&](int level) {
    if (!o.indent) return;
    ensure_bytes(out.size() + o.indent->size() * static_cast<size_t>(level));
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Kind::none: out += "null"; return;
    case Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Kind::integer: out += std::to_string(v.as_int()); return;
    case Kind::floating: out += json_float(v.as_float()); return;
    case Kind::string: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Kind::list: {
      if (!v.is_sequence_list())
        raise(ErrorKind::type, "Object of type {} is not JSON serializable", v.list_type_name());
      const ValueList& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        ensure_bytes(out.size() + o.item_separator.size());
        if (i) out += o.item_separator;
        newline(depth + 1);
        json_at(out, items[i], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::dict: {
      const Dict& d = v.as_dict();
      if (d.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [key, value] : d.entries()) {
        std::string k;
        switch (key.kind()) {
          case Kind::string: k = key.as_string(); break;
          case Kind::integer: k = std::to_string(key.as_int()); break;
          case Kind::floating: k = json_float(key.as_float()); break;
          case Kind::boolean: k = key.as_bool() ? "true" : "false"; break;
          case Kind::none: k = "null"; break;
          default: raise(ErrorKind::type, "keys must be str, int, float, bool or None, not {}", type_name(key));
        }
        items.emplace_back(std::move(k), &value);
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        ensure_bytes(out.size() + o.item_separator.size() + o.key_separator.size());
        if (i) out += o.item_separator;
        newline(depth + 1);
        json_string(out, items[i].first, o.ensure_ascii);
        out += o.key_separator;
        json_at(out, *items[i].second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: raise(ErrorKind::type, "Object of type {} is not JSON serializable", type_name(v));
  }
}

}  // namespace

Value::Value(Dict dict) : kind_(Kind::dict), ptr_(std::make_shared<Dict>(std::move(dict))) {
  charge_bytes(kValueOverhead + as_dict().size() * kDictEntryBytes);
}

Value Value::undefined(std::string message) {
  Value v;
  v.ptr_ = std::make_shared<std::string>(std::move(message));
  return v;
}

Value Value::unsafe(std::string message) {
  Value v = undefined(std::move(message));
  v.flag_ = true;
  return v;
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.flag_ = true;
  return v;
}

Value Value::tuple(ValueList items) {
  Value v(std::move(items));
  v.flag_ = static_cast<uint8_t>(ListFlavor::tuple);
  return v;
}

Value Value::iterator(ValueList items, const char* type) {
  Value v(std::move(items));
  v.flag_ = static_cast<uint8_t>(ListFlavor::iterator);
  v.scalar_.type = type;
  return v;
}

Value Value::view(ValueList items, const char* type) {
  Value v(std::move(items));
  v.flag_ = static_cast<uint8_t>(ListFlavor::view);
  v.scalar_.type = type;
  return v;
}

Value Value::failed_iterator(int error_kind, std::string message) {
  Value v(ValueList{Value(std::move(message)), Value(error_kind)});
  v.flag_ = static_cast<uint8_t>(ListFlavor::failed_iterator);
  v.scalar_.type = "generator";
  return v;
}

const char* Value::list_type_name() const {
  switch (flavor()) {
    case ListFlavor::list: return "list";
    case ListFlavor::tuple: return "tuple";
    default: return scalar_.type;
  }
}

Value Value::namespace_of(Dict attributes) {
  Value v(std::move(attributes));
  v.kind_ = Kind::namespace_;
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return nullptr;
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
      return static_cast<double>(u);
    }
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return j.get<std::string>();
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item));
      return items;
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [key, item] : j.items()) d.set(Value(key), from_json(item));
      return d;
    }
    default: return nullptr;
  }
}

Dict& Value::as_dict() const { return *static_cast<Dict*>(ptr_.get()); }

std::string Value::undefined_message() const { return ptr_ ? *static_cast<const std::string*>(ptr_.get()) : ""; }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return scalar_.b;
    case Kind::integer: return scalar_.i != 0;
    case Kind::floating: return scalar_.f != 0.0;
    case Kind::string: return !as_string().empty();
    case Kind::list: return is_iterator() || !as_list().empty();
    case Kind::dict: return !as_dict().empty();
    default: return true;
  }
}

const Value* Dict::find(std::string_view key) const {
  count_scan(key.size());
  auto it = string_index_.find(std::string(key));
  return it == string_index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(key.as_string());
  count_steps(entries_.size());
  for (const auto& [k, v] : entries_)
    if (!k.is_string() && py_equal(k, key)) return &v;
  return nullptr;
}

void Dict::set(const Value& key, Value value) {
  if (key.is_string()) {
    count_scan(key.as_string().size());
    auto [it, inserted] = string_index_.emplace(key.as_string(), entries_.size());
    if (!inserted) {
      entries_[it->second].second = std::move(value);
      return;
    }
    entries_.emplace_back(key, std::move(value));
    return;
  }
  count_steps(entries_.size());
  for (auto& [k, v] : entries_) {
    if (!k.is_string() && py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(key, std::move(value));
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return "";
    case Kind::string: return v.as_string();
    default: return repr_of(v);
  }
}

std::string to_repr(const Value& v) { return repr_of(v); }

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return v.is_markup() ? "Markup" : "str";
    case Kind::list: return v.list_type_name();
    case Kind::dict: return "dict";
    case Kind::namespace_: return "Namespace";
    case Kind::macro: return "Macro";
    case Kind::function: return "builtin_function_or_method";
    case Kind::object: return v.as_object().type_name();
  }
  return "object";
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::floating || b.kind() == Kind::floating) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::undefined:
    case Kind::none: return true;
    case Kind::string:
      count_scan(a.as_string().size());
      return a.as_string() == b.as_string();
    case Kind::list: {
      if (a.flavor() != b.flavor() || a.is_iterator()) return a.identity() == b.identity();
      if (a.is_view() && std::string_view(a.list_type_name()) != b.list_type_name()) return false;
      const ValueList &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      count_steps(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        if (!py_equal(x[i], y[i])) return false;
      return true;
    }
    case Kind::dict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.size() != y.size()) return false;
      count_steps(x.size());
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.find(k);
        if (!other || !py_equal(v, *other)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

int py_compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) raise(ErrorKind::undefined, "{}", a.undefined_message());
  if (b.is_undefined()) raise(ErrorKind::undefined, "{}", b.undefined_message());
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::floating || b.kind() == Kind::floating) {
      const double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    count_scan(std::min(a.as_string().size(), b.as_string().size()));
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()) {
    const ValueList &x = a.as_list(), &y = b.as_list();
    count_steps(std::min(x.size(), y.size()));
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!py_equal(x[i], y[i])) return py_compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  raise(ErrorKind::type, "'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b));
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_at(out, v, options, 0);
  return out;
}

}  // namespace qinfer::jinja
