#pragma once
// Values of the template language: Python's object model cut down to what chat templates touch.
// Lists, dicts and namespaces are shared by reference as in Python; the sandbox forbids mutating
// lists and dicts, so only namespaces ever change after construction.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/jinja/limits.h"

namespace qinfer::jinja {

enum class Kind : uint8_t {
  undefined,  // Jinja's Undefined: falsy, prints '', fails when used further
  none,
  boolean,
  integer,
  floating,
  string,  // may be Markup (|safe)
  list,    // a list, a tuple, or a lazy iterator / dict view holding its items (see ListFlavor)
  dict,
  namespace_,
  macro,
  function,
  object,  // built-in objects with attributes, e.g. `loop`
};

// What a list-kind value is in Python. Jinja filters such as select/map/items return generators
// (always truthy, no len(), not JSON), dict.items() returns a view; templates can tell them apart.
// A failed iterator is a generator whose body raised: the error surfaces only when it is consumed.
enum class ListFlavor : uint8_t { list, tuple, iterator, view, failed_iterator };

class Value;
class Dict;
struct Function;
struct Macro;
struct Object;
using ValueList = std::vector<Value>;

class Value {
 public:
  Value() = default;  // undefined without a hint
  Value(std::nullptr_t) : kind_(Kind::none) {}
  Value(bool b) : kind_(Kind::boolean) { scalar_.b = b; }
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v) : kind_(Kind::integer) { scalar_.i = v; }
  Value(double v) : kind_(Kind::floating) { scalar_.f = v; }
  // New strings, lists and dicts count against the running render's memory budget.
  Value(std::string s) : kind_(Kind::string), ptr_(std::make_shared<std::string>(std::move(s))) {
    charge_bytes(kValueOverhead + as_string().size());
  }
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(ValueList items) : kind_(Kind::list), ptr_(std::make_shared<ValueList>(std::move(items))) {
    charge_bytes(kValueOverhead + as_list().size() * sizeof(Value));
  }
  Value(Dict dict);
  Value(std::shared_ptr<Function> f) : kind_(Kind::function), ptr_(std::move(f)) {}
  Value(std::shared_ptr<Macro> m) : kind_(Kind::macro), ptr_(std::move(m)) {}
  Value(std::shared_ptr<Object> o) : kind_(Kind::object), ptr_(std::move(o)) {}

  // An undefined value; `message` is what using it reports ("'x' is undefined").
  static Value undefined(std::string message);
  // An undefined that stands for something the sandbox refuses (list.append, __class__): using it
  // is a security error rather than an undefined-variable error.
  static Value unsafe(std::string message);
  static Value markup(std::string s);
  static Value tuple(ValueList items);
  // `type` is Python's type name ("generator", "dict_items"); it must be a string literal.
  static Value iterator(ValueList items, const char* type = "generator");
  static Value view(ValueList items, const char* type);
  // A generator that raises `message` (an ErrorKind, as int) when iterated.
  static Value failed_iterator(int error_kind, std::string message);
  static Value namespace_of(Dict attributes);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::floating || kind_ == Kind::boolean; }
  bool is_int_like() const { return kind_ == Kind::integer || kind_ == Kind::boolean; }  // Python: bool is an int
  ListFlavor flavor() const { return static_cast<ListFlavor>(flag_); }
  bool is_tuple() const { return kind_ == Kind::list && flavor() == ListFlavor::tuple; }
  // A list or tuple: indexable, sliceable, with len().
  bool is_sequence_list() const { return kind_ == Kind::list && flag_ <= 1; }
  bool is_iterator() const {
    return kind_ == Kind::list && (flavor() == ListFlavor::iterator || flavor() == ListFlavor::failed_iterator);
  }
  bool is_view() const { return kind_ == Kind::list && flavor() == ListFlavor::view; }
  const char* list_type_name() const;
  bool is_markup() const { return kind_ == Kind::string && flag_; }
  bool is_unsafe() const { return kind_ == Kind::undefined && flag_; }
  bool is_callable() const { return kind_ == Kind::function || kind_ == Kind::macro; }

  bool as_bool() const { return scalar_.b; }
  int64_t as_int() const { return kind_ == Kind::boolean ? scalar_.b : scalar_.i; }
  double as_float() const { return kind_ == Kind::floating ? scalar_.f : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const ValueList& as_list() const { return *static_cast<const ValueList*>(ptr_.get()); }
  Dict& as_dict() const;  // dict or namespace attributes
  Function& as_function() const { return *static_cast<Function*>(ptr_.get()); }
  Macro& as_macro() const { return *static_cast<Macro*>(ptr_.get()); }
  Object& as_object() const { return *static_cast<Object*>(ptr_.get()); }
  // Why this value is undefined (empty for plain defaults).
  std::string undefined_message() const;
  // Identity, for `is sameas` and cycle checks.
  const void* identity() const { return ptr_.get(); }

  bool truthy() const;

 private:
  Kind kind_ = Kind::undefined;
  uint8_t flag_ = 0;  // tuple/iterator/view (lists), markup (strings), unsafe (undefined)
  union {
    bool b;
    int64_t i;
    double f;
    const char* type;  // iterators and views
  } scalar_{};
  std::shared_ptr<void> ptr_;
};

// An insertion-ordered dict with Python key equality (1 == 1.0 == True; strings by content).
class Dict {
 public:
  using Entry = std::pair<Value, Value>;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  void set(const Value& key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> string_index_;
};

// Call arguments as Python sees them: positional, then keyword in call order.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// A template macro: the evaluator knows what `definition` and `closure` are. The closure is not
// owned (the scope holding a macro would own itself); the evaluator keeps it alive for the render.
struct Macro {
  std::string name;
  const void* definition = nullptr;
  void* closure = nullptr;
};

struct Object {
  virtual ~Object() = default;
  virtual Value attribute(std::string_view name) const = 0;
  virtual std::string type_name() const = 0;  // Python's qualified type name, for messages
};

// Python's str(), repr(), type(x).__name__, and ==.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
std::string type_name(const Value& v);
bool py_equal(const Value& a, const Value& b);
// Python's <: -1, 0 or 1; throws a TypeError like Python for unorderable operands.
int py_compare(const Value& a, const Value& b, std::string_view op);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // Python's indent, already turned into a string
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps with the given options; throws a TypeError for values JSON cannot hold.
std::string to_json(const Value& v, const JsonOptions& options = {});

}  // namespace qinfer::jinja
