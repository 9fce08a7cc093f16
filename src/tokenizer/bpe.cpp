#include "tokenizer/bpe.h"

#include <algorithm>
#include <mutex>

#include "tokenizer/utf8.h"

namespace qinfer::tokenizer {
namespace {

// Printable Latin-1 bytes stand for themselves; the other 68 bytes take U+0100.. in byte order.
struct ByteLevelTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 0x144> to_byte{};  // every character of the alphabet is below U+0144

  ByteLevelTables() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}

struct Symbol {
  int32_t token;  // -1 once merged into the symbol on its left
  int32_t prev, next;
};

struct Candidate {
  int32_t rank, pos, merged;
  // std::*_heap keep the largest on top: make that the lowest rank, then the leftmost position.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

char32_t byte_to_char(uint8_t byte) { return tables().to_char[byte]; }

bool byte_level_to_bytes(std::string_view token, std::string& bytes) {
  bytes.clear();
  const auto& to_byte = tables().to_byte;
  for (size_t i = 0; i < token.size();) {
    const char32_t c = next_code_point(token, i);
    if (c >= to_byte.size() || to_byte[c] < 0) return false;
    bytes += static_cast<char>(to_byte[c]);
  }
  return true;
}

Bpe::Bpe(const std::array<int32_t, 256>& byte_tokens, const std::vector<Merge>& merges) : byte_tokens_(byte_tokens) {
  size_t size = 16;
  while (size < 2 * merges.size()) size *= 2;
  table_.assign(size, Slot{kEmpty, 0, 0});
  mask_ = size - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const uint64_t key = uint64_t(uint32_t(m.left)) << 32 | uint32_t(m.right);
    uint64_t i = (key * 0x9E3779B97F4A7C15ull >> 20) & mask_;
    while (table_[i].key != kEmpty && table_[i].key != key) i = (i + 1) & mask_;
    table_[i] = Slot{key, static_cast<int32_t>(rank), m.merged};
  }
}

const Bpe::Slot* Bpe::find(int32_t left, int32_t right) const {
  const uint64_t key = uint64_t(uint32_t(left)) << 32 | uint32_t(right);
  for (uint64_t i = (key * 0x9E3779B97F4A7C15ull >> 20) & mask_;; i = (i + 1) & mask_) {
    if (table_[i].key == key) return &table_[i];
    if (table_[i].key == kEmpty) return nullptr;
  }
}

void Bpe::encode(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_tokens_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_, std::try_to_lock);  // a busy cache just misses this word
    if (lock.owns_lock() && cache_.size() < kCacheCapacity)
      cache_.try_emplace(std::string(word), out.begin() + static_cast<ptrdiff_t>(first), out.end());
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> queue;
  const int32_t n = static_cast<int32_t>(word.size());
  symbols.resize(n);
  queue.clear();
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = {byte_tokens_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  const auto consider = [&](int32_t pos) {  // queue the pair starting at symbol `pos`, if it merges
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Slot* s = find(symbols[pos].token, symbols[next].token)) {
      queue.push_back({s->rank, pos, s->merged});
      std::push_heap(queue.begin(), queue.end());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    const Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.token < 0 || left.next < 0) continue;
    // Stale when either side changed since it was queued; a changed pair never keeps its merged token.
    const Slot* s = find(left.token, symbols[left.next].token);
    if (!s || s->merged != top.merged) continue;
    Symbol& right = symbols[left.next];
    left.token = top.merged;
    right.token = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].token);
}

}  // namespace qinfer::tokenizer
