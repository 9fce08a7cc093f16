// The scheduling policy and the block manager on their own, with no model: the plans they make step
// by step, the blocks and slots they hand out, preemption, forks and cancellation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace qinfer::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(BlockManager, HoldsReleasesAndSharesWholeBlocks) {
  BlockManager m(10, 4, 2);
  SequenceCache a;
  EXPECT_TRUE(m.hold(a, 9)) << "a fresh slot";
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(a.slot, 0);
  EXPECT_FALSE(m.hold(a, 12)) << "the same slot, no new block for tokens 9..12";
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(m.free_blocks(), 7);
  a.cached = 9;
  SequenceCache b = m.fork(a, 8);
  EXPECT_THAT(b.blocks, ElementsAre(a.blocks[0], a.blocks[1]));
  EXPECT_EQ(b.cached, 8);
  EXPECT_EQ(b.slot, 1);
  EXPECT_EQ(m.refcount(a.blocks[0]), 2);
  EXPECT_EQ(m.refcount(a.blocks[2]), 1);
  EXPECT_THROW(m.fork(a, 6), Error) << "a partial block is never shared";
  m.release(a);
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(a.slot, -1);
  EXPECT_EQ(m.used_blocks(), 2) << "b still holds the shared ones";
  EXPECT_EQ(m.used_slots(), 1);
  m.release(b);
  EXPECT_EQ(m.used_blocks(), 0);
  EXPECT_EQ(m.used_slots(), 0);
}

TEST(BlockManager, ExhaustionTakesNothingAndSaysWhy) {
  BlockManager m(3, 4, 0);
  SequenceCache a;
  EXPECT_FALSE(m.hold(a, 8)) << "no state: no slot";
  EXPECT_EQ(a.slot, -1);
  SequenceCache b;
  EXPECT_FALSE(m.can_hold(b, 8));
  try {
    m.hold(b, 8);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("KV cache exhausted"));
  }
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(m.free_blocks(), 1);
  EXPECT_THROW(BlockManager(0, 4, 1), Error);
}

// The prefix cache: released whole blocks stay cached and count as free; a later sequence that spells
// the same path takes them (a reference each); a different run ends the match; when the free list
// runs dry the least recently used leaf goes first, so a path never loses its middle.
TEST(BlockManager, PrefixCacheMatchesWholeBlocksAndEvictsLeastRecentlyUsedLeaves) {
  BlockManager m(6, 4, 0, true);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  SequenceCache a;
  m.hold(a, 10);
  a.cached = 10;
  m.publish(a, t, 0);
  EXPECT_EQ(m.cached_blocks(), 2) << "the two whole blocks";
  const std::vector<int32_t> a_blocks = a.blocks;
  m.release(a);
  EXPECT_EQ(m.free_blocks(), 6) << "cached and unheld: free";
  EXPECT_EQ(m.used_blocks(), 0);
  EXPECT_EQ(m.cached_blocks(), 2);

  EXPECT_THAT(m.match(t, 2), ElementsAre(a_blocks[0], a_blocks[1]));
  EXPECT_EQ(m.refcount(a_blocks[0]), 1);
  EXPECT_EQ(m.free_blocks(), 4);
  EXPECT_THAT(m.match(t, 1), ElementsAre(a_blocks[0])) << "at most max_blocks";
  EXPECT_EQ(m.refcount(a_blocks[0]), 2);
  SequenceCache held{{a_blocks[0], a_blocks[0], a_blocks[1]}, 8, -1};
  m.release(held);
  const std::vector<int32_t> other = {1, 2, 3, 4, 9, 9, 9, 9};
  EXPECT_THAT(m.match(other, 2), ElementsAre(a_blocks[0])) << "the second run differs";
  SequenceCache b{{a_blocks[0]}, 4, -1};
  m.release(b);
  EXPECT_TRUE(m.match({5, 6, 7, 8}, 1).empty()) << "a run is found only under its own path";

  // Four fresh blocks exhaust the free list; the fifth and sixth evict the leaf, then its parent.
  SequenceCache c;
  m.hold(c, 16);
  EXPECT_EQ(m.evictions(), 0);
  EXPECT_EQ(m.free_blocks(), 2);
  m.hold(c, 20);
  EXPECT_EQ(m.evictions(), 1);
  EXPECT_EQ(c.blocks.back(), a_blocks[1]) << "the leaf goes first";
  EXPECT_THAT(m.match(t, 2), ElementsAre(a_blocks[0])) << "its parent is still cached";
  SequenceCache d{{a_blocks[0]}, 4, -1};
  m.release(d);
  m.hold(c, 24);
  EXPECT_EQ(c.blocks.back(), a_blocks[0]);
  EXPECT_EQ(m.cached_blocks(), 0);
  EXPECT_EQ(m.free_blocks(), 0);
  m.release(c);
  EXPECT_EQ(m.free_blocks(), 6);
}

// A block already cached under the same path by another block is not cached twice; a model with
// recurrent state keeps no prefix cache at all.
TEST(BlockManager, PrefixCacheKeepsOneBlockPerPathAndNoneWithState) {
  BlockManager m(8, 4, 0, true);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  SequenceCache a, b;
  m.hold(a, 8);
  m.hold(b, 8);
  a.cached = b.cached = 8;
  m.publish(a, t, 0);
  m.publish(b, t, 0);
  EXPECT_EQ(m.cached_blocks(), 2);
  m.release(a);
  m.release(b);
  EXPECT_EQ(m.free_blocks(), 8);
  EXPECT_EQ(m.match(t, 2).size(), 2u);

  BlockManager hybrid(8, 4, 2, true);
  EXPECT_FALSE(hybrid.prefix_caching());
  SequenceCache h;
  hybrid.hold(h, 8);
  h.cached = 8;
  hybrid.publish(h, t, 0);
  EXPECT_EQ(hybrid.cached_blocks(), 0);
  hybrid.release(h);
  EXPECT_TRUE(hybrid.match(t, 2).empty());
}

// A model-free harness: requests as sequences, plans run by feeding back a token per sampling chunk.
class Harness {
 public:
  Harness(int64_t blocks, int32_t block_size, int64_t slots, SchedulerConfig config)
      : blocks(blocks, block_size, slots), scheduler(config, this->blocks) {}

  void add(uint64_t id, int32_t prompt, int32_t max_tokens, int32_t n = 1, std::vector<int32_t> stop_ids = {}) {
    limits[id] = SequenceLimits{max_tokens, 1 << 20, std::move(stop_ids)};
    auto s = std::make_unique<Sequence>();
    s->request = id;
    s->tokens.assign(static_cast<size_t>(prompt), 1);
    s->prompt_tokens = prompt;
    s->limits = &limits[id];
    s->forks = n - 1;
    if (n > 1) s->fork_at = (prompt - 1) / blocks.block_size() * blocks.block_size();
    scheduler.add(std::move(s));
  }

  // One step, every sampled id `token`; what finished is recorded.
  StepPlan step(int32_t token = 7) {
    StepPlan plan = scheduler.schedule();
    last = plan;  // the chunk sizes, for the test to read (the sequences may be gone afterwards)
    chunks.clear();
    for (const auto& c : plan.chunks) chunks.push_back({c.sequence->request, c.sequence->choice, c.tokens, c.samples});
    std::vector<int32_t> ids(static_cast<size_t>(plan.sampled_rows()), token);
    for (const SampledToken& t : scheduler.postprocess(plan, ids)) {
      ++generated[std::pair(t.request, t.choice)];
      if (!t.finish_reason.empty()) finished[std::pair(t.request, t.choice)] = t.finish_reason;
    }
    return plan;
  }

  std::string reason(uint64_t request, int32_t choice) { return finished[{request, choice}]; }
  int count(uint64_t request, int32_t choice) { return generated[{request, choice}]; }

  struct Chunk {
    uint64_t request;
    int32_t choice, tokens;
    bool samples;
    bool operator==(const Chunk&) const = default;
  };

  BlockManager blocks;
  Scheduler scheduler;
  std::map<uint64_t, SequenceLimits> limits;
  StepPlan last;
  std::vector<Chunk> chunks;
  std::map<std::pair<uint64_t, int32_t>, int> generated;
  std::map<std::pair<uint64_t, int32_t>, std::string> finished;
};

// Admission is first come first served under max_running; prefill chunks share the token budget,
// oldest first; decodes come first in every step; a request waits until a running place frees.
TEST(Scheduler, AdmissionBudgetsAndDecodesFirst) {
  Harness h(64, 4, 4, {.max_running = 2, .step_token_budget = 8});
  h.add(1, 10, 3);
  h.add(2, 10, 3);
  h.add(3, 2, 1);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 8, false}));
  EXPECT_EQ(h.scheduler.counts().running, 2);
  EXPECT_EQ(h.scheduler.counts().waiting, 1);
  EXPECT_EQ(h.last.zero_slots.size(), 1u) << "request 1's new slot";
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 2, true}, Harness::Chunk{2, 0, 6, false}));
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 1, true}, Harness::Chunk{2, 0, 4, true}));
  h.step();  // request 1's third token: it finishes; request 3 is admitted next step
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 1, true}, Harness::Chunk{2, 0, 1, true}));
  EXPECT_EQ(h.reason(1, 0), "length");
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{2, 0, 1, true}, Harness::Chunk{3, 0, 2, true}));
  EXPECT_EQ(h.reason(2, 0), "length");
  EXPECT_EQ(h.reason(3, 0), "length");
  EXPECT_TRUE(h.scheduler.idle());
  EXPECT_TRUE(h.scheduler.schedule().empty());
  EXPECT_EQ(h.blocks.used_blocks(), 0);
  EXPECT_EQ(h.blocks.used_slots(), 0);
}

// Too few blocks for the load: the youngest is preempted, goes back to the front of the queue and
// recomputes its prompt + generated tokens; every request still finishes with all its tokens.
TEST(Scheduler, PreemptionRecomputesAndEveryoneFinishes) {
  Harness h(6, 4, 3, {.max_running = 3, .step_token_budget = 16});
  for (uint64_t id = 1; id <= 3; ++id) h.add(id, 5, 8);
  int64_t most_tokens = 0;
  for (int i = 0; i < 200 && !h.scheduler.idle(); ++i) {
    h.step();
    most_tokens = std::max(most_tokens, h.last.tokens());
    EXPECT_LE(h.blocks.used_blocks(), 6);
  }
  EXPECT_TRUE(h.scheduler.idle());
  EXPECT_GT(h.scheduler.counts().preemptions, 0);
  for (uint64_t id = 1; id <= 3; ++id) {
    EXPECT_EQ(h.count(id, 0), 8) << "request " << id;
    EXPECT_EQ(h.reason(id, 0), "length");
  }
  EXPECT_GT(most_tokens, 5) << "a recompute prefills prompt + generated tokens";
  EXPECT_EQ(h.blocks.used_blocks(), 0);
  EXPECT_EQ(h.blocks.used_slots(), 0);
}

// n = 3 from a 10-token prompt in blocks of 4: choice 0 prefills 8 tokens, then choices 1 and 2 branch
// off sharing those two blocks, with a copy of choice 0's state, and each prefills the 2-token tail.
TEST(Scheduler, ForksShareThePromptsWholeBlocks) {
  Harness h(32, 4, 4, {.max_running = 4, .step_token_budget = 32});
  h.add(1, 10, 2, 3);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 8, false}));
  EXPECT_EQ(h.scheduler.counts().running, 3) << "the branches run once the shared part is cached";
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 2, true}, Harness::Chunk{1, 1, 2, true},
                                    Harness::Chunk{1, 2, 2, true}));
  ASSERT_EQ(h.last.copy_slots.size(), 2u);
  EXPECT_EQ(h.last.copy_slots[0].first, h.last.copy_slots[1].first) << "both copy choice 0's state";
  EXPECT_EQ(h.last.zero_slots.size(), 0u) << "a branch's slot is copied into, not zeroed";
  EXPECT_EQ(h.blocks.used_blocks(), 2 + 3) << "two shared blocks and one tail block per choice";
  h.step();
  EXPECT_EQ(h.finished.size(), 3u);
  EXPECT_EQ(h.blocks.used_blocks(), 0);
  EXPECT_EQ(h.blocks.used_slots(), 0);
}

// A stop id ends a choice without joining its tokens; max_tokens ends it with "length".
TEST(Scheduler, StopIdsAndLength) {
  Harness h(32, 4, 0, {.max_running = 2, .step_token_budget = 16});
  h.add(1, 3, 10, 1, {9});
  h.add(2, 3, 2);
  h.step(5);
  h.step(9);
  EXPECT_EQ(h.reason(1, 0), "stop");
  EXPECT_EQ(h.reason(2, 0), "length");
  EXPECT_EQ(h.count(1, 0), 2);
  EXPECT_TRUE(h.scheduler.idle());
}

// finish() ends a request wherever its sequences are (running, waiting, not yet branched), frees
// everything, and names the choices it ended; one choice alone can be ended too.
TEST(Scheduler, CancellationFreesEverything) {
  Harness h(32, 4, 4, {.max_running = 3, .step_token_budget = 4});
  h.add(1, 10, 5, 3);  // choice 0 prefills first; its branches do not exist yet
  h.add(2, 3, 5);
  h.add(3, 3, 5);
  h.step();
  EXPECT_THAT(h.scheduler.finish(1), ElementsAre(0, 1, 2));
  EXPECT_THAT(h.scheduler.finish(1), ElementsAre()) << "unknown now";
  h.step();
  EXPECT_THAT(h.scheduler.finish(2, 0), ElementsAre(0));
  EXPECT_THAT(h.scheduler.finish(3), ElementsAre(0));
  EXPECT_TRUE(h.scheduler.idle());
  EXPECT_EQ(h.blocks.used_blocks(), 0);
  EXPECT_EQ(h.blocks.used_slots(), 0);
}

// The recorded decode batch sizes: the ladder, ending at max_batch; padding stays under a third.
TEST(DecodeBuckets, LadderAndPadding) {
  EXPECT_THAT(decode_buckets(256), ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256));
  EXPECT_THAT(decode_buckets(1), ElementsAre(1));
  EXPECT_THAT(decode_buckets(50), ElementsAre(1, 2, 4, 8, 16, 24, 32, 48, 50));
  EXPECT_EQ(decode_padding(256), 63);
  EXPECT_EQ(decode_padding(1), 0);
  EXPECT_EQ(decode_padding(50), 15);
  // Block-table widths (blocks of 16): up to 4096 tokens, then up to the context within 1M entries.
  EXPECT_THAT(decode_widths(256, 40960, 16), ElementsAre(256, 2560));
  EXPECT_THAT(decode_widths(256, 262144, 16), ElementsAre(256, 4096));
  EXPECT_THAT(decode_widths(1, 262144, 16), ElementsAre(256, 16384));
  EXPECT_THAT(decode_widths(8, 2048, 16), ElementsAre(128));
}

TEST(Scheduler, BadConfigIsAnError) {
  BlockManager blocks(8, 4, 0);
  EXPECT_THROW(Scheduler({.max_running = 0}, blocks), Error);
  try {
    Scheduler({.max_running = 64, .step_token_budget = 32}, blocks);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("step_token_budget"));
  }
}

}  // namespace
}  // namespace qinfer::engine
