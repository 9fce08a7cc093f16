#include "grammar/mask.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace qinfer::grammar {
namespace {

// A table keeps accepted ids as a list while they are fewer than this share of the vocabulary (a
// literal's position accepts a handful; a string's content most of it).
constexpr int32_t kListFraction = 32;

}  // namespace

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& excluded)
    : bytes_(token_bytes), vocab_size_(static_cast<int32_t>(token_bytes.size())) {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_size_; ++id)
    if (!token_bytes[id].empty() && !(id < static_cast<int32_t>(excluded.size()) && excluded[id])) order.push_back(id);
  // Sorted byte strings: a prefix comes before its extensions, so one pass builds the pre-order.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string& x = token_bytes[a];
    const std::string& y = token_bytes[b];
    if (x != y)
      return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end(), [](char p, char q) {
        return static_cast<uint8_t>(p) < static_cast<uint8_t>(q);
      });
    return a < b;
  });
  // path[d] = the node at depth d on the way to the current string.
  nodes_.push_back({0, 0, 0, 0});
  std::vector<int32_t> path = {0};
  std::string prefix;  // the bytes of path's deepest node
  const auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      nodes_[path.back()].subtree_end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
      prefix.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& s = token_bytes[id];
    size_t common = 0;
    while (common < prefix.size() && common < s.size() && prefix[common] == s[common]) ++common;
    close_to(common);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(nodes_.size()));
      nodes_.push_back({static_cast<uint8_t>(s[d]), 0, static_cast<int32_t>(tokens_.size()), 0});
      prefix.push_back(s[d]);
    }
    tokens_.push_back(id);
    ++nodes_[path.back()].tokens_here;
  }
  close_to(0);
  nodes_[0].subtree_end = static_cast<int32_t>(nodes_.size());
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const tokenizer::Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> excluded(n, false);
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) {
      excluded[id] = true;
      continue;
    }
    try {
      bytes[id] = std::string(tokenizer.token_bytes(id));
    } catch (const Error&) {
      excluded[id] = true;  // an id the vocabulary does not define (a gap in the ids)
    }
  }
  return std::make_shared<const TokenTrie>(bytes, excluded);
}

GrammarMasks::GrammarMasks(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const TokenTrie> trie,
                           std::vector<int32_t> stop_ids)
    : grammar_(std::move(grammar)), trie_(std::move(trie)), stop_ids_(std::move(stop_ids)), scratch_(grammar_) {
  for (int32_t id : stop_ids_)
    QINFER_CHECK(id >= 0 && id < trie_->vocab_size(), "grammar: stop token {} is outside the vocabulary of {}", id,
                 trie_->vocab_size());
}

const GrammarMasks::Table& GrammarMasks::table(const Matcher& matcher, int32_t id) {
  Context context;
  int32_t frame = id;
  while (frame >= 0 && static_cast<int>(context.size()) < kContextFrames) {
    context.push_back(matcher.node(frame).pos);
    frame = matcher.node(frame).parent;
  }
  context.push_back(frame == Matcher::kRoot ? kRootMark : kBottomMark);
  std::lock_guard lock(mutex_);
  std::unique_ptr<Table>& t = tables_[context];
  if (!t) t = std::make_unique<Table>(compute(context));
  return *t;
}

// Walks the trie from the context's frames over kBottom (or the root frame, when the context reaches
// it). A token is accepted when some path consumes all its bytes within the context, or returns below
// it exactly at its last byte (returning is always possible); uncertain when its paths die but one
// returned below the context with bytes left (the real stack decides); otherwise rejected, and so is
// every token under a trie node where every path has died.
GrammarMasks::Table GrammarMasks::compute(const Context& context) {
  const auto& nodes = trie_->nodes();
  const auto& tokens = trie_->tokens();
  std::vector<int32_t> accepted;
  Table table;
  struct Visit {
    int32_t node;
    int32_t state;  // dfa_state of the configuration after the node's bytes
    bool returned;  // some path returned below the frame on the way here
  };
  std::vector<Visit> stack;
  if (dfa_next_.size() > kMaxTransitions) {  // a grammar whose walks meet ever new configurations
    dfa_next_.clear();
    dfa_ids_.clear();
    dfa_configs_.clear();
  }
  {
    int32_t parent = context.back() == kRootMark ? Matcher::kRoot : Matcher::kBottom;
    for (size_t i = context.size() - 2; i >= 1; --i) parent = scratch_.frame(context[i], parent);
    bool accepting = false, popped = false;
    std::vector<int32_t> config;
    scratch_.start(context[0], parent, config, &accepting, &popped);
    stack.push_back({0, dfa_state(config), false});
  }
  while (!stack.empty()) {
    const Visit v = stack.back();
    stack.pop_back();
    for (int32_t child = v.node + 1; child < nodes[v.node].subtree_end; child = nodes[child].subtree_end) {
      const Transition t = v.state >= 0 ? dfa_step(v.state, nodes[child].byte) : Transition{};
      const int32_t here = nodes[child].tokens_begin, here_end = here + nodes[child].tokens_here;
      const bool returned = v.returned || t.popped;
      if (t.to >= 0 || t.popped || t.accepting) accepted.insert(accepted.end(), tokens.begin() + here, tokens.begin() + here_end);
      else if (v.returned) table.uncertain.insert(table.uncertain.end(), tokens.begin() + here, tokens.begin() + here_end);
      if (t.to >= 0) {
        stack.push_back({child, t.to, returned});
      } else if (returned) {
        // Every path inside the frame has died: what is below needs the real stack.
        table.uncertain.insert(table.uncertain.end(), tokens.begin() + here_end, tokens.begin() + trie_->tokens_end(child));
      }
    }
  }
  if (static_cast<int64_t>(accepted.size()) * kListFraction > trie_->vocab_size()) {
    table.accepted_bits.assign(words(), 0);
    for (int32_t id : accepted) set_bit(table.accepted_bits, id);
  } else {
    table.accepted_ids = std::move(accepted);
  }
  return table;
}

int32_t GrammarMasks::dfa_state(const std::vector<int32_t>& config) {
  if (config.empty()) return -1;
  const auto [it, added] = dfa_ids_.try_emplace(config, static_cast<int32_t>(dfa_configs_.size()));
  if (added) dfa_configs_.push_back(config);
  return it->second;
}

GrammarMasks::Transition GrammarMasks::dfa_step(int32_t state, uint8_t b) {
  const uint64_t key = (static_cast<uint64_t>(state) << 8) | b;
  if (auto it = dfa_next_.find(key); it != dfa_next_.end()) return it->second;
  Transition t;
  scratch_.step(dfa_configs_[state], b, dfa_scratch_, &t.accepting, &t.popped);
  t.to = dfa_state(dfa_scratch_);
  dfa_next_.emplace(key, t);
  return t;
}

void GrammarMasks::fill(Matcher& matcher, TokenBits& mask) {
  mask.assign(words(), 0);
  std::vector<int32_t> current, next;
  for (int32_t id : matcher.configuration()) {
    const Matcher::Node node = matcher.node(id);
    const Table& t = table(matcher, id);
    if (!t.accepted_bits.empty()) {
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= t.accepted_bits[w];
    } else {
      for (int32_t token : t.accepted_ids) set_bit(mask, token);
    }
    for (int32_t token : t.uncertain) {
      if (test_bit(mask, token)) continue;
      bool accepting = false, popped = false;
      matcher.start(node.pos, node.parent, current, &accepting, &popped);
      for (char c : trie_->bytes(token)) {
        if (current.empty()) {
          accepting = false;
          break;
        }
        matcher.step(current, static_cast<uint8_t>(c), next, &accepting, &popped);
        current.swap(next);
      }
      if (!current.empty() || accepting) set_bit(mask, token);
    }
  }
  if (matcher.accepting())
    for (int32_t id : stop_ids_) set_bit(mask, id);
}

TokenConstraint::TokenConstraint(std::shared_ptr<GrammarMasks> masks)
    : masks_(std::move(masks)), matcher_(masks_->grammar()) {}

const TokenBits& TokenConstraint::mask() {
  std::vector<int32_t> key = matcher_.configuration();
  key.push_back(matcher_.accepting() ? 1 : 0);
  if (auto it = memo_index_.find(key); it != memo_index_.end()) {
    memo_.splice(memo_.begin(), memo_, it->second);
    return memo_.front().second;
  }
  TokenBits bits;
  masks_->fill(matcher_, bits);
  memo_.emplace_front(key, std::move(bits));
  memo_index_[key] = memo_.begin();
  if (memo_.size() > kMemoEntries) {
    memo_index_.erase(memo_.back().first);
    memo_.pop_back();
  }
  return memo_.front().second;
}

bool TokenConstraint::accept(int32_t id) {
  if (finished_) return false;
  const auto& stops = masks_->stop_ids();
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
    if (!matcher_.accepting()) return false;
    finished_ = true;
    return true;
  }
  if (id < 0 || id >= masks_->trie().vocab_size()) return false;
  const std::string& bytes = masks_->trie().bytes(id);
  return !bytes.empty() && matcher_.advance(bytes);
}

}  // namespace qinfer::grammar
