#pragma once
// Internal to the builtins: binds call arguments to a Python-style parameter list, with Python's
// messages for too many, unknown or missing arguments.
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/value.h"

namespace qinfer::jinja {

class Params {
 public:
  Params(std::string_view function, const CallArgs& args, std::initializer_list<std::string_view> names,
         size_t required = 0)
      : function_(function), values_(names.size()) {
    const std::vector<std::string_view> params(names);
    if (args.positional.size() > params.size())
      raise(ErrorKind::type, "{}() takes at most {} argument{} ({} given)", function, params.size(),
            params.size() == 1 ? "" : "s", args.positional.size());
    for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
    for (const auto& [key, value] : args.keyword) {
      size_t i = 0;
      while (i < params.size() && params[i] != key) ++i;
      if (i == params.size()) raise(ErrorKind::type, "{}() got an unexpected keyword argument '{}'", function, key);
      if (values_[i]) raise(ErrorKind::type, "{}() got multiple values for argument '{}'", function, key);
      values_[i] = value;
    }
    for (size_t i = 0; i < required; ++i)
      if (!values_[i]) raise(ErrorKind::type, "{}() missing required argument '{}'", function, params[i]);
  }

  bool has(size_t i) const { return values_[i].has_value(); }
  // A given argument that is None counts as absent, as for Python's `x=None` defaults.
  bool given(size_t i) const { return has(i) && !values_[i]->is_none(); }
  const Value& operator[](size_t i) const { return *values_[i]; }
  Value get_or(size_t i, Value fallback) const { return has(i) ? *values_[i] : std::move(fallback); }

  int64_t integer(size_t i, int64_t fallback) const {
    if (!given(i)) return fallback;
    const Value& v = *values_[i];
    if (!v.is_int_like())
      raise(ErrorKind::type, "{}(): '{}' object cannot be interpreted as an integer", function_, type_name(v));
    return v.as_int();
  }
  std::optional<std::string> optional_string(size_t i) const {
    if (!given(i)) return std::nullopt;
    const Value& v = *values_[i];
    if (!v.is_string()) raise(ErrorKind::type, "must be str or None, not {}", type_name(v));
    count_scan(v.as_string().size());  // the copy
    return v.as_string();
  }
  std::string string(size_t i) const {
    const Value& v = *values_[i];
    if (!v.is_string()) raise(ErrorKind::type, "must be str, not {}", type_name(v));
    count_scan(v.as_string().size());  // the copy
    return v.as_string();
  }

 private:
  std::string_view function_;
  std::vector<std::optional<Value>> values_;
};

}  // namespace qinfer::jinja
