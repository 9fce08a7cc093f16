#pragma once
// Step and memory limits of one render, so that a hostile or broken template can neither hang nor
// exhaust the process. Exceeding one raises Error(limit) naming the limit and the template line.
#include <cstddef>
#include <cstdint>

namespace qinfer::jinja {

struct Limits {
  // Evaluation steps: statements, expressions, loop iterations, and the per-element work of
  // builtins (a list item, or kScanBytesPerStep bytes of a string scanned). Real chat templates
  // take well under a million even for hundreds of messages and dozens of tools.
  uint64_t max_steps = 20'000'000;
  // Bytes of the strings, lists and dicts the render creates plus its output. Counted when created
  // and never given back, so it bounds what the render holds at once (within about 2x: a growing
  // string reallocates).
  uint64_t max_bytes = uint64_t{256} << 20;
};

// Bytes of a string scanned per step: about what one evaluation step costs.
constexpr size_t kScanBytesPerStep = 64;
// What a new string, list or dict costs beyond its contents (control block, allocator header).
constexpr uint64_t kValueOverhead = 64;
constexpr uint64_t kDictEntryBytes = 160;  // the entry, plus the key's node in the string index

// The budget of the render running on this thread. Builtins reach it through the free functions
// below instead of a parameter, so values built anywhere during a render are counted.
class Budget {
 public:
  explicit Budget(const Limits& limits);  // becomes this thread's budget
  ~Budget();                              // restores the one before
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  void step() {
    if (++steps_ > max_steps_) steps_exceeded();
  }
  void steps(uint64_t n) {
    steps_ += n;
    if (steps_ > max_steps_) steps_exceeded();
  }
  // For what has been (or is about to be) allocated.
  void charge(uint64_t bytes) {
    if (bytes > bytes_left_) bytes_exceeded();
    bytes_left_ -= bytes;
  }
  // Before building something large (it is charged once built): refuses it before it is allocated.
  void ensure(uint64_t bytes) const {
    if (bytes > bytes_left_) bytes_exceeded();
  }

  static Budget* current() { return current_; }

 private:
  [[noreturn]] void steps_exceeded() const;
  [[noreturn]] void bytes_exceeded() const;

  uint64_t steps_ = 0, max_steps_, bytes_left_, max_bytes_;
  Budget* previous_;
  inline static thread_local Budget* current_ = nullptr;
};

// Outside a render (building a context, tests calling builtins) these do nothing.
inline void count_steps(uint64_t n) {
  if (Budget* b = Budget::current()) b->steps(n);
}
inline void count_scan(size_t bytes) {
  if (bytes >= kScanBytesPerStep) count_steps(bytes / kScanBytesPerStep);
}
inline void charge_bytes(uint64_t bytes) {
  if (Budget* b = Budget::current()) b->charge(bytes);
}
inline void ensure_bytes(uint64_t bytes) {
  if (Budget* b = Budget::current()) b->ensure(bytes);
}

}  // namespace qinfer::jinja
