#pragma once
// Byte-level BPE, as HF tokenizers' `BPE` model runs under a ByteLevel pre-tokenizer: a word's raw
// bytes start as one symbol each, then the adjacent pair with the lowest merge rank (leftmost among
// equals) is merged until no adjacent pair has a merge.
#include <array>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace qinfer::tokenizer {

// GPT-2's table from bytes to the printable characters that byte-level vocabularies are written in.
char32_t byte_to_char(uint8_t byte);
// The raw bytes behind a vocabulary string written in byte-level characters; false when the string
// holds a character outside that alphabet.
bool byte_level_to_bytes(std::string_view token, std::string& bytes);

struct Merge {
  int32_t left = 0, right = 0, merged = 0;
};

class Bpe {
 public:
  // byte_tokens[b] is the token of the single byte b. A merge's rank is its index; when a pair is
  // listed twice the later entry wins, as in HF tokenizers.
  Bpe(const std::array<int32_t, 256>& byte_tokens, const std::vector<Merge>& merges);

  // Appends the tokens of one pre-tokenized word, given as raw bytes.
  void encode(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Slot {
    uint64_t key;  // left << 32 | right; kEmpty when unused
    int32_t rank, merged;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static constexpr size_t kMaxCachedWord = 256;  // bytes; longer words are rare and merged anew
  static constexpr size_t kCacheCapacity = 1 << 16;

  const Slot* find(int32_t left, int32_t right) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_tokens_;
  std::vector<Slot> table_;  // open addressing, power-of-two size
  uint64_t mask_ = 0;
  // Word -> tokens. Filled until full, then only read (like HF's BPE cache); shared between threads.
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace qinfer::tokenizer
