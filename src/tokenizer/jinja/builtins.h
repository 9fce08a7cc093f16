#pragma once
// The built-in behaviour of the language, as Python and Jinja2's ImmutableSandboxedEnvironment
// define it: operators, attribute and item access (with the sandbox's refusals), iteration,
// filters, tests, global functions and the methods of str, list and dict.
#include <string>
#include <string_view>

#include "tokenizer/jinja/value.h"

namespace qinfer::jinja {

enum class BinaryOp { add, sub, mul, div, floordiv, mod, pow };

// Throws the error that using `v` (an undefined) raises.
[[noreturn]] void fail_undefined(const Value& v);

Value binary_op(BinaryOp op, const Value& a, const Value& b);
Value negate(const Value& v, bool minus);  // unary - and +
bool contains(const Value& container, const Value& item);  // `item in container`
ValueList iterate(const Value& v);                          // for-loops, |list: Python's iter()

// `obj.name`: Python attribute first, then item; `obj[key]`: item first, then attribute.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// getattr() alone, without the item fallback (the |attr filter).
Value get_python_attr(const Value& obj, const std::string& name);
// The same lookups as the parser sees them, for error messages: 'dict object', 'None'.
std::string object_type_repr(const Value& v);

// Calls a built-in function or method (macros are the evaluator's).
Value call_function(const Value& callee, CallArgs& args);

bool filter_exists(std::string_view name);
bool test_exists(std::string_view name);
// Names Jinja2 knows but this engine does not implement, for a precise message.
bool is_unsupported_filter(std::string_view name);
Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
bool apply_test(std::string_view name, const Value& v, CallArgs& args);

// range, namespace, dict.
const Value* find_global(const std::string& name);

// Python's `fmt % args`.
std::string percent_format(const std::string& format, const Value& args);

}  // namespace qinfer::jinja
