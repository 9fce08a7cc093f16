#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <set>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/lexer.h"

namespace qinfer::jinja {
namespace {

using namespace ast;

// Nesting deeper than this is a broken or hostile template, not a chat template.
constexpr int kMaxDepth = 200;


std::string describe(const Token& t) {
  switch (t.type) {
    case TokenType::eof: return "end of template";
    case TokenType::block_end: return "end of statement block";
    case TokenType::variable_end: return "end of print statement";
    case TokenType::block_begin: return "begin of statement block";
    case TokenType::variable_begin: return "begin of print statement";
    case TokenType::data: return "template data";
    case TokenType::string: return "string literal";
    case TokenType::integer:
    case TokenType::floating: return "number " + t.text;
    default: return "'" + t.text + "'";
  }
}

template <typename Fn>
void for_each_child(const Arguments& a, Fn&& fn) {
  for (const auto& x : a.positional) fn(x);
  for (const auto& [k, x] : a.keyword) fn(x);
  fn(a.star);
  fn(a.star_star);
}

// Calls fn(const ExprPtr&) on each direct sub-expression (some may be null).
template <typename Fn>
void for_each_child(const Expr& e, Fn&& fn) {
  std::visit(
      [&](const auto& n) {
        using T = std::decay_t<decltype(n)>;
        if constexpr (std::is_same_v<T, GetAttr>) {
          fn(n.object);
        } else if constexpr (std::is_same_v<T, GetItem>) {
          fn(n.object);
          fn(n.index);
        } else if constexpr (std::is_same_v<T, Slice>) {
          fn(n.start);
          fn(n.stop);
          fn(n.step);
        } else if constexpr (std::is_same_v<T, Call>) {
          fn(n.callee);
          for_each_child(n.args, fn);
        } else if constexpr (std::is_same_v<T, FilterCall> || std::is_same_v<T, TestCall>) {
          fn(n.input);
          for_each_child(n.args, fn);
        } else if constexpr (std::is_same_v<T, Unary>) {
          fn(n.operand);
        } else if constexpr (std::is_same_v<T, Binary> || std::is_same_v<T, Logical>) {
          fn(n.left);
          fn(n.right);
        } else if constexpr (std::is_same_v<T, Concat>) {
          for (const auto& x : n.parts) fn(x);
        } else if constexpr (std::is_same_v<T, ListExpr>) {
          for (const auto& x : n.items) fn(x);
        } else if constexpr (std::is_same_v<T, Compare>) {
          fn(n.first);
          for (const auto& [op, x] : n.rest) fn(x);
        } else if constexpr (std::is_same_v<T, CondExpr>) {
          fn(n.test);
          fn(n.then);
          fn(n.otherwise);
        } else if constexpr (std::is_same_v<T, DictExpr>) {
          for (const auto& [k, v] : n.items) {
            fn(k);
            fn(v);
          }
        }
      },
      e.node);
}

template <typename Node>
ExprPtr make(int line, Node node) {
  auto e = std::make_unique<Expr>();
  e->line = line;
  e->node = std::move(node);
  if (const auto* item = std::get_if<GetItem>(&e->node)) e->has_slice = std::holds_alternative<Slice>(item->index->node);
  for_each_child(*e, [&](const ExprPtr& child) { e->has_slice = e->has_slice || (child && child->has_slice); });
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != TokenType::eof) fail(cur().line, "unexpected " + describe(cur()));
    return body;
  }

 private:
  // An open block tag, for "expected 'endfor'" messages.
  struct OpenBlock {
    std::string tag;
    int line;
    std::vector<std::string> ends;
  };

  [[noreturn]] void fail(int line, std::string message) const {
    throw Error(ErrorKind::syntax, std::move(message), "", line);
  }

  const Token& cur() const { return t_[pos_]; }
  const Token& look() const { return t_[std::min(pos_ + 1, t_.size() - 1)]; }
  Token next() { return t_[pos_ < t_.size() - 1 ? pos_++ : pos_]; }
  bool is_op(std::string_view op) const { return cur().type == TokenType::op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().type == TokenType::name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail(cur().line, fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n)) fail(cur().line, fmt::format("expected '{}', got {}", n, describe(cur())));
  }
  std::string expect_identifier() {
    if (cur().type != TokenType::name) fail(cur().line, "expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != TokenType::block_end)
      fail(cur().line, "expected end of statement block ('%}'), got " + describe(cur()));
    ++pos_;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) p.fail(p.cur().line, fmt::format("template nested more than {} levels deep", kMaxDepth));
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  // ---- statements ----

  // Parses until a block tag named in `ends` (left current) or the end of the template.
  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    while (cur().type != TokenType::eof) {
      const Token& t = cur();
      if (t.type == TokenType::data) {
        body.push_back({t.line, Text{t.text}});
        ++pos_;
      } else if (t.type == TokenType::variable_begin) {
        const int line = t.line;
        ++pos_;
        ExprPtr e = parse_tuple(false, true, {}, false, false);
        if (cur().type != TokenType::variable_end)
          fail(cur().line, "expected end of print statement ('}}'), got " + describe(cur()));
        ++pos_;
        body.push_back({line, Output{std::move(e)}});
      } else if (t.type == TokenType::block_begin) {
        ++pos_;
        if (cur().type == TokenType::name && std::find(ends.begin(), ends.end(), cur().text) != ends.end())
          return body;
        parse_statement(body);
        expect_block_end();
      } else {
        fail(t.line, "unexpected " + describe(t));
      }
    }
    return body;
  }

  // Body of a block statement: `%}` then statements up to one of `ends`; leaves the end name current.
  Body parse_statements(const std::string& tag, int line, std::vector<std::string> ends) {
    skip_op(":");
    expect_block_end();
    open_.push_back({tag, line, ends});
    Body body = subparse(ends);
    if (cur().type == TokenType::eof)
      fail(cur().line, fmt::format("unexpected end of template: the '{}' on line {} is not closed (expected {})", tag,
                                   line, quote_list(ends)));
    open_.pop_back();
    return body;
  }

  static std::string quote_list(const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) {
      if (i) out += i + 1 == names.size() ? " or " : ", ";
      out += "'" + names[i] + "'";
    }
    return out;
  }

  void parse_statement(Body& body) {
    const Token t = cur();
    if (t.type != TokenType::name) fail(t.line, "tag name expected, got " + describe(t));
    const std::string& tag = t.text;
    const int line = t.line;
    DepthGuard guard(*this);
    if (tag == "if") return body.push_back({line, parse_if()});
    if (tag == "for") return body.push_back({line, parse_for()});
    if (tag == "set") return body.push_back(parse_set());
    if (tag == "macro") return body.push_back({line, parse_macro()});
    if (tag == "call") return body.push_back({line, parse_call_block()});
    if (tag == "filter") {
      ++pos_;
      FilterBlock f;
      f.filter = parse_filter(nullptr, true);
      f.body = parse_statements("filter", line, {"endfilter"});
      ++pos_;
      return body.push_back({line, std::move(f)});
    }
    if (tag == "with") return body.push_back({line, parse_with()});
    if (tag == "print") {
      // {% print a, b %} prints each expression, not a tuple.
      ++pos_;
      do body.push_back({line, Output{parse_expression(true)}});
      while (skip_op(","));
      return;
    }
    if (tag == "break" || tag == "continue") {
      ++pos_;
      if (loop_depth_ == 0) fail(line, fmt::format("'{}' outside of a for loop", tag));
      if (tag == "break") return body.push_back({line, Break{}});
      return body.push_back({line, Continue{}});
    }
    if (tag == "generation") {
      // transformers' AssistantTracker marks assistant text for masks; rendering is unchanged.
      ++pos_;
      Body inner = parse_statements("generation", line, {"endgeneration"});
      ++pos_;
      for (Stmt& s : inner) body.push_back(std::move(s));
      return;
    }
    static const std::set<std::string> unsupported = {"extends", "include", "import", "from", "block", "autoescape"};
    if (unsupported.contains(tag))
      fail(line, fmt::format("'{}' is not supported: chat templates are rendered standalone", tag));
    std::string message = fmt::format("unknown tag '{}'", tag);
    if (!open_.empty())
      message += fmt::format(" (the innermost open block is the '{}' on line {}, which expects {})", open_.back().tag,
                             open_.back().line, quote_list(open_.back().ends));
    fail(line, message);
  }

  If parse_if() {
    If node;
    const int line = next().line;
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false, false);
      Body body = parse_statements("if", line, {"elif", "else", "endif"});
      node.branches.emplace_back(std::move(test), std::move(body));
      const Token t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") {
        node.otherwise = parse_statements("if", line, {"endif"});
        ++pos_;
      }
      break;
    }
    return node;
  }

  For parse_for() {
    For node;
    const int line = next().line;
    node.target = parse_assign_target(true, false, {"in"});
    expect_name("in");
    node.iterable = parse_tuple(false, false, {"recursive"}, false, false);
    if (skip_name("if")) node.filter = parse_expression(true);
    if (is_name("recursive")) fail(cur().line, "recursive for loops are not supported");
    ++loop_depth_;
    node.body = parse_statements("for", line, {"endfor", "else"});
    --loop_depth_;
    if (next().text == "else") {
      node.otherwise = parse_statements("for", line, {"endfor"});
      ++pos_;
    }
    return node;
  }

  Stmt parse_set() {
    const int line = next().line;
    ExprPtr target = parse_assign_target(true, true, {});
    if (skip_op("=")) return {line, Set{std::move(target), parse_tuple(false, true, {}, false, false)}};
    SetBlock node;
    node.target = std::move(target);
    if (is_op("|")) node.filter = parse_filter(nullptr, false);
    node.body = parse_statements("set", line, {"endset"});
    ++pos_;
    return {line, std::move(node)};
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!is_op(")")) {
      if (!def.params.empty()) expect_op(",");
      def.params.push_back(expect_identifier());
      if (skip_op("=")) def.defaults.push_back(parse_expression(true));
      else if (!def.defaults.empty()) fail(cur().line, "non-default argument follows default argument");
    }
    expect_op(")");
  }

  // Macro bodies record which special names they read, so calls know whether extra arguments are allowed.
  void parse_macro_body(MacroDef& def, const std::string& tag, int line, const std::string& end) {
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    names_.emplace_back();
    def.body = parse_statements(tag, line, {end});
    ++pos_;
    def.uses_varargs = names_.back().contains("varargs");
    def.uses_kwargs = names_.back().contains("kwargs");
    def.uses_caller = names_.back().contains("caller");
    names_.pop_back();
    loop_depth_ = saved_loops;
  }

  std::shared_ptr<MacroDef> parse_macro() {
    const int line = next().line;
    auto def = std::make_shared<MacroDef>();
    def->name = expect_identifier();
    parse_signature(*def);
    parse_macro_body(*def, "macro", line, "endmacro");
    return def;
  }

  CallBlock parse_call_block() {
    const int line = next().line;
    CallBlock node;
    node.caller = std::make_shared<MacroDef>();
    node.caller->name = "caller";
    if (is_op("(")) parse_signature(*node.caller);
    node.call = parse_expression(true);
    if (!std::holds_alternative<Call>(node.call->node)) fail(line, "expected a call after 'call'");
    parse_macro_body(*node.caller, "call", line, "endcall");
    return node;
  }

  With parse_with() {
    const int line = next().line;
    With node;
    while (cur().type != TokenType::block_end) {
      if (!node.assignments.empty()) expect_op(",");
      ExprPtr target = parse_assign_target(true, false, {});
      expect_op("=");
      node.assignments.emplace_back(std::move(target), parse_expression(true));
    }
    node.body = parse_statements("with", line, {"endwith"});
    ++pos_;
    return node;
  }

  // ---- expressions ----

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::variable_end || t.type == TokenType::block_end || (t.type == TokenType::op && t.text == ")"))
      return true;
    return t.type == TokenType::name && std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }

  ExprPtr parse_assign_target(bool with_tuple, bool with_namespace, const std::vector<std::string>& extra_end) {
    const int line = cur().line;
    ExprPtr target = with_tuple ? parse_tuple(true, true, extra_end, false, with_namespace)
                                : parse_primary(with_namespace);
    auto assignable = [](const Expr& e) {
      return std::holds_alternative<Name>(e.node) || std::holds_alternative<NamespaceRef>(e.node);
    };
    bool ok = assignable(*target);
    if (auto* list = std::get_if<ListExpr>(&target->node); list && list->tuple)
      ok = std::all_of(list->items.begin(), list->items.end(), [&](const ExprPtr& e) { return assignable(*e); });
    if (!ok) fail(line, "can't assign to this expression");
    if (auto* name = std::get_if<Name>(&target->node); name && is_reserved(name->name))
      fail(line, fmt::format("can't assign to '{}'", name->name));
    return target;
  }

  static bool is_reserved(const std::string& n) {
    return n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None";
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parentheses, bool with_namespace) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) fail(cur().line, "expected an expression, got " + describe(cur()));
    }
    return make(line, ListExpr{std::move(items), true});
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3 = skip_name("else") ? parse_condexpr() : nullptr;
      expr1 = make(line, CondExpr{std::move(expr2), std::move(expr1), std::move(expr3)});
      line = cur().line;
    }
    return expr1;
  }

  ExprPtr parse_or() {
    const int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = make(line, Logical{false, std::move(left), parse_and()});
    return left;
  }

  ExprPtr parse_and() {
    const int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = make(line, Logical{true, std::move(left), parse_not()});
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      DepthGuard guard(*this);
      return make(line, Unary{Unary::not_, parse_not()});
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr expr = parse_math1();
    Compare cmp;
    while (true) {
      if (cur().type == TokenType::op) {
        const std::string& op = cur().text;
        Compare::Op kind;
        if (op == "==") kind = Compare::eq;
        else if (op == "!=") kind = Compare::ne;
        else if (op == "<") kind = Compare::lt;
        else if (op == "<=") kind = Compare::le;
        else if (op == ">") kind = Compare::gt;
        else if (op == ">=") kind = Compare::ge;
        else break;
        ++pos_;
        cmp.rest.emplace_back(kind, parse_math1());
      } else if (skip_name("in")) {
        cmp.rest.emplace_back(Compare::in, parse_math1());
      } else if (is_name("not") && look().type == TokenType::name && look().text == "in") {
        pos_ += 2;
        cmp.rest.emplace_back(Compare::not_in, parse_math1());
      } else {
        break;
      }
    }
    if (cmp.rest.empty()) return expr;
    cmp.first = std::move(expr);
    return make(line, std::move(cmp));
  }

  ExprPtr parse_math1() {
    const int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const BinaryOp op = is_op("+") ? BinaryOp::add : BinaryOp::sub;
      ++pos_;
      left = make(line, Binary{op, std::move(left), parse_concat()});
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    std::vector<ExprPtr> parts;
    parts.push_back(parse_math2());
    while (skip_op("~")) parts.push_back(parse_math2());
    if (parts.size() == 1) return std::move(parts[0]);
    return make(line, Concat{std::move(parts)});
  }

  ExprPtr parse_math2() {
    const int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const BinaryOp kind = is_op("*") ? BinaryOp::mul : is_op("/") ? BinaryOp::div
                            : is_op("//") ? BinaryOp::floordiv : BinaryOp::mod;
      ++pos_;
      left = make(line, Binary{kind, std::move(left), parse_pow()});
    }
    return left;
  }

  ExprPtr parse_pow() {
    const int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = make(line, Binary{BinaryOp::pow, std::move(left), parse_unary(true)});
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const int line = cur().line;
    DepthGuard guard(*this);
    ExprPtr node;
    if (skip_op("-")) node = make(line, Unary{Unary::neg, parse_unary(false)});
    else if (skip_op("+")) node = make(line, Unary{Unary::pos, parse_unary(false)});
    else node = parse_primary(false);
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    const Token t = cur();
    switch (t.type) {
      case TokenType::name: {
        ++pos_;
        if (t.text == "true" || t.text == "True") return make(t.line, Const{true});
        if (t.text == "false" || t.text == "False") return make(t.line, Const{false});
        if (t.text == "none" || t.text == "None") return make(t.line, Const{nullptr});
        if (with_namespace && is_op(".")) {
          ++pos_;
          return make(t.line, NamespaceRef{t.text, expect_identifier()});
        }
        if (!names_.empty()) names_.back().insert(t.text);
        return make(t.line, Name{t.text});
      }
      case TokenType::string: {
        std::string s;
        while (cur().type == TokenType::string) s += next().text;  // adjacent literals concatenate
        return make(t.line, Const{Value(std::move(s))});
      }
      case TokenType::integer: ++pos_; return make(t.line, Const{Value(t.integer)});
      case TokenType::floating: ++pos_; return make(t.line, Const{Value(t.floating)});
      case TokenType::op:
        if (t.text == "(") {
          ++pos_;
          ExprPtr e = parse_tuple(false, true, {}, true, false);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    fail(t.line, "unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    const int line = next().line;
    ListExpr list;
    while (!is_op("]")) {
      if (!list.items.empty()) expect_op(",");
      if (is_op("]")) break;
      list.items.push_back(parse_expression(true));
    }
    expect_op("]");
    return make(line, std::move(list));
  }

  ExprPtr parse_dict() {
    const int line = next().line;
    DictExpr dict;
    while (!is_op("}")) {
      if (!dict.items.empty()) expect_op(",");
      if (is_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      dict.items.emplace_back(std::move(key), parse_expression(true));
    }
    expect_op("}");
    return make(line, std::move(dict));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) node = parse_subscript(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) node = parse_filter(std::move(node), false);
      else if (is_name("is")) node = parse_test(std::move(node));
      else if (is_op("(")) node = parse_call(std::move(node));
      else return node;
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token t = next();
    if (t.text == ".") {
      const Token attr = next();
      if (attr.type == TokenType::name) return make(t.line, GetAttr{std::move(node), attr.text});
      if (attr.type != TokenType::integer) fail(attr.line, "expected name or number after '.'");
      return make(t.line, GetItem{std::move(node), make(attr.line, Const{Value(attr.integer)})});
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.empty()) fail(t.line, "expected subscript expression");
    ExprPtr index = args.size() == 1 ? std::move(args[0]) : make(t.line, ListExpr{std::move(args), true});
    return make(t.line, GetItem{std::move(node), std::move(index)});
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    Slice slice;
    if (!is_op(":")) {
      ExprPtr start = parse_expression(true);
      if (!is_op(":")) return start;
      slice.start = std::move(start);
    }
    ++pos_;  // the first ':'
    if (!is_op("]") && !is_op(",") && !is_op(":")) slice.stop = parse_expression(true);
    if (skip_op(":"))
      if (!is_op("]") && !is_op(",")) slice.step = parse_expression(true);
    return make(line, std::move(slice));
  }

  Arguments parse_call_args() {
    const int line = cur().line;
    expect_op("(");
    Arguments args;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail(line, "invalid syntax for function call expression");
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (skip_op("*")) {
        ensure(!args.star && !args.star_star);
        args.star = parse_expression(true);
      } else if (skip_op("**")) {
        ensure(!args.star_star);
        args.star_star = parse_expression(true);
      } else if (cur().type == TokenType::name && look().type == TokenType::op && look().text == "=") {
        ensure(!args.star_star);
        std::string key = next().text;
        ++pos_;
        args.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!args.star && !args.star_star && args.keyword.empty());
        args.positional.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_call(ExprPtr node) {
    const int line = cur().line;
    return make(line, Call{std::move(node), parse_call_args()});
  }

  std::string parse_dotted_name() {
    std::string name = expect_identifier();
    while (skip_op(".")) {
      name += '.';
      name += expect_identifier();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) ++pos_;
      start_inline = false;
      const int line = cur().line;
      const std::string name = parse_dotted_name();
      if (!filter_exists(name)) {
        if (is_unsupported_filter(name)) fail(line, fmt::format("filter '{}' is not supported by qinfer", name));
        fail(line, fmt::format("no filter named '{}'", name));
      }
      Arguments args;
      if (is_op("(")) args = parse_call_args();
      node = make(line, FilterCall{std::move(node), name, std::move(args)});
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;
    const bool negated = skip_name("not");
    const std::string name = parse_dotted_name();
    if (!test_exists(name)) fail(line, fmt::format("no test named '{}'", name));
    Arguments args;
    const Token& t = cur();
    const bool arg_start = t.type == TokenType::name || t.type == TokenType::string || t.type == TokenType::integer ||
                           t.type == TokenType::floating ||
                           (t.type == TokenType::op && (t.text == "(" || t.text == "[" || t.text == "{"));
    if (is_op("(")) {
      args = parse_call_args();
    } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(t.line, "You cannot chain multiple tests with is");
      args.positional.push_back(parse_postfix(parse_primary(false)));
    }
    return make(line, TestCall{std::move(node), name, std::move(args), negated});
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<OpenBlock> open_;
  std::vector<std::set<std::string>> names_;  // names read inside each macro being parsed
};

}  // namespace

ast::Body parse(std::string_view source) { return Parser(tokenize(source)).parse_template(); }

}  // namespace qinfer::jinja
