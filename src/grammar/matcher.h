#pragma once
// The pushdown automaton a Grammar runs as: a set of stacks (a graph-structured stack, each frame a
// position in an alternative and the frame it returns to), advanced byte by byte. Equal frames are
// one node, so a configuration is a sorted list of node ids and equal configurations compare equal.
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/grammar.h"

namespace qinfer::grammar {

// A Grammar laid out for matching: every alternative's elements in one array, each alternative
// closed by an `end` position. Immutable, shared by every matcher of the grammar.
class CompiledGrammar {
 public:
  // Validates the grammar first (Grammar::validate).
  explicit CompiledGrammar(const Grammar& grammar);

  struct Position {
    enum class Kind : uint8_t { bytes, rule, end };
    Kind kind;
    int32_t index;  // byte set or rule
  };
  const std::vector<Position>& positions() const { return positions_; }
  const std::vector<int32_t>& alternatives(int32_t rule) const { return starts_[rule]; }  // first positions
  const ByteSet& byte_set(int32_t index) const { return byte_sets_[index]; }
  int32_t root() const { return root_; }
  const std::string& rule_name(int32_t rule) const { return names_[rule]; }

 private:
  std::vector<Position> positions_;
  std::vector<std::vector<int32_t>> starts_;
  std::vector<ByteSet> byte_sets_;
  std::vector<std::string> names_;
  int32_t root_;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Consumes one byte, or all of `bytes`; false (and nothing consumed) when the grammar does not
  // allow it here.
  bool advance(uint8_t b);
  bool advance(std::string_view bytes);
  // Whether `bytes` could be consumed here, without consuming them.
  bool accepts(std::string_view bytes);
  // The root rule can end here (a stop token may come).
  bool accepting() const { return accepting_; }
  // Some byte may follow (false once the grammar can only end).
  bool can_continue() const { return !config_.empty(); }
  // Bytes that may come next.
  ByteSet next_bytes() const;

  const std::shared_ptr<const CompiledGrammar>& grammar() const { return grammar_; }

  // The configuration: node ids of the frames whose top is a byte position, sorted (internal to the
  // token masks, mask.h).
  struct Node {
    int32_t pos;
    int32_t parent;  // the frame returned to when pos's alternative ends; kRoot, or kBottom
  };
  static constexpr int32_t kRoot = -1;    // the root rule's frame: ending it accepts
  static constexpr int32_t kBottom = -2;  // a frame below which nothing is known (mask.h's tables)
  const std::vector<int32_t>& configuration() const { return config_; }
  const Node& node(int32_t id) const { return nodes_[id]; }

  // One step of the automaton on configurations of this matcher's nodes: the frames reached by
  // consuming `b` from `from`, closed (rules expanded, ended alternatives returned from). Sets
  // *accepting when the root can end after it, *popped when a kBottom frame was returned to.
  void step(const std::vector<int32_t>& from, uint8_t b, std::vector<int32_t>& to, bool* accepting, bool* popped);
  // The id of the frame (pos, parent), made if new.
  int32_t frame(int32_t pos, int32_t parent) { return intern(pos, parent); }
  // The closed configuration of one frame (pos, parent).
  void start(int32_t pos, int32_t parent, std::vector<int32_t>& to, bool* accepting, bool* popped);

 private:
  int32_t intern(int32_t pos, int32_t parent);
  bool run(std::string_view bytes, bool* accepting);
  // Expands the frames in work_ into `to` (sorted, unique).
  void close(std::vector<int32_t>& to, bool* accepting, bool* popped);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<int32_t> config_;
  bool accepting_ = false;
  // Scratch of step / close.
  std::vector<std::pair<int32_t, int32_t>> work_;
  std::vector<uint64_t> seen_list_;
  std::unordered_set<uint64_t> seen_;
  std::vector<int32_t> next_;
  std::vector<int32_t> advance_scratch_[2];
};

}  // namespace qinfer::grammar
