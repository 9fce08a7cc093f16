#include "grammar/matcher.h"

#include <algorithm>

namespace qinfer::grammar {
namespace {

uint64_t frame_key(int32_t pos, int32_t parent) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
}

}  // namespace

CompiledGrammar::CompiledGrammar(const Grammar& grammar)
    : byte_sets_(grammar.byte_sets()), root_(grammar.root()) {
  grammar.validate();
  const auto& rules = grammar.rules();
  starts_.resize(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    names_.push_back(rules[r].name);
    for (const Sequence& alt : rules[r].alternatives) {
      starts_[r].push_back(static_cast<int32_t>(positions_.size()));
      for (const Element& e : alt)
        positions_.push_back({e.kind == Element::Kind::bytes ? Position::Kind::bytes : Position::Kind::rule, e.index});
      positions_.push_back({Position::Kind::end, static_cast<int32_t>(r)});
    }
  }
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  for (int32_t s : grammar_->alternatives(grammar_->root())) work_.emplace_back(s, kRoot);
  bool popped = false;
  close(config_, &accepting_, &popped);
}

int32_t Matcher::intern(int32_t pos, int32_t parent) {
  const auto [it, added] = node_ids_.try_emplace(frame_key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

// A worklist, not recursion: nesting depth is the model's to choose (a deeply nested JSON array).
// Left recursion is refused by Grammar::validate, so expanding rules always reaches byte positions.
void Matcher::close(std::vector<int32_t>& to, bool* accepting, bool* popped) {
  const auto& positions = grammar_->positions();
  to.clear();
  seen_list_.clear();
  seen_.clear();
  // Closures are mostly a few frames: a list is searched, a hash set takes over past kSeenList.
  constexpr size_t kSeenList = 32;
  const auto first_time = [&](uint64_t key) {
    if (seen_list_.size() < kSeenList) {
      if (std::find(seen_list_.begin(), seen_list_.end(), key) != seen_list_.end()) return false;
      seen_list_.push_back(key);
      return true;
    }
    if (seen_.empty()) seen_.insert(seen_list_.begin(), seen_list_.end());
    return seen_.insert(key).second;
  };
  while (!work_.empty()) {
    const auto [pos, parent] = work_.back();
    work_.pop_back();
    if (!first_time(frame_key(pos, parent))) continue;
    const CompiledGrammar::Position& p = positions[pos];
    switch (p.kind) {
      case CompiledGrammar::Position::Kind::bytes: to.push_back(intern(pos, parent)); break;
      case CompiledGrammar::Position::Kind::rule: {
        // A rule that ends its alternative returns straight to the caller's frame (a tail call):
        // right-recursive repetitions keep one frame, so their configurations repeat (mask.h).
        const bool tail = positions[pos + 1].kind == CompiledGrammar::Position::Kind::end;
        const int32_t ret = tail ? parent : intern(pos + 1, parent);
        for (int32_t s : grammar_->alternatives(p.index)) work_.emplace_back(s, ret);
        break;
      }
      case CompiledGrammar::Position::Kind::end:
        if (parent == kRoot) *accepting = true;
        else if (parent == kBottom) *popped = true;
        else work_.emplace_back(nodes_[parent].pos, nodes_[parent].parent);
        break;
    }
  }
  std::sort(to.begin(), to.end());
  to.erase(std::unique(to.begin(), to.end()), to.end());
}

void Matcher::step(const std::vector<int32_t>& from, uint8_t b, std::vector<int32_t>& to, bool* accepting,
                   bool* popped) {
  const auto& positions = grammar_->positions();
  *accepting = false;
  *popped = false;
  for (int32_t id : from) {
    const Node n = nodes_[id];
    if (grammar_->byte_set(positions[n.pos].index).has(b)) work_.emplace_back(n.pos + 1, n.parent);
  }
  close(to, accepting, popped);
}

void Matcher::start(int32_t pos, int32_t parent, std::vector<int32_t>& to, bool* accepting, bool* popped) {
  *accepting = false;
  *popped = false;
  work_.emplace_back(pos, parent);
  close(to, accepting, popped);
}

bool Matcher::advance(uint8_t b) {
  bool accepting = false, popped = false;
  step(config_, b, next_, &accepting, &popped);
  if (next_.empty() && !accepting) return false;
  config_.swap(next_);
  accepting_ = accepting;
  return true;
}

// The configuration after all of `bytes` into advance_scratch_[0] (and whether the root may end
// there); false when some byte is not allowed.
bool Matcher::run(std::string_view bytes, bool* accepting) {
  std::vector<int32_t>& current = advance_scratch_[0];
  std::vector<int32_t>& next = advance_scratch_[1];
  current = config_;
  *accepting = accepting_;
  bool popped = false;
  for (char c : bytes) {
    if (current.empty()) return false;
    step(current, static_cast<uint8_t>(c), next, accepting, &popped);
    if (next.empty() && !*accepting) return false;
    current.swap(next);
  }
  return true;
}

// One pass, kept only when every byte is taken (the sampled token of a masked step always is: this
// runs once per generated token).
bool Matcher::advance(std::string_view bytes) {
  bool accepting = false;
  if (!run(bytes, &accepting)) return false;
  config_.swap(advance_scratch_[0]);
  accepting_ = accepting;
  return true;
}

bool Matcher::accepts(std::string_view bytes) {
  bool accepting = false;
  return run(bytes, &accepting);
}

ByteSet Matcher::next_bytes() const {
  ByteSet out;
  for (int32_t id : config_) {
    const ByteSet& s = grammar_->byte_set(grammar_->positions()[nodes_[id].pos].index);
    for (int w = 0; w < 4; ++w) out.words[w] |= s.words[w];
  }
  return out;
}

}  // namespace qinfer::grammar
