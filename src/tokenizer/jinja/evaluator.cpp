// The tree-walking evaluator. Scoping follows Jinja2's compiled code: every for loop (emptied at
// each iteration), macro call, with-block and set/filter block gets a scope whose parent is where
// it was written; `if` gets none; assignments go to the innermost scope, so `set` inside a loop
// never leaks out of it.
#include <algorithm>
#include <new>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/pystr.h"
#include "tokenizer/jinja/template.h"

namespace qinfer::jinja {
namespace {

using namespace ast;

// Python's default recursion limit is 1000 frames; a few macro levels use several each.
constexpr int kMaxCallDepth = 200;

struct Scope : std::enable_shared_from_this<Scope> {
  explicit Scope(std::shared_ptr<Scope> parent = nullptr) : parent(std::move(parent)) {}

  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (auto it = s->vars.find(name); it != s->vars.end()) return &it->second;
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child(const ScopePtr& parent) { return std::make_shared<Scope>(parent); }

// Jinja's LoopContext over an already materialized (and filtered) sequence.
class LoopContext : public Object {
 public:
  LoopContext(std::shared_ptr<const ValueList> items, size_t index, std::shared_ptr<Value> last_changed)
      : items_(std::move(items)), index_(index), last_changed_(std::move(last_changed)) {}

  Value attribute(std::string_view name) const override {
    const auto n = static_cast<int64_t>(items_->size()), i = static_cast<int64_t>(index_);
    if (name == "index") return i + 1;
    if (name == "index0") return i;
    if (name == "revindex") return n - i;
    if (name == "revindex0") return n - i - 1;
    if (name == "first") return i == 0;
    if (name == "last") return i == n - 1;
    if (name == "length") return n;
    if (name == "depth") return 1;
    if (name == "depth0") return 0;
    if (name == "previtem") return i > 0 ? (*items_)[index_ - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? (*items_)[index_ + 1] : Value::undefined("there is no next item");
    if (name == "cycle") {
      const size_t at = index_;
      return Value(std::make_shared<Function>(Function{"cycle", [at](CallArgs& a) {
        if (a.positional.empty()) raise(ErrorKind::type, "no items for cycling given");
        return a.positional[at % a.positional.size()];
      }}));
    }
    if (name == "changed") {
      auto last = last_changed_;
      return Value(std::make_shared<Function>(Function{"changed", [last](CallArgs& a) {
        Value now = Value::tuple(a.positional);
        if (!last->is_undefined() && py_equal(*last, now)) return Value(false);
        *last = std::move(now);
        return Value(true);
      }}));
    }
    return {};
  }
  std::string type_name() const override { return "LoopContext"; }

 private:
  std::shared_ptr<const ValueList> items_;
  size_t index_;
  std::shared_ptr<Value> last_changed_;
};

// Thrown while folding when a sub-expression needs run time (a name, a call): Jinja's Impossible.
struct NotConstant {};

class Evaluator {
 public:
  Evaluator(const std::string& source, Budget& budget) : source_(source), budget_(budget) {}
  // Namespaces are the only mutable values, so only they can close a reference cycle
  // (`set ns.me = ns`); emptying the ones this render assigned to frees them.
  ~Evaluator() {
    for (const auto& [id, ns] : mutated_namespaces_) ns.as_dict() = Dict();
  }

  enum class Flow { next, break_, continue_ };

  Flow exec(const Body& body, const ScopePtr& scope) {
    for (const Stmt& s : body) {
      const Flow f = exec(s, scope);
      if (f != Flow::next) return f;
    }
    return Flow::next;
  }

  std::string out;

 private:
  Flow exec(const Stmt& stmt, const ScopePtr& scope) {
    try {
      budget_.step();
      return std::visit([&](const auto& node) { return run(node, stmt.line, scope); }, stmt.node);
    } catch (const Error& e) {
      if (e.line() > 0) throw;
      throw e.located(source_, stmt.line);
    } catch (const std::bad_alloc&) {
      out_of_memory(stmt.line);
    } catch (const std::length_error&) {
      out_of_memory(stmt.line);
    }
  }

  // The budget refuses what would not fit, but an allocation it allowed can still fail: that
  // fails the render, not the process.
  [[noreturn]] void out_of_memory(int line) const {
    throw Error(ErrorKind::limit, "the template ran out of memory", source_, line);
  }

  void emit(std::string_view text) {
    budget_.charge(text.size());
    out += text;
  }
  void emit(const Value& v) {
    if (v.is_string()) emit(std::string_view(v.as_string()));
    else emit(std::string_view(to_str(v)));
  }

  Flow run(const Text& node, int, const ScopePtr&) {
    emit(std::string_view(node.text));
    return Flow::next;
  }

  Flow run(const Output& node, int, const ScopePtr& scope) {
    // Jinja renders an output expression at compile time when it can (any result will do).
    if (node.value->has_slice)
      if (auto folded = fold(*node.value, scope, false)) {
        emit(*folded);
        return Flow::next;
      }
    emit(eval(*node.value, scope));
    return Flow::next;
  }

  Flow run(const If& node, int, const ScopePtr& scope) {
    for (const auto& [test, body] : node.branches)
      if (eval(*test, scope).truthy()) return exec(body, scope);
    return exec(node.otherwise, scope);
  }

  Flow run(const For& node, int, const ScopePtr& scope) {
    ValueList items = iterate(eval(*node.iterable, scope));
    if (node.filter) {
      ValueList kept;
      for (Value& item : items) {
        auto probe = child(scope);
        assign(*node.target, item, *probe);
        if (!eval(*node.filter, probe).truthy()) continue;
        // Jinja filters with a generator over the unpacked target, so items become tuples.
        const bool unpacks = std::holds_alternative<ListExpr>(node.target->node);
        kept.push_back(unpacks ? Value::tuple(iterate(item)) : std::move(item));
      }
      items = std::move(kept);
    }
    auto shared = std::make_shared<const ValueList>(std::move(items));
    auto last_changed = std::make_shared<Value>();
    // Jinja clears its "no iteration" flag at the end of the body, so an iteration left by
    // break or continue does not count: `else` runs unless some body ran to its end.
    bool completed_a_body = false;
    // One frame for the whole loop, emptied at each iteration (so reads before a `set` see the
    // outer value): a macro defined in the loop sees the current iteration's variables, as the
    // Python closures Jinja compiles to do.
    auto frame = child(scope);
    for (size_t i = 0; i < shared->size(); ++i) {
      budget_.step();  // an empty body takes no steps of its own
      frame->vars.clear();
      frame->vars["loop"] = Value(std::make_shared<LoopContext>(shared, i, last_changed));
      assign(*node.target, (*shared)[i], *frame);
      const Flow flow = exec(node.body, frame);
      if (flow == Flow::break_) break;
      completed_a_body = completed_a_body || flow == Flow::next;
    }
    // Jinja resets the loop's variables when it ends; a macro called later finds them unset.
    for (auto& [name, value] : frame->vars) value = Value::undefined(fmt::format("'{}' is undefined", name));
    *last_changed = Value();  // loop.changed(loop) would otherwise keep itself alive
    if (!completed_a_body) return exec(node.otherwise, child(scope));
    return Flow::next;
  }

  Flow run(const Set& node, int, const ScopePtr& scope) {
    assign(*node.target, eval(*node.value, scope), *scope);
    return Flow::next;
  }

  Flow run(const SetBlock& node, int, const ScopePtr& scope) {
    Value text = capture(node.body, child(scope));
    assign(*node.target, node.filter ? apply_filters(*node.filter, text, scope) : text, *scope);
    return Flow::next;
  }

  Flow run(const std::shared_ptr<MacroDef>& def, int, const ScopePtr& scope) {
    scope->vars[def->name] = make_macro(*def, scope);
    return Flow::next;
  }

  Flow run(const CallBlock& node, int, const ScopePtr& scope) {
    const auto& call = std::get<Call>(node.call->node);
    Value callee = eval(*call.callee, scope);
    CallArgs args = eval_args(call.args, scope);
    args.keyword.emplace_back("caller", make_macro(*node.caller, scope));
    emit(invoke(callee, args));
    return Flow::next;
  }

  Flow run(const FilterBlock& node, int, const ScopePtr& scope) {
    emit(apply_filters(*node.filter, capture(node.body, child(scope)), scope));
    return Flow::next;
  }

  Flow run(const With& node, int, const ScopePtr& scope) {
    auto inner = child(scope);
    for (const auto& [target, value] : node.assignments) assign(*target, eval(*value, scope), *inner);
    return exec(node.body, inner);  // with is inline in Jinja: break and continue pass through
  }

  Flow run(const Break&, int, const ScopePtr&) { return Flow::break_; }
  Flow run(const Continue&, int, const ScopePtr&) { return Flow::continue_; }

  Value capture(const Body& body, const ScopePtr& scope) {
    std::string saved;
    std::swap(saved, out);
    try {
      exec(body, scope);
    } catch (...) {
      std::swap(saved, out);
      throw;
    }
    std::swap(saved, out);
    return Value(std::move(saved));
  }

  Value make_macro(const MacroDef& def, const ScopePtr& scope) {
    budget_.charge(kValueOverhead + sizeof(Macro) + sizeof(ScopePtr));  // closures_ keeps each one
    closures_.push_back(scope);
    return Value(std::make_shared<Macro>(Macro{def.name, &def, scope.get()}));
  }

  void assign(const Expr& target, const Value& value, Scope& scope) {
    if (const auto* name = std::get_if<Name>(&target.node)) {
      scope.vars[name->name] = value;
      return;
    }
    if (const auto* ref = std::get_if<NamespaceRef>(&target.node)) {
      const Value* ns = scope.find(ref->name);
      if (!ns) raise(ErrorKind::undefined, "'{}' is undefined", ref->name);
      if (ns->kind() != Kind::namespace_) raise(ErrorKind::type, "cannot assign attribute on non-namespace object");
      ns->as_dict().set(Value(ref->attribute), value);
      mutated_namespaces_.emplace(ns->identity(), *ns);
      return;
    }
    const auto& targets = std::get<ListExpr>(target.node).items;
    const ValueList items = iterate(value);
    if (items.size() < targets.size())
      raise(ErrorKind::value, "not enough values to unpack (expected {}, got {})", targets.size(), items.size());
    if (items.size() > targets.size())
      raise(ErrorKind::value, "too many values to unpack (expected {})", targets.size());
    for (size_t i = 0; i < targets.size(); ++i) assign(*targets[i], items[i], scope);
  }

  // ---- expressions ----

  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      budget_.step();
      if (e.has_slice && !folding_)
        if (auto folded = fold(e, scope, true)) return *folded;
      return std::visit([&](const auto& node) { return value_of(node, e.line, scope); }, e.node);
    } catch (const Error& err) {
      if (err.line() > 0) throw;
      throw err.located(source_, e.line);
    } catch (const std::bad_alloc&) {
      out_of_memory(e.line);
    } catch (const std::length_error&) {
      out_of_memory(e.line);
    }
  }

  // Jinja's optimizer evaluates constant sub-expressions while compiling (Expr.as_const) and keeps
  // results it can write back as literals. That differs from run time only for slices, which then
  // go through the sandbox's getitem (failure gives undefined) instead of a raw Python subscript.
  std::optional<Value> fold(const Expr& e, const ScopePtr& scope, bool need_literal) {
    folding_ = true;
    try {
      Value v = std::visit([&](const auto& node) { return value_of(node, e.line, scope); }, e.node);
      folding_ = false;
      if (!need_literal || is_literal(v)) return v;
    } catch (const NotConstant&) {
      folding_ = false;
    } catch (const Error&) {
      folding_ = false;
    }
    return std::nullopt;
  }

  // Jinja's has_safe_repr: what a folded constant may be.
  static bool is_literal(const Value& v) {
    switch (v.kind()) {
      case Kind::none: case Kind::boolean: case Kind::integer: case Kind::floating: case Kind::string: return true;
      case Kind::list:
        return v.is_sequence_list() &&
               std::all_of(v.as_list().begin(), v.as_list().end(), [](const Value& x) { return is_literal(x); });
      case Kind::dict:
        return std::all_of(v.as_dict().entries().begin(), v.as_dict().entries().end(),
                           [](const auto& kv) { return is_literal(kv.first) && is_literal(kv.second); });
      default: return false;
    }
  }

  Value value_of(const Const& node, int, const ScopePtr&) { return node.value; }

  Value value_of(const Name& node, int, const ScopePtr& scope) {
    if (folding_) throw NotConstant{};
    if (const Value* v = scope->find(node.name)) return *v;
    if (const Value* g = find_global(node.name)) return *g;
    return Value::undefined(fmt::format("'{}' is undefined", node.name));
  }

  Value value_of(const NamespaceRef& node, int, const ScopePtr& scope) {
    if (folding_) throw NotConstant{};
    const Value* ns = scope->find(node.name);
    return get_attr(ns ? *ns : Value::undefined(fmt::format("'{}' is undefined", node.name)), node.attribute);
  }

  Value value_of(const GetAttr& node, int, const ScopePtr& scope) {
    return get_attr(eval(*node.object, scope), node.attribute);
  }

  Value value_of(const GetItem& node, int, const ScopePtr& scope) {
    Value obj = eval(*node.object, scope);
    if (const auto* slice = std::get_if<Slice>(&node.index->node)) {
      return slice_of(obj, *slice, scope);
    }
    return get_item(obj, eval(*node.index, scope));
  }

  Value value_of(const Slice&, int, const ScopePtr&) { raise(ErrorKind::syntax, "slice outside of a subscript"); }

  Value slice_of(const Value& obj, const Slice& slice, const ScopePtr& scope) {
    auto bound_value = [&](const ExprPtr& e) { return e ? eval(*e, scope) : Value(nullptr); };
    const Value bounds[3] = {bound_value(slice.start), bound_value(slice.stop), bound_value(slice.step)};
    if (obj.is_undefined()) fail_undefined(obj);
    const bool subscriptable = obj.is_string() || obj.is_sequence_list();
    const bool bad_bounds = std::any_of(std::begin(bounds), std::end(bounds),
                                        [](const Value& b) { return !b.is_none() && !b.is_int_like(); });
    if (folding_ && (!subscriptable || bad_bounds)) {
      // The sandbox's getitem turns the TypeError into undefined.
      std::string repr = "slice(";
      for (int i = 0; i < 3; ++i) repr += (i ? ", " : "") + to_repr(bounds[i]);
      return Value::undefined(fmt::format("{} has no element {})", object_type_repr(obj), repr));
    }
    if (subscriptable && bad_bounds)
      raise(ErrorKind::type, "slice indices must be integers or None or have an __index__ method");
    auto bound = [&](int i) -> std::optional<int64_t> {
      if (bounds[i].is_none()) return std::nullopt;
      return bounds[i].as_int();
    };
    const auto start = bound(0), stop = bound(1), step = bound(2);
    if (subscriptable && step && *step == 0) raise(ErrorKind::value, "slice step cannot be zero");
    if (obj.is_sequence_list()) {
      ValueList out;
      for (int64_t i : py::slice_indices(static_cast<int64_t>(obj.as_list().size()), start, stop, step))
        out.push_back(obj.as_list()[i]);
      return obj.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
    if (obj.is_string()) {
      const std::u32string text = py::decode(obj.as_string());
      std::u32string out;
      for (int64_t i : py::slice_indices(static_cast<int64_t>(text.size()), start, stop, step)) out += text[i];
      return Value(py::encode(out));
    }
    // Jinja compiles slices to a plain Python subscript (no sandbox getitem), so these raise.
    if (obj.is_dict()) raise(ErrorKind::type, "unhashable type: 'slice'");
    raise(ErrorKind::type, "'{}' object is not subscriptable", type_name(obj));
  }

  CallArgs eval_args(const Arguments& args, const ScopePtr& scope) {
    CallArgs out;
    for (const auto& e : args.positional) out.positional.push_back(eval(*e, scope));
    if (args.star)
      for (Value& v : iterate(eval(*args.star, scope))) out.positional.push_back(std::move(v));
    for (const auto& [k, e] : args.keyword) out.keyword.emplace_back(k, eval(*e, scope));
    if (args.star_star) {
      Value extra = eval(*args.star_star, scope);
      if (!extra.is_dict()) raise(ErrorKind::type, "argument after ** must be a mapping, not {}", type_name(extra));
      for (const auto& [k, v] : extra.as_dict().entries()) {
        if (!k.is_string()) raise(ErrorKind::type, "keywords must be strings");
        out.keyword.emplace_back(k.as_string(), v);
      }
    }
    return out;
  }

  Value value_of(const Call& node, int, const ScopePtr& scope) {
    if (folding_) throw NotConstant{};
    Value callee = eval(*node.callee, scope);
    CallArgs args = eval_args(node.args, scope);
    return invoke(callee, args);
  }

  Value invoke(const Value& callee, CallArgs& args) {
    if (callee.kind() == Kind::macro) return call_macro(callee.as_macro(), args);
    return call_function(callee, args);
  }

  Value call_macro(const Macro& macro, CallArgs& args) {
    const auto& def = *static_cast<const MacroDef*>(macro.definition);
    if (depth_ >= kMaxCallDepth) raise(ErrorKind::limit, "macro calls nested more than {} deep", kMaxCallDepth);
    auto* closure = static_cast<Scope*>(macro.closure);
    auto scope = child(closure->shared_from_this());
    const size_t n = def.params.size(), first_default = n - def.defaults.size();
    if (args.positional.size() > n && !def.uses_varargs)
      raise(ErrorKind::type, "macro '{}' takes not more than {} argument(s)", def.name, n);
    std::vector<bool> bound(n, false);
    for (size_t i = 0; i < n && i < args.positional.size(); ++i) {
      scope->vars[def.params[i]] = args.positional[i];
      bound[i] = true;
    }
    Dict extra_kwargs;
    for (auto& [k, v] : args.keyword) {
      auto it = std::find(def.params.begin(), def.params.end(), k);
      if (it != def.params.end()) {
        const size_t i = static_cast<size_t>(it - def.params.begin());
        if (bound[i]) raise(ErrorKind::type, "macro '{}' got multiple values for argument '{}'", def.name, k);
        scope->vars[k] = v;
        bound[i] = true;
      } else if (k == "caller" && def.uses_caller) {
        scope->vars["caller"] = v;
      } else if (def.uses_kwargs) {
        extra_kwargs.set(Value(k), v);
      } else {
        raise(ErrorKind::type, "macro '{}' takes no keyword argument '{}'", def.name, k);
      }
    }
    ++depth_;
    struct Unwind {
      int& d;
      ~Unwind() { --d; }
    } unwind{depth_};
    // Defaults are evaluated at call time inside the macro, so they may read earlier parameters.
    for (size_t i = 0; i < n; ++i) {
      if (bound[i]) continue;
      scope->vars[def.params[i]] = i >= first_default
                                       ? eval(*def.defaults[i - first_default], scope)
                                       : Value::undefined(fmt::format("parameter '{}' was not provided", def.params[i]));
    }
    if (def.uses_varargs)
      scope->vars["varargs"] = Value::tuple(args.positional.size() > n
                                                ? ValueList(args.positional.begin() + static_cast<std::ptrdiff_t>(n),
                                                            args.positional.end())
                                                : ValueList{});
    if (def.uses_kwargs) scope->vars["kwargs"] = Value(std::move(extra_kwargs));
    if (def.uses_caller && !scope->vars.contains("caller"))
      scope->vars["caller"] = Value::undefined("No caller defined");
    return capture(def.body, scope);
  }

  Value apply_filters(const Expr& chain, const Value& input, const ScopePtr& scope) {
    const auto& f = std::get<FilterCall>(chain.node);
    Value v = f.input ? apply_filters(*f.input, input, scope) : input;
    CallArgs args = eval_args(f.args, scope);
    try {
      return apply_filter(f.name, v, args);
    } catch (const Error& err) {
      if (err.line() > 0) throw;
      throw err.located(source_, chain.line);
    }
  }

  Value value_of(const FilterCall& node, int, const ScopePtr& scope) {
    // Filters that take Jinja's context are never folded.
    if (folding_ && (node.name == "map" || node.name == "select" || node.name == "reject" ||
                     node.name == "selectattr" || node.name == "rejectattr"))
      throw NotConstant{};
    Value input = eval(*node.input, scope);
    CallArgs args = eval_args(node.args, scope);
    return apply_filter(node.name, input, args);
  }

  Value value_of(const TestCall& node, int, const ScopePtr& scope) {
    Value input = eval(*node.input, scope);
    CallArgs args = eval_args(node.args, scope);
    return apply_test(node.name, input, args) != node.negated;
  }

  Value value_of(const Unary& node, int, const ScopePtr& scope) {
    Value v = eval(*node.operand, scope);
    if (node.op == Unary::not_) return !v.truthy();
    return negate(v, node.op == Unary::neg);
  }

  Value value_of(const Binary& node, int, const ScopePtr& scope) {
    Value left = eval(*node.left, scope);
    return binary_op(node.op, left, eval(*node.right, scope));
  }

  Value value_of(const Logical& node, int, const ScopePtr& scope) {
    Value left = eval(*node.left, scope);
    if (node.is_and ? !left.truthy() : left.truthy()) return left;
    return eval(*node.right, scope);
  }

  Value value_of(const Concat& node, int, const ScopePtr& scope) {
    // The parts are kept as values (no copies) and sized before the result is built.
    ValueList parts;
    size_t total = 0;
    for (const auto& part : node.parts) {
      Value v = eval(*part, scope);
      if (!v.is_string()) v = Value(to_str(v));
      total += v.as_string().size();
      budget_.ensure(total);
      parts.push_back(std::move(v));
    }
    std::string s;
    s.reserve(total);
    for (const Value& part : parts) s += part.as_string();
    return Value(std::move(s));
  }

  Value value_of(const Compare& node, int, const ScopePtr& scope) {
    Value left = eval(*node.first, scope);
    for (const auto& [op, expr] : node.rest) {
      Value right = eval(*expr, scope);
      bool ok = false;
      switch (op) {
        case Compare::eq: ok = py_equal(left, right); break;
        case Compare::ne: ok = !py_equal(left, right); break;
        case Compare::lt: ok = py_compare(left, right, "<") < 0; break;
        case Compare::le: ok = py_compare(left, right, "<=") <= 0; break;
        case Compare::gt: ok = py_compare(left, right, ">") > 0; break;
        case Compare::ge: ok = py_compare(left, right, ">=") >= 0; break;
        case Compare::in: ok = contains(right, left); break;
        case Compare::not_in: ok = !contains(right, left); break;
      }
      if (!ok) return false;
      left = std::move(right);
    }
    return true;
  }

  Value value_of(const CondExpr& node, int line, const ScopePtr& scope) {
    if (eval(*node.test, scope).truthy()) return eval(*node.then, scope);
    if (node.otherwise) return eval(*node.otherwise, scope);
    if (folding_) throw NotConstant{};
    return Value::undefined(fmt::format(
        "the inline if-expression on line {} evaluated to false and no else section was defined.", line));
  }

  Value value_of(const ListExpr& node, int, const ScopePtr& scope) {
    ValueList items;
    for (const auto& e : node.items) items.push_back(eval(*e, scope));
    return node.tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
  }

  Value value_of(const DictExpr& node, int, const ScopePtr& scope) {
    Dict d;
    for (const auto& [k, v] : node.items) {
      Value key = eval(*k, scope);
      if ((key.is_list() && !key.is_tuple() && !key.is_iterator()) || key.is_dict() || key.kind() == Kind::namespace_)
        raise(ErrorKind::type, "unhashable type: '{}'", type_name(key));
      d.set(key, eval(*v, scope));
    }
    return Value(std::move(d));
  }

  const std::string& source_;
  Budget& budget_;
  int depth_ = 0;
  bool folding_ = false;
  std::vector<ScopePtr> closures_;         // scopes that define macros, alive for the whole render
  std::unordered_map<const void*, Value> mutated_namespaces_;
};

}  // namespace

struct Template::Impl {
  std::string name;
  ast::Body body;
};

Template::Template(std::string_view source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  try {
    impl_->body = parse(source);
  } catch (const Error& e) {
    throw e.located(impl_->name, e.line());
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Dict& context, const Limits& limits) const {
  Budget budget(limits);
  auto root = std::make_shared<Scope>();
  for (const auto& [k, v] : context.entries())
    if (k.is_string()) root->vars[k.as_string()] = v;
  Evaluator ev(impl_->name, budget);
  try {
    ev.exec(impl_->body, root);
  } catch (const Error& e) {
    if (e.line() > 0) throw;
    throw e.located(impl_->name, 0);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::limit, "the template ran out of memory", impl_->name);
  }
  return std::move(ev.out);
}

}  // namespace qinfer::jinja
