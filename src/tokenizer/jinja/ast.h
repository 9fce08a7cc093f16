#pragma once
// The parsed template: expressions and statements as Jinja2's parser builds them (nodes.py),
// each with the template line it came from for error messages.
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/value.h"

namespace qinfer::jinja::ast {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  ExprPtr star, star_star;  // *args, **kwargs
};

struct Const { Value value; };
struct Name { std::string name; };
struct NamespaceRef { std::string name, attribute; };  // `ns.x` as an assignment target
struct GetAttr { ExprPtr object; std::string attribute; };
struct GetItem { ExprPtr object, index; };
struct Slice { ExprPtr start, stop, step; };  // only as a GetItem index
struct Call { ExprPtr callee; Arguments args; };
struct FilterCall { ExprPtr input; std::string name; Arguments args; };  // input is null in filter blocks
struct TestCall { ExprPtr input; std::string name; Arguments args; bool negated = false; };
struct Unary { enum Op { neg, pos, not_ } op; ExprPtr operand; };
struct Binary { BinaryOp op; ExprPtr left, right; };
struct Logical { bool is_and; ExprPtr left, right; };
struct Concat { std::vector<ExprPtr> parts; };
struct Compare {
  enum Op { eq, ne, lt, le, gt, ge, in, not_in };
  ExprPtr first;
  std::vector<std::pair<Op, ExprPtr>> rest;
};
struct CondExpr { ExprPtr test, then, otherwise; };  // otherwise may be null
struct ListExpr { std::vector<ExprPtr> items; bool tuple = false; };
struct DictExpr { std::vector<std::pair<ExprPtr, ExprPtr>> items; };

struct Expr {
  int line = 0;
  // A slice somewhere below: only then can Jinja's compile-time constant folding change the result.
  bool has_slice = false;
  std::variant<Const, Name, NamespaceRef, GetAttr, GetItem, Slice, Call, FilterCall, TestCall, Unary, Binary,
               Logical, Concat, Compare, CondExpr, ListExpr, DictExpr>
      node;
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Text { std::string text; };
struct Output { ExprPtr value; };
struct If { std::vector<std::pair<ExprPtr, Body>> branches; Body otherwise; };
struct For { ExprPtr target, iterable, filter; Body body, otherwise; };
struct Set { ExprPtr target, value; };
struct SetBlock { ExprPtr target, filter; Body body; };  // filter: a FilterCall chain over a null input
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};
struct CallBlock { ExprPtr call; std::shared_ptr<MacroDef> caller; };
struct FilterBlock { ExprPtr filter; Body body; };
struct With { std::vector<std::pair<ExprPtr, ExprPtr>> assignments; Body body; };
struct Break {};
struct Continue {};

struct Stmt {
  int line = 0;
  std::variant<Text, Output, If, For, Set, SetBlock, std::shared_ptr<MacroDef>, CallBlock, FilterBlock, With, Break,
               Continue>
      node;
};

}  // namespace qinfer::jinja::ast
