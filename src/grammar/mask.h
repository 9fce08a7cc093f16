#pragma once
// Token masks: which tokens of the vocabulary a grammar allows next. The vocabulary is a trie of the
// tokens' byte strings, so tokens sharing a prefix share the automaton's steps. Most of a mask does
// not depend on the stack below the top frame: for each byte position of the grammar, the tokens it
// accepts on its own and those it rejects on its own are found once (by walking the trie from that
// position over an unknown bottom) and kept for every sequence of the grammar; only the tokens that
// would return below the top frame are checked against the real stack at run time (the idea of
// xgrammar's adaptive token mask cache).
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.h"

namespace qinfer::tokenizer {
class Tokenizer;
}

namespace qinfer::grammar {

// A set of token ids as bits, 32 to a word.
using TokenBits = std::vector<uint32_t>;
inline bool test_bit(const TokenBits& bits, int32_t id) { return (bits[id >> 5] >> (id & 31)) & 1; }
inline void set_bit(TokenBits& bits, int32_t id) { bits[id >> 5] |= uint32_t{1} << (id & 31); }

// The vocabulary's byte strings as a trie whose nodes are stored in depth-first pre-order: a node's
// subtree is the range [node, subtree_end) and the tokens ending in it are contiguous too.
class TokenTrie {
 public:
  // token_bytes[id] is token id's byte string; ids with an empty string or `excluded` are left out.
  TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded);
  // Every token but the special ones (stop tokens are allowed by the masks separately).
  static std::shared_ptr<const TokenTrie> from_tokenizer(const tokenizer::Tokenizer& tokenizer);

  struct Node {
    uint8_t byte;         // the edge into this node (unused at the root)
    int32_t subtree_end;  // one past the last node of the subtree
    int32_t tokens_begin;  // into tokens(): the tokens ending here, then those of the subtree below
    int32_t tokens_here;   // how many end exactly here
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // One past the last token of node i's subtree, in tokens().
  int32_t tokens_end(int32_t i) const {
    return nodes_[i].subtree_end < static_cast<int32_t>(nodes_.size()) ? nodes_[nodes_[i].subtree_end].tokens_begin
                                                                        : static_cast<int32_t>(tokens_.size());
  }
  int32_t vocab_size() const { return vocab_size_; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  std::vector<std::string> bytes_;
  int32_t vocab_size_;
};

// A grammar's masks over one vocabulary: tables per frame context (a byte position and the positions
// of up to kContextFrames frames below it), filled the first time a context is met and kept
// (thread-safe: sequences of one grammar share them). The top frame alone is too little: it is often
// a one-character rule, whose every longer token would be left to the run-time check.
class GrammarMasks {
 public:
  GrammarMasks(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenTrie> trie,
               std::vector<int32_t> stop_ids);

  // The tokens `matcher` allows next, into `mask` (vocab_size bits); the stop ids when it can end.
  void fill(Matcher& matcher, TokenBits& mask);

  const std::shared_ptr<const CompiledGrammar>& grammar() const { return grammar_; }
  const TokenTrie& trie() const { return *trie_; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int32_t words() const { return (trie_->vocab_size() + 31) / 32; }

  struct Table {
    TokenBits accepted_bits;              // when many are accepted
    std::vector<int32_t> accepted_ids;    // when few are
    std::vector<int32_t> uncertain;       // tokens that leave the top frame with bytes to go
  };
  static constexpr int kContextFrames = 8;
  // The table of node `id` of `matcher` (computed on first use of its context).
  const Table& table(const Matcher& matcher, int32_t id);

 private:
  // Positions from the top frame down, then kRootMark when the root frame was reached within
  // kContextFrames, else kBottomMark.
  static constexpr int32_t kRootMark = -1, kBottomMark = -2;
  using Context = std::vector<int32_t>;
  Table compute(const Context& context);
  // The trie walks' automaton, made deterministic as it is walked: configurations of scratch_ by id,
  // and their byte transitions (a string's content steps from one configuration to itself, so most
  // steps of a walk are a lookup).
  struct Transition {
    int32_t to = -1;  // -1: no frame left
    bool accepting = false, popped = false;
  };
  static constexpr size_t kMaxTransitions = size_t{1} << 22;
  int32_t dfa_state(const std::vector<int32_t>& config);
  Transition dfa_step(int32_t state, uint8_t b);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> stop_ids_;
  std::mutex mutex_;
  Matcher scratch_;  // its frames over kBottom walk the trie for compute()
  std::map<Context, std::unique_ptr<Table>> tables_;
  std::map<std::vector<int32_t>, int32_t> dfa_ids_;
  std::vector<std::vector<int32_t>> dfa_configs_;
  std::unordered_map<uint64_t, Transition> dfa_next_;
  std::vector<int32_t> dfa_scratch_;
};

// One sequence's constraint: its matcher, the shared masks, and the masks of configurations it has
// met (generation revisits them: every string of one object field, every element of an array).
class TokenConstraint {
 public:
  explicit TokenConstraint(std::shared_ptr<GrammarMasks> masks);

  // The tokens allowed next (vocab_size bits).
  const TokenBits& mask();
  // Consumes a sampled token: false when the grammar does not allow it (nothing consumed). A stop
  // id is allowed once the grammar can end, and finishes the constraint.
  bool accept(int32_t id);
  bool finished() const { return finished_; }
  // The grammar is complete and nothing else may follow: the sequence should stop.
  bool must_stop() const { return matcher_.accepting() && !matcher_.can_continue(); }
  const Matcher& matcher() const { return matcher_; }
  const std::shared_ptr<GrammarMasks>& masks() const { return masks_; }

 private:
  static constexpr size_t kMemoEntries = 64;

  std::shared_ptr<GrammarMasks> masks_;
  Matcher matcher_;
  bool finished_ = false;
  // Configuration (with the accepting flag last) -> mask, least recently used last.
  std::list<std::pair<std::vector<int32_t>, TokenBits>> memo_;
  std::map<std::vector<int32_t>, std::list<std::pair<std::vector<int32_t>, TokenBits>>::iterator> memo_index_;
};

}  // namespace qinfer::grammar
