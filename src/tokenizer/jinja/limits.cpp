#include "tokenizer/jinja/limits.h"

#include "tokenizer/jinja/error.h"

namespace qinfer::jinja {

Budget::Budget(const Limits& limits)
    : max_steps_(limits.max_steps), bytes_left_(limits.max_bytes), max_bytes_(limits.max_bytes), previous_(current_) {
  current_ = this;
}

Budget::~Budget() { current_ = previous_; }

// steps_ stays past the limit, so a caller that swallows this error (a lazy filter) fails again
// at its next step.
void Budget::steps_exceeded() const {
  raise(ErrorKind::limit, "the template exceeded its step limit ({} evaluation steps); does a loop never end?",
        max_steps_);
}

void Budget::bytes_exceeded() const {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  raise(ErrorKind::limit, "the template exceeded its memory limit ({} of strings, lists and output)",
        max_bytes_ % kMiB == 0 ? fmt::format("{} MiB", max_bytes_ / kMiB) : fmt::format("{} bytes", max_bytes_));
}

}  // namespace qinfer::jinja
