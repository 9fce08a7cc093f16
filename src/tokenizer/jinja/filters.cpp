// Jinja2's built-in filters (jinja2/filters.py) with transformers' tojson, over our values.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/params.h"
#include "tokenizer/jinja/pystr.h"

namespace qinfer::jinja {
namespace {

using Filter = Value (*)(const Value& input, CallArgs& args);

// What |string and friends see: Markup stays Markup, everything else goes through str().
Value soft_str(const Value& v) { return v.is_string() ? v : Value(to_str(v)); }

// Jinja's generator filters: the work happens when the result is consumed, so an error becomes
// a generator that raises then. `guard`: map/select/reject yield nothing for a falsy input.
template <typename Produce>
Value lazily(const Value& input, bool guard, Produce produce) {
  if (guard && !input.truthy()) return Value::iterator({});
  try {
    return Value::iterator(produce());
  } catch (const Error& e) {
    return Value::failed_iterator(static_cast<int>(e.kind()), e.message());
  }
}

Value length_of(const Value& v) {
  if (v.is_undefined()) return Value(0);
  if (v.is_string()) return Value(static_cast<int64_t>(py::length(v.as_string())));
  if (v.is_list() && !v.is_iterator()) return Value(static_cast<int64_t>(v.as_list().size()));
  if (v.is_dict()) return Value(static_cast<int64_t>(v.as_dict().size()));
  raise(ErrorKind::type, "object of type '{}' has no len()", type_name(v));
}

// `attribute` arguments: "a.b.0" walks items (then attributes), as make_attrgetter does.
Value get_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value current = item;
  for (const auto& part : py::split(attribute.as_string(), std::string("."), -1, false)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    current = get_item(current, digits ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
  }
  return current;
}

Value lower_if_string(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return v.is_markup() ? Value::markup(py::lower(v.as_string())) : Value(py::lower(v.as_string()));
}

// Python float(): accepts surrounding whitespace, underscores between digits, inf/nan spellings.
std::optional<double> parse_float(std::string text) {
  text = py::strip(text, std::nullopt, true, true);
  std::string clean;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '_') {
      if (i == 0 || i + 1 == text.size() || !std::isdigit(static_cast<unsigned char>(text[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(text[i + 1])))
        return std::nullopt;
      continue;
    }
    clean += text[i];
  }
  std::string lower = py::lower(clean);
  std::string body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.erase(0, 1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -v : v;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != std::string::npos) return std::nullopt;
  if (body.find_first_of("0123456789") == std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return v;
}

// Python int(text, base).
std::optional<int64_t> parse_int(std::string text, int64_t base) {
  text = py::strip(text, std::nullopt, true, true);
  bool negative = false;
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) {
    negative = text[0] == '-';
    text.erase(0, 1);
  }
  std::string lower = py::lower(text);
  auto has_prefix = [&](char p) { return lower.size() > 2 && lower[0] == '0' && lower[1] == p; };
  if (base == 0) {
    base = has_prefix('x') ? 16 : has_prefix('o') ? 8 : has_prefix('b') ? 2 : 10;
    if (base == 10 && lower.size() > 1 && lower[0] == '0' && lower.find_first_not_of("0_") != std::string::npos)
      return std::nullopt;
  }
  if ((base == 16 && has_prefix('x')) || (base == 8 && has_prefix('o')) || (base == 2 && has_prefix('b')))
    lower = lower.substr(2);
  if (base < 2 || base > 36 || lower.empty()) return std::nullopt;
  int64_t value = 0;
  for (size_t i = 0; i < lower.size(); ++i) {
    const char c = lower[i];
    if (c == '_' && i > 0 && i + 1 < lower.size() && lower[i + 1] != '_') continue;
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    if (digit >= base) return std::nullopt;
    if (__builtin_mul_overflow(value, base, &value) || __builtin_add_overflow(value, digit, &value))
      raise(ErrorKind::limit, "integer overflow");
  }
  return negative ? -value : value;
}

Value sorted_values(ValueList items, bool reverse, bool case_sensitive, const Value* attribute) {
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    Value key = attribute ? get_path(item, *attribute) : item;
    keyed.emplace_back(lower_if_string(key, case_sensitive), std::move(item));
  }
  count_steps(keyed.size() * std::bit_width(keyed.size()));  // the comparisons
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? py_compare(b.first, a.first, "<") < 0 : py_compare(a.first, b.first, "<") < 0;
  });
  ValueList out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return out;
}

Value min_max(const Value& input, CallArgs& args, bool max) {
  Params p(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = p.has(0) && p[0].truthy();
  const ValueList items = iterate(input);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  auto key = [&](size_t i) {
    return lower_if_string(p.given(1) ? get_path(items[i], p[1]) : items[i], case_sensitive);
  };
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = py_compare(key(i), key(best), max ? ">" : "<");
    if (max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

ValueList map_items(const Value& v, CallArgs& a) {
  ValueList out;
  if (a.positional.empty()) {
    Value attribute, fallback;
    bool have_attribute = false, have_default = false;
    for (auto& [k, val] : a.keyword) {
      if (k == "attribute") attribute = val, have_attribute = true;
      else if (k == "default") fallback = val, have_default = true;
      else raise(ErrorKind::type, "Unexpected keyword argument '{}'", k);
    }
    if (!have_attribute) raise(ErrorKind::type, "map requires a filter argument");
    for (const Value& item : iterate(v)) {
      Value r = get_path(item, attribute);
      out.push_back(have_default && r.is_undefined() ? fallback : r);
    }
    return out;
  }
  if (!a.positional[0].is_string()) raise(ErrorKind::type, "map: the filter name must be a string");
  const std::string name = a.positional[0].as_string();
  if (!filter_exists(name)) raise(ErrorKind::syntax, "No filter named '{}'.", name);
  for (const Value& item : iterate(v)) {
    CallArgs call{ValueList(a.positional.begin() + 1, a.positional.end()), a.keyword};
    out.push_back(apply_filter(name, item, call));
  }
  return out;
}

ValueList select_items(const Value& input, CallArgs& args, bool select, bool with_attribute, const char* name);

// select/reject/selectattr/rejectattr: `attr` picks the value tested; no test name means truthiness.
Value select_impl(const Value& input, CallArgs& args, bool select, bool with_attribute, const char* name) {
  return lazily(input, true, [&] { return select_items(input, args, select, with_attribute, name); });
}

ValueList select_items(const Value& input, CallArgs& args, bool select, bool with_attribute, const char* name) {
  CallArgs rest;
  rest.keyword = args.keyword;
  size_t i = 0;
  Value attribute;
  if (with_attribute) {
    if (args.positional.empty()) raise(ErrorKind::type, "{}() missing required argument 'attribute'", name);
    attribute = args.positional[i++];
  }
  std::string test;
  if (i < args.positional.size()) {
    if (!args.positional[i].is_string()) raise(ErrorKind::type, "{}(): the test name must be a string", name);
    test = args.positional[i++].as_string();
    if (!test_exists(test)) raise(ErrorKind::syntax, "No test named '{}'.", test);
  }
  rest.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(i), args.positional.end());
  ValueList out;
  for (const Value& item : iterate(input)) {
    const Value subject = with_attribute ? get_path(item, attribute) : item;
    CallArgs call = rest;
    const bool passed = test.empty() ? subject.truthy() : apply_test(test, subject, call);
    if (passed == select) out.push_back(item);
  }
  return out;
}

const std::unordered_map<std::string_view, Filter>& filters() {
  static const std::unordered_map<std::string_view, Filter> table = {
      {"abs",
       [](const Value& v, CallArgs& a) {
         Params("abs", a, {});
         if (v.kind() == Kind::floating) return Value(std::fabs(v.as_float()));
         if (v.is_int_like()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
         raise(ErrorKind::type, "bad operand type for abs(): '{}'", type_name(v));
       }},
      {"attr",
       [](const Value& v, CallArgs& a) {
         Params p("attr", a, {"name"}, 1);
         return get_python_attr(v, to_str(p[0]));  // attributes only: never dict items
       }},
      {"capitalize",
       [](const Value& v, CallArgs& a) {
         Params("capitalize", a, {});
         return Value(py::capitalize(to_str(v)));
       }},
      {"center",
       [](const Value& v, CallArgs& a) {
         Params p("center", a, {"width"});
         const std::string s = to_str(v);
         const int64_t width = p.integer(0, 80), len = static_cast<int64_t>(py::length(s));
         if (width <= len) return Value(s);
         const int64_t pad = width - len, left = pad / 2 + (pad & width & 1);
         ensure_bytes(s.size() + static_cast<uint64_t>(pad));
         return Value(std::string(left, ' ') + s + std::string(pad - left, ' '));
       }},
      {"count",
       [](const Value& v, CallArgs& a) {
         Params("count", a, {});
         if (v.is_undefined()) return Value(0);
         return length_of(v);
       }},
      {"default",
       [](const Value& v, CallArgs& a) {
         Params p("default", a, {"default_value", "boolean"});
         const bool boolean = p.has(1) && p[1].truthy();
         if (v.is_undefined() || (boolean && !v.truthy())) return p.get_or(0, "");
         return v;
       }},
      {"dictsort",
       [](const Value& v, CallArgs& a) {
         Params p("dictsort", a, {"case_sensitive", "by", "reverse"});
         const bool case_sensitive = p.has(0) && p[0].truthy();
         const std::string by = p.has(1) ? p.string(1) : "key";
         if (by != "key" && by != "value")
           raise(ErrorKind::value, "You can only sort by either \"key\" or \"value\"");
         if (v.is_undefined()) fail_undefined(v);
         if (!v.is_dict()) raise(ErrorKind::type, "'{}' object has no attribute 'items'", type_name(v));
         ValueList items;
         for (const auto& [k, val] : v.as_dict().entries()) items.push_back(Value::tuple({k, val}));
         const Value index(by == "key" ? 0 : 1);
         return sorted_values(std::move(items), p.has(2) && p[2].truthy(), case_sensitive, &index);
       }},
      {"escape",
       [](const Value& v, CallArgs& a) {
         Params("escape", a, {});
         return v.is_markup() ? v : Value::markup(py::html_escape(to_str(v)));
       }},
      {"forceescape",
       [](const Value& v, CallArgs& a) {
         Params("forceescape", a, {});
         return Value::markup(py::html_escape(to_str(v)));
       }},
      {"first",
       [](const Value& v, CallArgs& a) {
         Params("first", a, {});
         const ValueList items = iterate(v);
         return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
       }},
      {"last",
       [](const Value& v, CallArgs& a) {
         Params("last", a, {});
         if (!v.is_undefined() && !v.is_string() && !v.is_sequence_list() && !v.is_view() && !v.is_dict())
           raise(ErrorKind::type, "'{}' object is not reversible", type_name(v));
         const ValueList items = iterate(v);
         return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
       }},
      {"float",
       [](const Value& v, CallArgs& a) {
         Params p("float", a, {"default"});
         const Value fallback = p.get_or(0, 0.0);
         if (v.is_undefined()) fail_undefined(v);
         if (v.is_number()) return Value(v.as_float());
         if (v.is_string()) {
           if (auto f = parse_float(v.as_string())) return Value(*f);
         }
         return fallback;
       }},
      {"format",
       [](const Value& v, CallArgs& a) {
         if (!a.positional.empty() && !a.keyword.empty())
           raise(ErrorKind::type, "can't handle positional and keyword arguments at the same time");
         Value args;
         if (!a.keyword.empty()) {
           Dict d;
           for (auto& [k, val] : a.keyword) d.set(Value(k), val);
           args = Value(std::move(d));
         } else {
           args = Value::tuple(a.positional);
         }
         return Value(percent_format(to_str(v), args));
       }},
      {"indent",
       [](const Value& v, CallArgs& a) {
         Params p("indent", a, {"width", "first", "blank"});
         const int64_t width = p.has(0) && p[0].is_string() ? 0 : std::max<int64_t>(p.integer(0, 4), 0);
         ensure_bytes(static_cast<uint64_t>(width));
         std::string indention = p.has(0) && p[0].is_string() ? p[0].as_string() : std::string(width, ' ');
         const std::string s = to_str(v) + "\n";
         const auto lines = py::splitlines(s, false);
         ensure_bytes(s.size() + lines.size() * (indention.size() + 1));
         std::string out;
         if (p.has(2) && p[2].truthy()) {
           for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indention : "") + lines[i];
         } else {
           out = lines.empty() ? "" : lines[0];
           for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
         }
         if (p.has(1) && p[1].truthy()) out = indention + out;
         return Value(std::move(out));
       }},
      {"int",
       [](const Value& v, CallArgs& a) {
         Params p("int", a, {"default", "base"});
         const Value fallback = p.get_or(0, 0);
         if (v.is_undefined()) fail_undefined(v);
         if (v.kind() == Kind::floating) {
           if (!std::isfinite(v.as_float())) raise(ErrorKind::value, "cannot convert float {} to integer", to_str(v));
           return Value(static_cast<int64_t>(v.as_float()));
         }
         if (v.is_int_like()) return Value(v.as_int());
         if (v.is_string()) {
           if (auto i = parse_int(v.as_string(), p.integer(1, 10))) return Value(*i);
           if (auto f = parse_float(v.as_string()); f && std::isfinite(*f)) return Value(static_cast<int64_t>(*f));
         }
         return fallback;
       }},
      {"items",
       [](const Value& v, CallArgs& a) {
         Params("items", a, {});
         return lazily(v, false, [&] {
           ValueList out;
           if (v.is_undefined()) return out;
           if (!v.is_dict()) raise(ErrorKind::type, "Can only get item pairs from a mapping.");
           for (const auto& [k, val] : v.as_dict().entries()) out.push_back(Value::tuple({k, val}));
           return out;
         });
       }},
      {"join",
       [](const Value& v, CallArgs& a) {
         Params p("join", a, {"d", "attribute"});
         const std::string sep = p.has(0) ? to_str(p[0]) : "";
         std::string out;
         bool first = true;
         for (const Value& item : iterate(v)) {
           const Value part = p.given(1) ? get_path(item, p[1]) : item;
           const std::string text = part.is_string() ? std::string() : to_str(part);
           const std::string& piece = part.is_string() ? part.as_string() : text;
           ensure_bytes(out.size() + sep.size() + piece.size());
           if (!first) out += sep;
           first = false;
           out += piece;
         }
         return Value(std::move(out));
       }},
      {"length",
       [](const Value& v, CallArgs& a) {
         Params("length", a, {});
         if (v.is_undefined()) return Value(0);
         return length_of(v);
       }},
      {"list",
       [](const Value& v, CallArgs& a) {
         Params("list", a, {});
         return Value(iterate(v));
       }},
      {"lower",
       [](const Value& v, CallArgs& a) {
         Params("lower", a, {});
         return Value(py::lower(to_str(v)));
       }},
      {"map",
       [](const Value& v, CallArgs& a) { return lazily(v, true, [&] { return map_items(v, a); }); }},
      {"max", [](const Value& v, CallArgs& a) { return min_max(v, a, true); }},
      {"min", [](const Value& v, CallArgs& a) { return min_max(v, a, false); }},
      {"reject", [](const Value& v, CallArgs& a) { return select_impl(v, a, false, false, "reject"); }},
      {"rejectattr", [](const Value& v, CallArgs& a) { return select_impl(v, a, false, true, "rejectattr"); }},
      {"replace",
       [](const Value& v, CallArgs& a) {
         Params p("replace", a, {"old", "new", "count"}, 2);
         return Value(py::replace(to_str(v), to_str(p[0]), to_str(p[1]), p.integer(2, -1)));
       }},
      {"reverse",
       [](const Value& v, CallArgs& a) {
         Params("reverse", a, {});
         if (v.is_string()) {
           std::u32string t = py::decode(v.as_string());
           std::reverse(t.begin(), t.end());
           return Value(py::encode(t));
         }
         // reversed() where Python has it (an iterator), else a reversed list.
         if (!v.is_undefined() && !v.is_list() && !v.is_dict()) raise(ErrorKind::type, "argument must be iterable");
         ValueList items = iterate(v);
         std::reverse(items.begin(), items.end());
         if (v.is_sequence_list()) return Value::iterator(std::move(items), v.is_tuple() ? "reversed" : "list_reverseiterator");
         if (v.is_dict()) return Value::iterator(std::move(items), "dict_reversekeyiterator");
         if (v.is_undefined()) return Value::iterator(std::move(items), "reversed");
         return Value(std::move(items));
       }},
      {"round",
       [](const Value& v, CallArgs& a) {
         Params p("round", a, {"precision", "method"});
         const int64_t precision = p.integer(0, 0);
         const std::string method = p.has(1) ? p.string(1) : "common";
         if (!v.is_number()) raise(ErrorKind::type, "type {} doesn't define __round__ method", type_name(v));
         const double x = v.as_float();
         if (method == "common") {
           if (v.is_int_like() && precision >= 0) return Value(v.as_int());  // round(int) stays an int
           // Python's round() is correctly rounded (ties to even on the exact binary value), as printf is.
           if (precision < 0) {
             const double scale = std::pow(10.0, static_cast<double>(-precision));
             return Value(std::nearbyint(x / scale) * scale);
           }
           return Value(std::strtod(fmt::format("{:.{}f}", x, precision).c_str(), nullptr));
         }
         if (method != "ceil" && method != "floor")
           raise(ErrorKind::value, "method must be common, ceil or floor");
         const double scale = std::pow(10.0, static_cast<double>(precision));
         return Value((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
       }},
      {"safe",
       [](const Value& v, CallArgs& a) {
         Params("safe", a, {});
         return Value::markup(to_str(v));
       }},
      {"select", [](const Value& v, CallArgs& a) { return select_impl(v, a, true, false, "select"); }},
      {"selectattr", [](const Value& v, CallArgs& a) { return select_impl(v, a, true, true, "selectattr"); }},
      {"sort",
       [](const Value& v, CallArgs& a) {
         Params p("sort", a, {"reverse", "case_sensitive", "attribute"});
         return sorted_values(iterate(v), p.has(0) && p[0].truthy(), p.has(1) && p[1].truthy(),
                              p.given(2) ? &p[2] : nullptr);
       }},
      {"string",
       [](const Value& v, CallArgs& a) {
         Params("string", a, {});
         return soft_str(v);
       }},
      {"sum",
       [](const Value& v, CallArgs& a) {
         Params p("sum", a, {"attribute", "start"});
         Value total = p.get_or(1, 0);
         for (const Value& item : iterate(v)) total = binary_op(BinaryOp::add, total, p.given(0) ? get_path(item, p[0]) : item);
         return total;
       }},
      {"title",
       [](const Value& v, CallArgs& a) {
         Params("title", a, {});
         // Jinja's title(): words start after '-', whitespace or an opening bracket, unlike str.title().
         std::u32string text = py::decode(to_str(v));
         std::string out;
         bool word_start = true;
         for (char32_t c : text) {
           const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c);
           const std::string ch = py::encode(std::u32string(1, c));
           if (separator) out += ch;
           else out += word_start ? py::upper(ch) : py::lower(ch);
           word_start = separator;
         }
         return Value(std::move(out));
       }},
      {"tojson",
       [](const Value& v, CallArgs& a) {
         Params p("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
         JsonOptions o;
         o.ensure_ascii = p.has(0) && p[0].truthy();
         if (p.given(1)) {
           if (p[1].is_string()) {
             o.indent = p[1].as_string();
           } else {
             const int64_t width = std::max<int64_t>(p.integer(1, 0), 0);
             ensure_bytes(static_cast<uint64_t>(width));
             o.indent = std::string(static_cast<size_t>(width), ' ');
           }
           o.item_separator = ",";
         }
         if (p.given(2)) {
           const ValueList seps = iterate(p[2]);
           if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
             raise(ErrorKind::value, "tojson separators must be two strings");
           o.item_separator = seps[0].as_string();
           o.key_separator = seps[1].as_string();
         }
         o.sort_keys = p.has(3) && p[3].truthy();
         return Value(to_json(v, o));
       }},
      {"trim",
       [](const Value& v, CallArgs& a) {
         Params p("trim", a, {"chars"});
         std::string s = py::strip(to_str(v), p.optional_string(0), true, true);
         return v.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s));
       }},
      {"unique",
       [](const Value& v, CallArgs& a) {
         Params p("unique", a, {"case_sensitive", "attribute"});
         const bool case_sensitive = p.has(0) && p[0].truthy();
         return lazily(v, false, [&] {
           ValueList out, seen;
           for (const Value& item : iterate(v)) {
             const Value key = lower_if_string(p.given(1) ? get_path(item, p[1]) : item, case_sensitive);
             if (key.is_dict() || (key.is_list() && key.flavor() == ListFlavor::list))
               raise(ErrorKind::type, "unhashable type: '{}'", type_name(key));
             count_steps(seen.size());
             if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) {
               seen.push_back(key);
               out.push_back(item);
             }
           }
           return out;
         });
       }},
      {"upper",
       [](const Value& v, CallArgs& a) {
         Params("upper", a, {});
         return Value(py::upper(to_str(v)));
       }},
      {"wordcount",
       [](const Value& v, CallArgs& a) {
         Params("wordcount", a, {});
         int64_t words = 0;
         bool in_word = false;
         for (char32_t c : py::decode(to_str(v))) {
           const bool word_char = c == '_' || py::is_alnum(py::encode(std::u32string(1, c)));
           words += word_char && !in_word;
           in_word = word_char;
         }
         return Value(words);
       }},
  };
  return table;
}

const std::unordered_map<std::string_view, std::string_view>& aliases() {
  static const std::unordered_map<std::string_view, std::string_view> table = {{"d", "default"}, {"e", "escape"}};
  return table;
}

std::string_view canonical(std::string_view name) {
  auto it = aliases().find(name);
  return it == aliases().end() ? name : it->second;
}

}  // namespace

bool filter_exists(std::string_view name) { return filters().contains(canonical(name)); }

bool is_unsupported_filter(std::string_view name) {
  static const std::array<std::string_view, 12> names = {"batch",     "filesizeformat", "groupby",  "pprint",
                                                         "random",    "slice",          "striptags", "truncate",
                                                         "urlencode", "urlize",         "wordwrap", "xmlattr"};
  return std::find(names.begin(), names.end(), name) != names.end();
}

Value apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  auto it = filters().find(canonical(name));
  if (it == filters().end()) raise(ErrorKind::syntax, "No filter named '{}'.", name);
  return it->second(input, args);
}

}  // namespace qinfer::jinja
