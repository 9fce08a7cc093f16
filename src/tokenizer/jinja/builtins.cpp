#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/params.h"
#include "tokenizer/jinja/pystr.h"

namespace qinfer::jinja {
namespace {

// Jinja2's sandbox refuses larger ranges (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

[[noreturn]] void unsupported_operands(std::string_view op, const Value& a, const Value& b) {
  raise(ErrorKind::type, "unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

Value make_function(std::string name, std::function<Value(CallArgs&)> call) {
  return Value(std::make_shared<Function>(Function{std::move(name), std::move(call)}));
}

bool is_unhashable(const Value& v) {
  return (v.is_list() && (v.flavor() == ListFlavor::list || v.is_view())) || v.is_dict() ||
         v.kind() == Kind::namespace_;
}

bool is_dunder(const std::string& name) {
  return name.size() > 4 && name.starts_with("__") && name.ends_with("__");
}

Value unsafe_attribute(const Value& obj, const std::string& name) {
  return Value::unsafe(fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type_name(obj)));
}

Value no_attribute(const Value& obj, const std::string& name) {
  return Value::undefined(fmt::format("{} has no attribute {}", py::repr(object_type_repr(obj)), py::repr(name)));
}

Value no_element(const Value& obj, const Value& key) {
  return Value::undefined(fmt::format("{} has no element {}", object_type_repr(obj), to_repr(key)));
}

[[noreturn]] void overflow() {
  raise(ErrorKind::limit, "integer overflow (Python integers are unbounded; qinfer's are 64-bit)");
}

int64_t add_int(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}

int64_t sub_int(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}

int64_t mul_int(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

// The size of `times` copies of `unit` bytes, refused unless the render's memory budget holds it.
size_t repeated_size(size_t unit, int64_t times) {
  uint64_t total;
  if (__builtin_mul_overflow(static_cast<uint64_t>(times), static_cast<uint64_t>(unit), &total))
    raise(ErrorKind::limit, "repetition too large");
  ensure_bytes(total);
  return total;
}

Value repeat(const Value& seq, int64_t times) {
  times = std::max<int64_t>(times, 0);
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    const size_t total = repeated_size(s.size(), times);
    if (total == 0) return std::string();
    // By doubling: memcpy speed even for a one-character string repeated a hundred million times.
    std::string out;
    out.reserve(total);
    out = s;
    while (out.size() * 2 <= total) out.append(out.data(), out.size());
    out.append(out.data(), total - out.size());
    return out;
  }
  const ValueList& items = seq.as_list();
  ValueList out;
  out.reserve(repeated_size(items.size() * sizeof(Value), times) / sizeof(Value));
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
}

double float_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// ---------------------------------------------------------------------------------------------
// Methods of str, list and dict.

using Method = Value (*)(const Value& self, CallArgs& args);

std::string self_str(const Value& self) { return self.as_string(); }

bool prefix_test(const Value& self, CallArgs& args, bool suffix) {
  const char* fn = suffix ? "endswith" : "startswith";
  Params p(fn, args, {"prefix", "start", "end"}, 1);
  std::string_view s = self.as_string();
  std::string part_text;
  if (p.given(1) || p.given(2)) {
    const int64_t n = static_cast<int64_t>(py::length(s));
    std::u32string text = py::decode(s);
    auto idx = py::slice_indices(n, p.given(1) ? std::optional(p.integer(1, 0)) : std::nullopt,
                                 p.given(2) ? std::optional(p.integer(2, 0)) : std::nullopt, 1);
    std::u32string part;
    for (int64_t i : idx) part += text[i];
    part_text = py::encode(part);
    s = part_text;
  }
  auto test = [&](const Value& v) {
    if (!v.is_string())
      raise(ErrorKind::type, "{} first arg must be str or a tuple of str, not {}", fn, type_name(v));
    count_scan(v.as_string().size());
    return suffix ? s.ends_with(v.as_string()) : s.starts_with(v.as_string());
  };
  if (p[0].is_tuple()) return std::any_of(p[0].as_list().begin(), p[0].as_list().end(), test);
  return test(p[0]);
}

Value strip_method(const Value& self, CallArgs& args, const char* name, bool left, bool right) {
  Params p(name, args, {"chars"});
  return py::strip(self.as_string(), p.optional_string(0), left, right);
}

Value split_method(const Value& self, CallArgs& args, bool from_right) {
  Params p(from_right ? "rsplit" : "split", args, {"sep", "maxsplit"});
  auto sep = p.optional_string(0);
  if (sep && sep->empty()) raise(ErrorKind::value, "empty separator");
  ValueList out;
  for (auto& part : py::split(self.as_string(), sep, p.integer(1, -1), from_right)) out.emplace_back(std::move(part));
  return out;
}

Value find_method(const Value& self, CallArgs& args, const char* name, bool from_right, bool must_exist) {
  Params p(name, args, {"sub"}, 1);
  const int64_t at = py::find(self.as_string(), p.string(0), from_right);
  if (at < 0 && must_exist) raise(ErrorKind::value, "substring not found");
  return at;
}

Value justify(const Value& self, CallArgs& args, const char* name, int mode) {
  Params p(name, args, {"width", "fillchar"}, 1);
  const std::string fill = p.has(1) ? p.string(1) : " ";
  if (py::length(fill) != 1) raise(ErrorKind::type, "The fill character must be exactly one character long");
  const std::string& s = self.as_string();
  const int64_t len = static_cast<int64_t>(py::length(s)), width = p.integer(0, 0);
  if (width <= len) return s;
  const int64_t pad = width - len;
  // CPython's center() puts the odd space on the left only when the width is odd.
  const int64_t left = mode < 0 ? 0 : mode > 0 ? pad : pad / 2 + (pad & width & 1);
  std::string out;
  out.reserve(s.size() + repeated_size(fill.size(), pad));
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < pad - left; ++i) out += fill;
  return out;
}

const std::unordered_map<std::string_view, Method>& string_methods() {
  static const std::unordered_map<std::string_view, Method> methods = {
      {"startswith", [](const Value& s, CallArgs& a) { return Value(prefix_test(s, a, false)); }},
      {"endswith", [](const Value& s, CallArgs& a) { return Value(prefix_test(s, a, true)); }},
      {"strip", [](const Value& s, CallArgs& a) { return strip_method(s, a, "strip", true, true); }},
      {"lstrip", [](const Value& s, CallArgs& a) { return strip_method(s, a, "lstrip", true, false); }},
      {"rstrip", [](const Value& s, CallArgs& a) { return strip_method(s, a, "rstrip", false, true); }},
      {"split", [](const Value& s, CallArgs& a) { return split_method(s, a, false); }},
      {"rsplit", [](const Value& s, CallArgs& a) { return split_method(s, a, true); }},
      {"splitlines",
       [](const Value& s, CallArgs& a) {
         Params p("splitlines", a, {"keepends"});
         ValueList out;
         for (auto& line : py::splitlines(s.as_string(), p.has(0) && p[0].truthy())) out.emplace_back(std::move(line));
         return Value(std::move(out));
       }},
      {"replace",
       [](const Value& s, CallArgs& a) {
         Params p("replace", a, {"old", "new", "count"}, 2);
         return Value(py::replace(s.as_string(), p.string(0), p.string(1), p.integer(2, -1)));
       }},
      {"upper", [](const Value& s, CallArgs& a) { Params("upper", a, {}); return Value(py::upper(self_str(s))); }},
      {"lower", [](const Value& s, CallArgs& a) { Params("lower", a, {}); return Value(py::lower(self_str(s))); }},
      {"casefold",
       [](const Value& s, CallArgs& a) { Params("casefold", a, {}); return Value(py::lower(self_str(s))); }},
      {"title", [](const Value& s, CallArgs& a) { Params("title", a, {}); return Value(py::title(self_str(s))); }},
      {"capitalize",
       [](const Value& s, CallArgs& a) { Params("capitalize", a, {}); return Value(py::capitalize(self_str(s))); }},
      {"find", [](const Value& s, CallArgs& a) { return find_method(s, a, "find", false, false); }},
      {"rfind", [](const Value& s, CallArgs& a) { return find_method(s, a, "rfind", true, false); }},
      {"index", [](const Value& s, CallArgs& a) { return find_method(s, a, "index", false, true); }},
      {"rindex", [](const Value& s, CallArgs& a) { return find_method(s, a, "rindex", true, true); }},
      {"count",
       [](const Value& s, CallArgs& a) {
         Params p("count", a, {"sub"}, 1);
         return Value(py::count(s.as_string(), p.string(0)));
       }},
      {"join",
       [](const Value& s, CallArgs& a) {
         Params p("join", a, {"iterable"}, 1);
         std::string out;
         const ValueList items = iterate(p[0]);
         for (size_t i = 0; i < items.size(); ++i) {
           if (!items[i].is_string())
             raise(ErrorKind::type, "sequence item {}: expected str instance, {} found", i, type_name(items[i]));
           ensure_bytes(out.size() + s.as_string().size() + items[i].as_string().size());
           if (i) out += s.as_string();
           out += items[i].as_string();
         }
         return Value(std::move(out));
       }},
      {"isdigit", [](const Value& s, CallArgs& a) { Params("isdigit", a, {}); return Value(py::is_digit(self_str(s))); }},
      {"isdecimal",
       [](const Value& s, CallArgs& a) { Params("isdecimal", a, {}); return Value(py::is_digit(self_str(s))); }},
      {"isnumeric",
       [](const Value& s, CallArgs& a) { Params("isnumeric", a, {}); return Value(py::is_digit(self_str(s))); }},
      {"isalpha", [](const Value& s, CallArgs& a) { Params("isalpha", a, {}); return Value(py::is_alpha(self_str(s))); }},
      {"isalnum", [](const Value& s, CallArgs& a) { Params("isalnum", a, {}); return Value(py::is_alnum(self_str(s))); }},
      {"isspace",
       [](const Value& s, CallArgs& a) { Params("isspace", a, {}); return Value(py::is_all_space(self_str(s))); }},
      {"islower", [](const Value& s, CallArgs& a) { Params("islower", a, {}); return Value(py::is_lower(self_str(s))); }},
      {"isupper", [](const Value& s, CallArgs& a) { Params("isupper", a, {}); return Value(py::is_upper(self_str(s))); }},
      {"removeprefix",
       [](const Value& s, CallArgs& a) {
         Params p("removeprefix", a, {"prefix"}, 1);
         const std::string prefix = p.string(0);
         const std::string& t = s.as_string();
         return Value(t.starts_with(prefix) ? t.substr(prefix.size()) : t);
       }},
      {"removesuffix",
       [](const Value& s, CallArgs& a) {
         Params p("removesuffix", a, {"suffix"}, 1);
         const std::string suffix = p.string(0);
         const std::string& t = s.as_string();
         return Value(!suffix.empty() && t.ends_with(suffix) ? t.substr(0, t.size() - suffix.size()) : t);
       }},
      {"partition",
       [](const Value& s, CallArgs& a) {
         Params p("partition", a, {"sep"}, 1);
         const std::string sep = p.string(0), &t = s.as_string();
         if (sep.empty()) raise(ErrorKind::value, "empty separator");
         const size_t at = t.find(sep);
         if (at == std::string::npos) return Value::tuple({t, "", ""});
         return Value::tuple({t.substr(0, at), sep, t.substr(at + sep.size())});
       }},
      {"rpartition",
       [](const Value& s, CallArgs& a) {
         Params p("rpartition", a, {"sep"}, 1);
         const std::string sep = p.string(0), &t = s.as_string();
         if (sep.empty()) raise(ErrorKind::value, "empty separator");
         const size_t at = t.rfind(sep);
         if (at == std::string::npos) return Value::tuple({"", "", t});
         return Value::tuple({t.substr(0, at), sep, t.substr(at + sep.size())});
       }},
      {"center", [](const Value& s, CallArgs& a) { return justify(s, a, "center", 0); }},
      {"ljust", [](const Value& s, CallArgs& a) { return justify(s, a, "ljust", -1); }},
      {"rjust", [](const Value& s, CallArgs& a) { return justify(s, a, "rjust", 1); }},
      {"zfill",
       [](const Value& s, CallArgs& a) {
         Params p("zfill", a, {"width"}, 1);
         std::string t = s.as_string();
         const int64_t pad = p.integer(0, 0) - static_cast<int64_t>(py::length(t));
         if (pad <= 0) return Value(t);
         ensure_bytes(t.size() + static_cast<uint64_t>(pad));
         const size_t sign = !t.empty() && (t[0] == '-' || t[0] == '+') ? 1 : 0;
         t.insert(sign, std::string(static_cast<size_t>(pad), '0'));
         return Value(t);
       }},
  };
  return methods;
}

// str attributes CPython has and this engine does not implement: calling them says so.
bool is_python_str_attribute(std::string_view name) {
  static const std::array<std::string_view, 10> names = {"encode",     "expandtabs", "format",   "format_map",
                                                         "isascii",    "isidentifier", "isprintable", "istitle",
                                                         "maketrans",  "swapcase"};
  return std::find(names.begin(), names.end(), name) != names.end() || name == "translate";
}

Value list_method(const Value& self, const std::string& name) {
  if (name == "count")
    return make_function("count", [self](CallArgs& a) {
      Params p("count", a, {"value"}, 1);
      count_steps(self.as_list().size());
      return Value(static_cast<int64_t>(
          std::count_if(self.as_list().begin(), self.as_list().end(), [&](const Value& v) { return py_equal(v, p[0]); })));
    });
  if (name == "index")
    return make_function("index", [self](CallArgs& a) {
      Params p("index", a, {"value"}, 1);
      const ValueList& items = self.as_list();
      count_steps(items.size());
      for (size_t i = 0; i < items.size(); ++i)
        if (py_equal(items[i], p[0])) return Value(static_cast<int64_t>(i));
      raise(ErrorKind::value, "{} is not in list", to_repr(p[0]));
    });
  if (name == "copy" && self.flavor() == ListFlavor::list)
    return make_function("copy", [self](CallArgs& a) {
      Params("copy", a, {});
      return Value(self.as_list());
    });
  return {};
}

Value dict_items_view(const Dict& d) {
  ValueList out;
  for (const auto& [k, v] : d.entries()) out.push_back(Value::tuple({k, v}));
  return Value::view(std::move(out), "dict_items");
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "get")
    return make_function("get", [self](CallArgs& a) {
      Params p("get", a, {"key", "default"}, 1);
      const Value* found = self.as_dict().find(p[0]);
      return found ? *found : p.get_or(1, nullptr);
    });
  if (name == "items")
    return make_function("items", [self](CallArgs& a) {
      Params("items", a, {});
      return dict_items_view(self.as_dict());
    });
  if (name == "keys" || name == "values") {
    const bool keys = name == "keys";
    return make_function(name, [self, keys](CallArgs& a) {
      Params(keys ? "keys" : "values", a, {});
      ValueList out;
      for (const auto& [k, v] : self.as_dict().entries()) out.push_back(keys ? k : v);
      return Value::view(std::move(out), keys ? "dict_keys" : "dict_values");
    });
  }
  if (name == "copy")
    return make_function("copy", [self](CallArgs& a) {
      Params("copy", a, {});
      return Value(self.as_dict());
    });
  return {};
}

bool is_mutating(const Value& obj, const std::string& name) {
  static const std::array<std::string_view, 8> list_names = {"append", "clear",  "pop",    "reverse",
                                                             "insert", "sort",   "extend", "remove"};
  static const std::array<std::string_view, 5> dict_names = {"clear", "pop", "popitem", "setdefault", "update"};
  if (obj.is_list() && obj.flavor() == ListFlavor::list)
    return std::find(list_names.begin(), list_names.end(), name) != list_names.end();
  if (obj.is_dict()) return std::find(dict_names.begin(), dict_names.end(), name) != dict_names.end();
  return false;
}

// getattr(obj, name) as Python answers it, with the sandbox's refusals; nullopt for AttributeError.
std::optional<Value> python_attribute(const Value& obj, const std::string& name) {
  if (is_dunder(name) || is_mutating(obj, name)) return unsafe_attribute(obj, name);
  switch (obj.kind()) {
    case Kind::string: {
      auto& methods = string_methods();
      if (auto it = methods.find(name); it != methods.end()) {
        Method m = it->second;
        return make_function(name, [obj, m](CallArgs& a) { return m(obj, a); });
      }
      if (is_python_str_attribute(name))
        return make_function(name, [name](CallArgs&) -> Value {
          raise(ErrorKind::type, "str.{}() is not supported by qinfer's template engine", name);
        });
      return std::nullopt;
    }
    case Kind::list: {
      if (!obj.is_sequence_list()) return std::nullopt;
      Value m = list_method(obj, name);
      return m.is_undefined() ? std::nullopt : std::optional(m);
    }
    case Kind::dict: {
      Value m = dict_method(obj, name);
      return m.is_undefined() ? std::nullopt : std::optional(m);
    }
    case Kind::namespace_: {
      const Value* v = obj.as_dict().find(name);
      return v ? std::optional(*v) : std::nullopt;
    }
    case Kind::object: {
      Value v = obj.as_object().attribute(name);
      return v.is_undefined() ? std::nullopt : std::optional(v);
    }
    case Kind::macro:
      if (name == "name") return Value(obj.as_macro().name);
      return std::nullopt;
    default: return std::nullopt;
  }
}

// ---------------------------------------------------------------------------------------------
// Tests.

using Test = bool (*)(const Value& v, CallArgs& args);

Value one_arg(const char* name, CallArgs& args) {
  Params p(name, args, {"other"}, 1);
  return p[0];
}

bool compare_test(const Value& v, CallArgs& args, std::string_view op) {
  const Value other = one_arg("test", args);
  if (op == "==") return py_equal(v, other);
  if (op == "!=") return !py_equal(v, other);
  const int c = py_compare(v, other, op);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

// Python's `value % m == expected`, which is how Jinja defines odd, even and divisibleby.
bool mod_equals(const Value& v, const Value& m, int64_t expected) {
  return py_equal(binary_op(BinaryOp::mod, v, m), Value(expected));
}

const std::unordered_map<std::string_view, Test>& tests() {
  static const std::unordered_map<std::string_view, Test> table = {
      {"defined", [](const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"none", [](const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](const Value& v, CallArgs&) { return v.kind() == Kind::boolean; }},
      {"false", [](const Value& v, CallArgs&) { return v.kind() == Kind::boolean && !v.as_bool(); }},
      {"true", [](const Value& v, CallArgs&) { return v.kind() == Kind::boolean && v.as_bool(); }},
      {"integer", [](const Value& v, CallArgs&) { return v.kind() == Kind::integer; }},
      {"float", [](const Value& v, CallArgs&) { return v.kind() == Kind::floating; }},
      {"number", [](const Value& v, CallArgs&) { return v.is_number(); }},
      {"string", [](const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](const Value& v, CallArgs&) { return v.is_dict(); }},
      // Python: iter() works (Undefined iterates as empty); sequence: has len() and __getitem__.
      {"iterable",
       [](const Value& v, CallArgs&) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); }},
      {"sequence",
       [](const Value& v, CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_sequence_list() || v.is_dict();
       }},
      // Undefined defines __call__ (to raise), so Python's callable() says yes.
      {"callable", [](const Value& v, CallArgs&) { return v.is_callable() || v.is_undefined(); }},
      {"sameas",
       [](const Value& v, CallArgs& a) {
         const Value other = one_arg("sameas", a);
         if (v.kind() != other.kind()) return false;
         switch (v.kind()) {
           case Kind::none:
           case Kind::undefined: return true;
           case Kind::boolean: return v.as_bool() == other.as_bool();
           // CPython caches small ints only; others are distinct objects.
           case Kind::integer: return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
           default: return v.identity() == other.identity();
         }
       }},
      {"odd", [](const Value& v, CallArgs&) { return mod_equals(v, Value(2), 1); }},
      {"even", [](const Value& v, CallArgs&) { return mod_equals(v, Value(2), 0); }},
      {"divisibleby", [](const Value& v, CallArgs& a) { return mod_equals(v, one_arg("divisibleby", a), 0); }},
      {"eq", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"equalto", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"==", [](const Value& v, CallArgs& a) { return compare_test(v, a, "=="); }},
      {"ne", [](const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"!=", [](const Value& v, CallArgs& a) { return compare_test(v, a, "!="); }},
      {"lt", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"lessthan", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"<", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<"); }},
      {"le", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"<=", [](const Value& v, CallArgs& a) { return compare_test(v, a, "<="); }},
      {"gt", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"greaterthan", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {">", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">"); }},
      {"ge", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {">=", [](const Value& v, CallArgs& a) { return compare_test(v, a, ">="); }},
      {"in", [](const Value& v, CallArgs& a) { return contains(one_arg("in", a), v); }},
      {"lower", [](const Value& v, CallArgs&) { return py::is_lower(to_str(v)); }},
      {"upper", [](const Value& v, CallArgs&) { return py::is_upper(to_str(v)); }},
      {"escaped", [](const Value& v, CallArgs&) { return v.is_markup(); }},
      {"filter",
       [](const Value& v, CallArgs&) { return v.is_string() && filter_exists(v.as_string()); }},
      {"test", [](const Value& v, CallArgs&) { return v.is_string() && test_exists(v.as_string()); }},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// Globals.

Dict dict_from_args(const char* fn, CallArgs& args) {
  if (args.positional.size() > 1) raise(ErrorKind::type, "{} expected at most 1 argument, got {}", fn, args.positional.size());
  Dict d;
  if (!args.positional.empty()) {
    const Value& init = args.positional[0];
    if (init.is_dict()) {
      d = init.as_dict();
    } else {
      for (const Value& pair : iterate(init)) {
        const ValueList kv = iterate(pair);
        if (kv.size() != 2) raise(ErrorKind::value, "dictionary update sequence element has length {}; 2 is required", kv.size());
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (auto& [k, v] : args.keyword) d.set(Value(k), v);
  return d;
}

const Dict& globals() {
  static const Dict table = [] {
    Dict g;
    g.set("range", make_function("range", [](CallArgs& a) {
            if (!a.keyword.empty()) raise(ErrorKind::type, "range() takes no keyword arguments");
            const size_t n = a.positional.size();
            if (n < 1 || n > 3) raise(ErrorKind::type, "range expected 1 to 3 arguments, got {}", n);
            for (const Value& v : a.positional)
              if (!v.is_int_like())
                raise(ErrorKind::type, "'{}' object cannot be interpreted as an integer", type_name(v));
            const int64_t start = n == 1 ? 0 : a.positional[0].as_int();
            const int64_t stop = n == 1 ? a.positional[0].as_int() : a.positional[1].as_int();
            const int64_t step = n == 3 ? a.positional[2].as_int() : 1;
            if (step == 0) raise(ErrorKind::value, "range() arg 3 must not be zero");
            ValueList out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
              if (static_cast<int64_t>(out.size()) >= kMaxRange)
                raise(ErrorKind::limit,
                      "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
              out.emplace_back(i);
            }
            return Value(std::move(out));
          }));
    g.set("namespace", make_function("namespace", [](CallArgs& a) {
            return Value::namespace_of(dict_from_args("namespace", a));
          }));
    g.set("dict", make_function("dict", [](CallArgs& a) { return Value(dict_from_args("dict", a)); }));
    return g;
  }();
  return table;
}

}  // namespace

[[noreturn]] void fail_undefined(const Value& v) {
  std::string message = v.undefined_message();
  if (message.empty()) message = "value is undefined";
  throw Error(v.is_unsafe() ? ErrorKind::security : ErrorKind::undefined, message);
}

std::string object_type_repr(const Value& v) {
  switch (v.kind()) {
    case Kind::none: return "None";
    case Kind::string: return v.is_markup() ? "markupsafe.Markup object" : "str object";
    case Kind::namespace_: return "jinja2.utils.Namespace object";
    case Kind::macro: return "jinja2.runtime.Macro object";
    case Kind::object: return "jinja2.runtime." + v.as_object().type_name() + " object";
    default: return type_name(v) + " object";
  }
}

Value binary_op(BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  // str % x formats; Python accepts Undefined there (it has __getitem__, so it counts as a mapping).
  if (op == BinaryOp::mod && a.is_string()) {
    if (a.is_markup()) return Value::markup(percent_format(a.as_string(), b));
    return percent_format(a.as_string(), b);
  }
  if (b.is_undefined()) fail_undefined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.kind() == Kind::floating || b.kind() == Kind::floating);
  switch (op) {
    case BinaryOp::add:
      if (floats) return a.as_float() + b.as_float();
      if (numbers) return add_int(a.as_int(), b.as_int());
      if (a.is_string() && b.is_string()) {
        ensure_bytes(a.as_string().size() + b.as_string().size());
        // Markup + str escapes the plain side, as markupsafe does.
        if (a.is_markup() || b.is_markup()) {
          const std::string left = a.is_markup() ? a.as_string() : py::html_escape(a.as_string());
          const std::string right = b.is_markup() ? b.as_string() : py::html_escape(b.as_string());
          return Value::markup(left + right);
        }
        return a.as_string() + b.as_string();
      }
      if (a.is_sequence_list() && b.is_sequence_list() && a.is_tuple() == b.is_tuple()) {
        ensure_bytes((a.as_list().size() + b.as_list().size()) * sizeof(Value));
        ValueList out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return a.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
      }
      if (a.is_string() || a.is_sequence_list())
        raise(ErrorKind::type, "can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a));
      unsupported_operands("+", a, b);
    case BinaryOp::sub:
      if (floats) return a.as_float() - b.as_float();
      if (numbers) return sub_int(a.as_int(), b.as_int());
      unsupported_operands("-", a, b);
    case BinaryOp::mul:
      if (floats) return a.as_float() * b.as_float();
      if (numbers) return mul_int(a.as_int(), b.as_int());
      if ((a.is_string() || a.is_sequence_list()) && b.is_int_like()) return repeat(a, b.as_int());
      if ((b.is_string() || b.is_sequence_list()) && a.is_int_like()) return repeat(b, a.as_int());
      if (a.is_markup() || b.is_markup())  // markupsafe's __mul__ converts the count itself
        raise(ErrorKind::type, "'{}' object cannot be interpreted as an integer", type_name(a.is_markup() ? b : a));
      if (a.is_string() || a.is_sequence_list() || b.is_string() || b.is_sequence_list())
        raise(ErrorKind::type, "can't multiply sequence by non-int of type '{}'",
              type_name(a.is_string() || a.is_sequence_list() ? b : a));
      unsupported_operands("*", a, b);
    case BinaryOp::div:
      if (!numbers) unsupported_operands("/", a, b);
      if (b.as_float() == 0) raise(ErrorKind::value, "{}", floats ? "float division by zero" : "division by zero");
      return a.as_float() / b.as_float();
    case BinaryOp::floordiv:
      if (!numbers) unsupported_operands("//", a, b);
      if (floats) {
        if (b.as_float() == 0) raise(ErrorKind::value, "float floor division by zero");
        return std::floor(a.as_float() / b.as_float());
      }
      if (b.as_int() == 0) raise(ErrorKind::value, "integer division or modulo by zero");
      return floor_div(a.as_int(), b.as_int());
    case BinaryOp::mod:
      if (!numbers) unsupported_operands("%", a, b);
      if (floats) {
        if (b.as_float() == 0) raise(ErrorKind::value, "float modulo");
        return float_mod(a.as_float(), b.as_float());
      }
      if (b.as_int() == 0) raise(ErrorKind::value, "integer modulo by zero");
      return a.as_int() - floor_div(a.as_int(), b.as_int()) * b.as_int();
    case BinaryOp::pow:
      if (!numbers) unsupported_operands("** or pow()", a, b);
      if (floats || b.as_int() < 0) {
        if (a.as_float() == 0 && b.as_float() < 0)
          raise(ErrorKind::value, "0.0 cannot be raised to a negative power");
        const double r = std::pow(a.as_float(), b.as_float());
        if (std::isinf(r) && std::isfinite(a.as_float()) && std::isfinite(b.as_float()))
          raise(ErrorKind::limit, "(34, 'Numerical result out of range')");
        return r;
      }
      {
        int64_t result = 1, base = a.as_int();
        for (int64_t e = b.as_int(); e > 0; e >>= 1) {
          if (e & 1) result = mul_int(result, base);
          if (e > 1) base = mul_int(base, base);
        }
        return result;
      }
  }
  return {};
}

Value negate(const Value& v, bool minus) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind() == Kind::floating) return minus ? -v.as_float() : v.as_float();
  if (v.is_int_like()) {
    if (minus && v.as_int() == INT64_MIN) raise(ErrorKind::limit, "integer overflow");
    return minus ? -v.as_int() : v.as_int();
  }
  raise(ErrorKind::type, "bad operand type for unary {}: '{}'", minus ? '-' : '+', type_name(v));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::undefined: return false;  // Undefined iterates as empty
    case Kind::string:
      if (!item.is_string())
        raise(ErrorKind::type, "'in <string>' requires string as left operand, not {}", type_name(item));
      count_scan(container.as_string().size());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::list: {
      const ValueList items = iterate(container);
      return std::any_of(items.begin(), items.end(), [&](const Value& v) { return py_equal(v, item); });
    }
    case Kind::dict:
      if (is_unhashable(item)) raise(ErrorKind::type, "unhashable type: '{}'", type_name(item));
      return container.as_dict().find(item) != nullptr;
    default: raise(ErrorKind::type, "argument of type '{}' is not iterable", type_name(container));
  }
}

// A step per item: builtins that walk lists (in, join, sort, map) count their work this way.
ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::undefined: return {};
    case Kind::list:
      if (v.flavor() == ListFlavor::failed_iterator)
        throw Error(static_cast<ErrorKind>(v.as_list()[1].as_int()), v.as_list()[0].as_string());
      count_steps(v.as_list().size());
      return v.as_list();
    case Kind::dict: {
      count_steps(v.as_dict().size());
      ValueList keys;
      for (const auto& [k, value] : v.as_dict().entries()) keys.push_back(k);
      return keys;
    }
    case Kind::string: {
      ValueList chars;
      for (char32_t c : py::decode(v.as_string())) chars.emplace_back(py::encode(std::u32string(1, c)));
      return chars;
    }
    default: raise(ErrorKind::type, "'{}' object is not iterable", type_name(v));
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (auto attr = python_attribute(obj, name)) return *attr;
  if (obj.is_dict())
    if (const Value* v = obj.as_dict().find(name)) return *v;
  return no_attribute(obj, name);
}

Value get_python_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (auto attr = python_attribute(obj, name)) return *attr;
  return no_attribute(obj, name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (key.is_int_like() && (obj.is_sequence_list() || obj.is_string())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list()[i];
    } else {
      std::u32string text = py::decode(obj.as_string());
      const auto n = static_cast<int64_t>(text.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return py::encode(std::u32string(1, text[i]));
    }
  } else if (obj.is_dict() && !is_unhashable(key)) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
  }
  if (key.is_string()) {
    if (auto attr = python_attribute(obj, key.as_string())) return *attr;
    return no_attribute(obj, key.as_string());
  }
  return no_element(obj, key);
}

Value call_function(const Value& callee, CallArgs& args) {
  if (callee.kind() == Kind::function) return callee.as_function().call(args);
  if (callee.is_undefined()) fail_undefined(callee);
  raise(ErrorKind::type, "'{}' object is not callable", type_name(callee));
}

bool test_exists(std::string_view name) { return tests().contains(name); }

bool apply_test(std::string_view name, const Value& v, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) raise(ErrorKind::syntax, "No test named '{}'.", name);
  return it->second(v, args);
}

const Value* find_global(const std::string& name) { return globals().find(name); }

std::string percent_format(const std::string& format, const Value& args) {
  // Python skips the "not all arguments converted" check for anything with __getitem__ (a list too).
  const bool mapping = args.is_dict() || args.is_undefined() || (args.is_list() && args.flavor() == ListFlavor::list);
  const ValueList positional = args.is_tuple() ? args.as_list() : ValueList{args};
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  count_scan(format.size());
  auto take = [&]() -> const Value& {
    if (next >= positional.size()) raise(ErrorKind::type, "not enough arguments for format string");
    return positional[next++];
  };
  // Widths and precisions saturate: the memory budget refuses what they would build.
  auto count_of = [](const std::string& digits) -> int64_t {
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    (void)end;
    if (ec == std::errc::result_out_of_range) return digits[0] == '-' ? INT64_MIN : INT64_MAX;
    return n;
  };
  auto to_integer = [](const Value& v, char conv) -> int64_t {
    if (v.is_int_like()) return v.as_int();
    if (v.kind() == Kind::floating && (conv == 'd' || conv == 'i' || conv == 'u')) return static_cast<int64_t>(v.as_float());
    raise(ErrorKind::type, "%{} format: {} is required, not {}", conv,
          conv == 'd' || conv == 'i' || conv == 'u' ? "a real number" : "an integer", type_name(v));
  };
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) raise(ErrorKind::value, "incomplete format");
    const Value* arg = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) raise(ErrorKind::value, "incomplete format key");
      if (!args.is_dict()) raise(ErrorKind::type, "format requires a mapping");
      const Value* found = args.as_dict().find(format.substr(i + 1, close - i - 1));
      if (!found) raise(ErrorKind::type, "KeyError: '{}'", format.substr(i + 1, close - i - 1));
      arg = found;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags, width, precision;
    while (i < format.size() && std::string_view("-+ #0").find(format[i]) != std::string_view::npos) flags += format[i++];
    auto number_or_star = [&](std::string& into) {
      if (i < format.size() && format[i] == '*') {
        into = std::to_string(to_integer(take(), 'd'));
        ++i;
      }
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) into += format[i++];
    };
    number_or_star(width);
    if (i < format.size() && format[i] == '.') {
      ++i;
      number_or_star(precision);
      if (precision.empty()) precision = "0";
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) raise(ErrorKind::value, "incomplete format");
    const char conv = format[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    const Value& v = arg ? *arg : take();
    std::string spec = "%" + flags + width + (precision.empty() ? "" : "." + precision);
    char buf[512];
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        std::string s = conv == 's' ? to_str(v) : to_repr(v);
        if (!precision.empty()) {
          std::u32string t = py::decode(s);
          s = py::encode(t.substr(0, static_cast<size_t>(std::max<int64_t>(count_of(precision), 0))));
        }
        const int64_t pad = (width.empty() ? 0 : count_of(width)) - static_cast<int64_t>(py::length(s));
        ensure_bytes(out.size() + s.size() + static_cast<uint64_t>(std::max<int64_t>(pad, 0)));
        if (pad > 0) s = flags.find('-') != std::string::npos ? s + std::string(pad, ' ') : std::string(pad, ' ') + s;
        out += s;
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o':
        std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' || conv == 'u' ? 'd' : conv)).c_str(),
                      static_cast<long long>(to_integer(v, conv)));
        out += buf;
        break;
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G':
        if (!v.is_number()) raise(ErrorKind::type, "must be real number, not {}", type_name(v));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_float());
        out += buf;
        break;
      case 'c':
        if (v.is_string() && py::length(v.as_string()) == 1) out += v.as_string();
        else out += py::encode(std::u32string(1, static_cast<char32_t>(to_integer(v, 'c'))));
        break;
      default: raise(ErrorKind::value, "unsupported format character '{}'", conv);
    }
  }
  if (!used_mapping && !mapping && next < positional.size())
    raise(ErrorKind::type, "not all arguments converted during string formatting");
  return out;
}

}  // namespace qinfer::jinja
