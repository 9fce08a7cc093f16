#pragma once
// Continuous-batching policy, with no model: which sequences run in the next forward and how many
// tokens each, who waits, who is preempted, when the choices of an n > 1 request branch off. The
// engine asks schedule() for a step plan, the model runner runs it, and postprocess() takes the
// sampled ids. Unit-tested on its own (tests/engine/scheduler_test.cpp).
//
// The policy:
// - Admission is strictly first come, first served: the head of the queue waits until there is a
//   running place for all its choices and (unless nothing runs) free KV blocks for its tokens.
// - Each step: every running decode (one token each, oldest first), then prefill chunks of the
//   others, oldest first, under step_token_budget and the free blocks.
// - When a decode needs a block and none is free, the youngest running sequence is preempted by
//   recompute: its blocks and slot are freed and it goes back to the front of the queue with its
//   prompt + generated tokens, to be prefilled again (the seed, step and history travel with it).
// - n > 1: choice 0 prefills the prompt up to its last whole block before the last prompt token;
//   choices 1..n-1 then share those blocks (reference counts) and a copy of the recurrent state, and
//   each prefills the short tail itself into a block of its own.
// - With a prefix cache (BlockManager), an admitted sequence (a preempted one too) starts from the
//   longest cached path of whole blocks its tokens spell, short of its last token; every block a
//   step fills is published to the cache.
// - A request for prompt logprobs needs the logits of every prompt position: its prefill reuses no
//   cached prefix, returns each chunk's rows (at most prompt_rows_budget positions a step), and its
//   choices do not share the prompt (each computes, and is given, its own).
// - A model with recurrent state starts there only from a checkpoint of the state (its slot is a
//   copy of it) and keeps checkpoints as it goes (at a chunk's start, the state it leaves behind, and
//   one inside it or at its end): where the cached path it followed went on past the checkpoint it
//   started from (the junction), at every multiple of checkpoint_interval tokens, and after its last
//   whole block before its last token.
//   Each step that starts on another block boundary writes the state into the sequence's rolling
//   slot and leaves the state it read behind (no copy: the two slots swap), so the rolling slot
//   holds the state at the last boundary passed; it is attached when the sequence finishes or is
//   preempted (its live slot instead, when it stops on a boundary), and the next turn of a
//   conversation, or its own recompute, resumes there.
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace qinfer::engine {

struct SchedulerConfig {
  int32_t max_running = 64;          // sequences in the running set (decoding or prefilling)
  int32_t step_token_budget = 2048;  // tokens one forward may carry; at least max_running
  int32_t checkpoint_interval = 0;   // tokens between a prefill's state checkpoints (0: none between)
  // Prompt positions whose whole logits rows (prompt logprobs) one step may return: at 151,936
  // columns, 512 rows are 311 MB of f32 on the device and again on the host.
  int32_t prompt_rows_budget = 512;
};

// One forward: each chunk reads tokens [cache.cached, cache.cached + tokens) of its sequence.
struct StepPlan {
  struct Chunk {
    Sequence* sequence = nullptr;
    int32_t tokens = 0;
    bool samples = false;  // the chunk ends the sequence's uncached tokens: a token is sampled from it
    bool prompt_rows = false;  // the logits of each of its positions come back (prompt logprobs)
    // The forward writes the sequence's state here instead of its slot, leaving the state it started
    // from there (-1: in place): attached as a checkpoint (`keep_start`), or the sequence's slot and
    // rolling slot swap.
    int32_t state_to = -1;
    bool keep_start = false;
    // The forward also leaves the state after the chunk's first save_at tokens in this checkpoint,
    // attached at once (-1: none).
    int32_t save_to = -1, save_at = 0;
  };
  std::vector<Chunk> chunks;  // the decodes first, then the prefill chunks
  // Before the forward, in order: slots to zero (from -1) and copies of recurrent state from one
  // slot into another (a fork's branch, a sequence starting from a checkpoint), and the host tier's
  // copies of blocks and checkpoints (BlockManager).
  using SlotWork = CacheWork;
  std::vector<SlotWork> slot_work;

  bool empty() const { return chunks.empty(); }
  int32_t sampled_rows() const;
  int64_t tokens() const;
  // Every chunk a one-token decode: the step's shape repeats and may be replayed as a graph.
  bool decode_only() const;
};

// What postprocess() did with one sampled id.
struct SampledToken {
  uint64_t request = 0;
  int32_t choice = 0;
  int32_t token = 0;
  int32_t row = 0;               // the sampling row it came from (the plan's sampled chunks in order)
  bool stop_id = false;          // a stop id: not part of the output
  std::string finish_reason;     // empty while the choice goes on; "stop" (stop id, complete grammar),
                                 // "length", or "error" (error says why)
  std::string error;
  int32_t cached_prompt_tokens = 0;
};

struct SchedulerCounts {
  int64_t running = 0, waiting = 0;  // sequences
  int64_t preemptions = 0;
  int64_t reused_tokens = 0;  // tokens admitted sequences took from the prefix cache instead of computing
  int64_t prefix_hits = 0, prefix_misses = 0;  // admissions (with a prefix cache) that reused tokens, or none
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  // Queues a request's first choice (its forks come later): the engine checked that it can ever fit.
  void add(std::unique_ptr<Sequence> sequence);
  // Admits what fits and plans the next forward; empty when nothing can run.
  StepPlan schedule();
  // After the plan's forward: advances every chunk's cache, appends the sampled ids (`sampled`: one
  // per sampling chunk, in plan order), finishes choices at a stop id or their length, branches forks.
  std::vector<SampledToken> postprocess(const StepPlan& plan, const std::vector<int32_t>& sampled);
  // Ends a request's sequences (every choice) or one choice of it, wherever they are (cancelled, failed,
  // stopped by a stop string); their blocks and slots are free afterwards. Returns the choices it ended
  // (none when the request is unknown): the engine tells their sinks why.
  // `keep_cache` false: their caches may be half-written (a failed step), and leave nothing behind.
  std::vector<int32_t> finish(uint64_t request, int32_t choice = -1, bool keep_cache = true);
  // The requests with a chunk in `plan`, each once.
  static std::vector<uint64_t> requests_of(const StepPlan& plan);

  SchedulerCounts counts() const;
  bool idle() const { return running_.empty() && waiting_.empty(); }
  // Requests that have sequences in the queue or the running set.
  std::vector<uint64_t> requests() const;

 private:
  void admit();
  void reuse_prefix(Sequence& s);
  bool make_room(Sequence& s);
  void preempt(Sequence& s);
  // Branches parent's forks off; their state copies go to `copies` (none: at admission, where a
  // parent with state has computed nothing yet).
  void fork(Sequence& parent);
  void hold(Sequence& s, int64_t tokens);
  // Where a step taking `s` to `end` tokens saves its state (the chunk's state_to and save_to).
  void plan_checkpoint(Sequence& s, int64_t end, StepPlan::Chunk& chunk);
  // The first position past `cached` where s's prefill keeps a checkpoint (0: none), and whether it
  // keeps one at `position`.
  int64_t next_checkpoint(const Sequence& s, int64_t cached) const;
  bool checkpoint_at(const Sequence& s, int64_t position) const;
  bool checkpoints() const { return blocks_.total_checkpoints() > 0; }
  // Releases s's blocks and slot, attaching its rolling checkpoint first (unless `keep_cache` is false).
  void let_go(Sequence& s, bool keep_cache = true);
  Sequence* youngest_running();
  void requeue_preempted();

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order: the last is the youngest
  int64_t preemptions_ = 0, reused_tokens_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace qinfer::engine
