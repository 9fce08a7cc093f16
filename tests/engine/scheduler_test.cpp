// The scheduling policy and the block manager on their own, with no model: the plans they make step
// by step, the blocks and slots they hand out, preemption, forks and cancellation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

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

  EXPECT_THAT(m.match(t, 2).blocks, ElementsAre(a_blocks[0], a_blocks[1]));
  EXPECT_EQ(m.refcount(a_blocks[0]), 1);
  EXPECT_EQ(m.free_blocks(), 4);
  EXPECT_THAT(m.match(t, 1).blocks, ElementsAre(a_blocks[0])) << "at most max_blocks";
  EXPECT_EQ(m.refcount(a_blocks[0]), 2);
  SequenceCache held{{a_blocks[0], a_blocks[0], a_blocks[1]}, 8, -1};
  m.release(held);
  const std::vector<int32_t> other = {1, 2, 3, 4, 9, 9, 9, 9};
  EXPECT_THAT(m.match(other, 2).blocks, ElementsAre(a_blocks[0])) << "the second run differs";
  SequenceCache b{{a_blocks[0]}, 4, -1};
  m.release(b);
  EXPECT_TRUE(m.match({5, 6, 7, 8}, 1).blocks.empty()) << "a run is found only under its own path";

  // Four fresh blocks exhaust the free list; the fifth and sixth evict the leaf, then its parent.
  SequenceCache c;
  m.hold(c, 16);
  EXPECT_EQ(m.evictions(), 0);
  EXPECT_EQ(m.free_blocks(), 2);
  m.hold(c, 20);
  EXPECT_EQ(m.evictions(), 1);
  EXPECT_EQ(c.blocks.back(), a_blocks[1]) << "the leaf goes first";
  EXPECT_THAT(m.match(t, 2).blocks, ElementsAre(a_blocks[0])) << "its parent is still cached";
  SequenceCache d{{a_blocks[0]}, 4, -1};
  m.release(d);
  m.hold(c, 24);
  EXPECT_EQ(c.blocks.back(), a_blocks[0]);
  EXPECT_EQ(m.cached_blocks(), 0);
  EXPECT_EQ(m.free_blocks(), 0);
  m.release(c);
  EXPECT_EQ(m.free_blocks(), 6);
}

// A block already cached under the same path by another block is not cached twice: the second
// sequence's copy is swapped for the cached one and freed. A model with recurrent state keeps no
// prefix cache without checkpoints.
TEST(BlockManager, PrefixCacheKeepsOneBlockPerPathAndNoneWithStateWithoutCheckpoints) {
  BlockManager m(8, 4, 0, true);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  SequenceCache a, b;
  m.hold(a, 8);
  m.hold(b, 8);
  a.cached = b.cached = 8;
  m.publish(a, t, 0);
  m.publish(b, t, 0);
  EXPECT_EQ(m.cached_blocks(), 2);
  EXPECT_EQ(b.blocks, a.blocks) << "swapped for the cached blocks";
  EXPECT_EQ(m.used_blocks(), 2) << "b's own copies are free";
  EXPECT_EQ(m.refcount(a.blocks[0]), 2);
  m.release(a);
  m.release(b);
  EXPECT_EQ(m.free_blocks(), 8);
  EXPECT_EQ(m.match(t, 2).blocks.size(), 2u);

  BlockManager hybrid(8, 4, 2, true);
  EXPECT_FALSE(hybrid.prefix_caching());
  EXPECT_EQ(hybrid.total_checkpoints(), 0);
  SequenceCache h;
  hybrid.hold(h, 8);
  h.cached = 8;
  hybrid.publish(h, t, 0);
  EXPECT_EQ(hybrid.cached_blocks(), 0);
  hybrid.release(h);
  EXPECT_TRUE(hybrid.match(t, 2).blocks.empty());
}

// With state: a match reuses the path only up to its deepest checkpoint, says how far the path went
// on, and names the checkpoint's slot (past the sequences' slots); checkpoints go with their
// block's eviction, the least recently used first when the pool is dry, and a rolling one may take
// at most half the pool.
TEST(BlockManager, CheckpointsBoundWhatAModelWithStateReuses) {
  BlockManager m(8, 4, 2, true, 2);
  ASSERT_TRUE(m.prefix_caching());
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  SequenceCache a;
  m.hold(a, 13);
  a.cached = 12;
  m.publish(a, t, 0);
  EXPECT_EQ(m.cached_blocks(), 3);
  EXPECT_TRUE(m.match(t, 3).blocks.empty()) << "no checkpoint yet: nothing to start from";
  EXPECT_EQ(m.match(t, 3).path_blocks, 3);
  const int32_t c = m.take_checkpoint(false);
  EXPECT_EQ(c, 2) << "checkpoint slots follow the sequences' two";
  m.attach_checkpoint(a, 1, c, false);
  EXPECT_EQ(m.attached_checkpoints(), 1);
  m.release(a);

  BlockManager::Match hit = m.match(t, 3);
  EXPECT_EQ(hit.blocks.size(), 1u) << "up to the checkpoint after the first block";
  EXPECT_EQ(hit.checkpoint, c);
  EXPECT_EQ(hit.path_blocks, 3);
  SequenceCache b{hit.blocks, 4, -1};
  m.release(b);

  // The rolling one takes the second slot; a third (not rolling) evicts the attached one.
  const int32_t rolling = m.take_checkpoint(true);
  EXPECT_EQ(rolling, 3);
  EXPECT_EQ(m.take_checkpoint(true), -1) << "rolling ones take at most half the pool";
  EXPECT_EQ(m.take_checkpoint(false), c) << "the least recently used attached one";
  EXPECT_EQ(m.checkpoint_evictions(), 1);
  EXPECT_EQ(m.attached_checkpoints(), 0);
  EXPECT_EQ(m.take_checkpoint(false), -1) << "none left: both are being written";
  m.drop_checkpoint(rolling, true);
  m.drop_checkpoint(c, false);

  // Evicting a block frees its checkpoint.
  SequenceCache d;
  m.hold(d, 4);
  d.cached = 4;
  m.publish(d, t, 0);
  m.attach_checkpoint(d, 1, m.take_checkpoint(false), false);
  EXPECT_EQ(m.attached_checkpoints(), 1);
  m.release(d);
  SequenceCache e;
  m.hold(e, 32);  // every block: the cached ones are evicted
  EXPECT_EQ(m.cached_blocks(), 0);
  EXPECT_EQ(m.attached_checkpoints(), 0);
  m.release(e);
  EXPECT_NE(m.take_checkpoint(false), -1);
}

// The host tier: evicted blocks are copied out (save_block, before the block is reused), and a match
// that runs out of device nodes brings their copies back (load_block into blocks whose own contents
// were saved first), in order; what comes back is a node again and counts as reused.
TEST(BlockManager, HostTierSavesEvictedBlocksAndBringsThemBack) {
  BlockManager m(4, 4, 0, /*prefix_caching=*/true, 0, /*host_blocks=*/8);
  auto run_of = [](int32_t first, int32_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
    return t;
  };
  const std::vector<int32_t> a = run_of(0, 13), b = run_of(100, 16);
  SequenceCache sa;
  m.hold(sa, 12);
  sa.cached = 12;
  m.publish(sa, a, 0);
  const std::vector<int32_t> a_blocks = sa.blocks;
  m.release(sa);
  EXPECT_TRUE(m.take_work().empty()) << "nothing evicted yet";
  SequenceCache sb;
  m.hold(sb, 16);  // one free block and a's three, evicted leaf first
  std::vector<CacheWork> work = m.take_work();
  ASSERT_EQ(work.size(), 3u);
  for (const CacheWork& w : work) EXPECT_EQ(w.kind, CacheWork::Kind::save_block);
  EXPECT_EQ(work[0].from, a_blocks[2]) << "the leaf first";
  EXPECT_EQ(m.host_blocks(), 3);
  sb.cached = 16;
  m.publish(sb, b, 0);
  m.release(sb);

  const BlockManager::Match hit = m.match(a, 3);
  ASSERT_EQ(hit.blocks.size(), 3u);
  EXPECT_EQ(hit.path_blocks, 3);
  work = m.take_work();
  std::set<int32_t> saved;
  int loads = 0;
  for (const CacheWork& w : work) {
    if (w.kind == CacheWork::Kind::save_block) saved.insert(w.from);
    if (w.kind != CacheWork::Kind::load_block) continue;
    ++loads;
    EXPECT_TRUE(saved.contains(w.to)) << "block " << w.to << " is saved before it is loaded into";
    EXPECT_EQ(w.to, hit.blocks[static_cast<size_t>(loads - 1)]);
  }
  EXPECT_EQ(loads, 3);
  EXPECT_EQ(m.host_loaded_blocks(), 3);
  EXPECT_EQ(m.host_blocks(), 6) << "b's three blocks went out; a's copies stay";
  EXPECT_EQ(m.cached_blocks(), 4);
  SequenceCache again{hit.blocks, 12, -1};
  m.release(again);
  // Matched again, a is on the device: no copies.
  const BlockManager::Match second = m.match(a, 3);
  EXPECT_EQ(second.blocks, hit.blocks);
  EXPECT_TRUE(m.take_work().empty());
  SequenceCache done{second.blocks, 12, -1};
  m.release(done);
  // Pushed out again, a's blocks need no save (their copies are there); b's first block, the one b
  // left on the device, is saved.
  SequenceCache sc;
  m.hold(sc, 16);
  work = m.take_work();
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].kind, CacheWork::Kind::save_block);
  EXPECT_EQ(std::count(hit.blocks.begin(), hit.blocks.end(), work[0].from), 0) << "not one of a's";
  EXPECT_EQ(m.host_blocks(), 7);
  m.release(sc);
}

// A model with state: a block's checkpoint goes to the host with it and comes back into a checkpoint
// slot, which the match then names (its state is loaded before the sequence's slot copies it).
TEST(BlockManager, HostTierKeepsCheckpointsWithTheirBlocks) {
  BlockManager m(4, 4, 2, /*prefix_caching=*/true, /*checkpoints=*/2, /*host_blocks=*/8, /*host_checkpoints=*/4);
  std::vector<int32_t> a(9), b(16);
  for (int32_t i = 0; i < 9; ++i) a[static_cast<size_t>(i)] = i;
  for (int32_t i = 0; i < 16; ++i) b[static_cast<size_t>(i)] = 200 + i;
  SequenceCache sa;
  m.hold(sa, 8);
  sa.cached = 8;
  m.publish(sa, a, 0);
  const int32_t checkpoint = m.take_checkpoint(false);
  ASSERT_GE(checkpoint, 0);
  m.attach_checkpoint(sa, 2, checkpoint, false);
  m.release(sa);
  (void)m.take_work();
  SequenceCache sb;
  m.hold(sb, 16);
  std::vector<CacheWork> work = m.take_work();
  EXPECT_TRUE(std::any_of(work.begin(), work.end(), [&](const CacheWork& w) {
    return w.kind == CacheWork::Kind::save_state && w.from == checkpoint;
  })) << "the checkpoint goes out with its block";
  EXPECT_EQ(m.host_checkpoints(), 1);
  EXPECT_EQ(m.attached_checkpoints(), 0);
  sb.cached = 16;
  m.publish(sb, b, 0);
  m.release(sb);
  const BlockManager::Match hit = m.match(a, 2);
  ASSERT_EQ(hit.blocks.size(), 2u);
  ASSERT_GE(hit.checkpoint, 0);
  work = m.take_work();
  EXPECT_TRUE(std::any_of(work.begin(), work.end(), [&](const CacheWork& w) {
    return w.kind == CacheWork::Kind::load_state && w.to == hit.checkpoint;
  }));
  EXPECT_EQ(m.host_loaded_checkpoints(), 1);
  EXPECT_EQ(m.attached_checkpoints(), 1);
  SequenceCache held{hit.blocks, 8, -1};
  m.release(held);
}

// A model-free harness: requests as sequences, plans run by feeding back a token per sampling chunk.
class Harness {
 public:
  Harness(int64_t blocks, int32_t block_size, int64_t slots, SchedulerConfig config, int64_t checkpoints = 0)
      : blocks(blocks, block_size, slots, checkpoints > 0, checkpoints), scheduler(config, this->blocks) {}

  void add(uint64_t id, int32_t prompt, int32_t max_tokens, int32_t n = 1, std::vector<int32_t> stop_ids = {}) {
    add_tokens(id, std::vector<int32_t>(static_cast<size_t>(prompt), 1), max_tokens, n, std::move(stop_ids));
  }
  void add_tokens(uint64_t id, std::vector<int32_t> tokens, int32_t max_tokens, int32_t n = 1,
                  std::vector<int32_t> stop_ids = {}) {
    const auto prompt = static_cast<int32_t>(tokens.size());
    limits[id] = SequenceLimits{max_tokens, 1 << 20, std::move(stop_ids)};
    auto s = std::make_unique<Sequence>();
    s->request = id;
    s->tokens = std::move(tokens);
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
    saves.clear();
    for (const auto& c : plan.chunks) {
      chunks.push_back({c.sequence->request, c.sequence->choice, c.tokens, c.samples});
      // A rolling checkpoint is the state a step from a boundary leaves behind; a kept one is copied after it.
      if (c.state_to >= 0) saves.push_back({c.sequence->cache.cached, c.keep_start});
      if (c.save_to >= 0) saves.push_back({c.sequence->cache.cached + c.save_at, true});
    }
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
  std::vector<std::pair<int32_t, bool>> saves;  // (tokens the checkpoint holds the state of, kept)
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
  EXPECT_THAT(h.last.slot_work, ElementsAre(StepPlan::SlotWork{-1, 0})) << "request 1's new slot, zeroed";
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
  ASSERT_EQ(h.last.slot_work.size(), 2u) << "a branch's slot is copied into, not zeroed";
  EXPECT_EQ(h.last.slot_work[0].from, h.last.slot_work[1].from) << "both copy choice 0's state";
  EXPECT_GE(h.last.slot_work[0].from, 0);
  EXPECT_EQ(h.blocks.used_blocks(), 2 + 3) << "two shared blocks and one tail block per choice";
  h.step();
  EXPECT_EQ(h.finished.size(), 3u);
  EXPECT_EQ(h.blocks.used_blocks(), 0);
  EXPECT_EQ(h.blocks.used_slots(), 0);
}

// A request for prompt logprobs reuses no cached prefix (every position's logits are wanted), its
// chunks return their rows and stay within prompt_rows_budget, while other prefills take the rest
// of the step; a recompute after preemption returns no row twice.
TEST(Scheduler, PromptRowsChunksReuseNothingAndStayWithinTheirBudget) {
  BlockManager cached(64, 4, 0, /*prefix_caching=*/true);
  Scheduler scheduler({.max_running = 4, .step_token_budget = 32, .prompt_rows_budget = 8}, cached);
  std::vector<int32_t> prompt(21);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
  SequenceLimits plain{2, 1 << 20, {}}, rows = plain;
  rows.prompt_logprobs = 0;
  auto sequence = [&](uint64_t id, const SequenceLimits& limits) {
    auto s = std::make_unique<Sequence>();
    s->request = id;
    s->tokens = prompt;
    s->prompt_tokens = static_cast<int32_t>(prompt.size());
    s->limits = &limits;
    return s;
  };
  auto run = [&](const StepPlan& plan) {
    (void)scheduler.postprocess(plan, std::vector<int32_t>(static_cast<size_t>(plan.sampled_rows()), 7));
  };
  // A first request fills the cache with the prompt's whole blocks.
  scheduler.add(sequence(1, plain));
  while (!scheduler.idle()) run(scheduler.schedule());
  ASSERT_GT(cached.cached_blocks(), 0);

  scheduler.add(sequence(2, rows));
  scheduler.add(sequence(3, plain));
  StepPlan plan = scheduler.schedule();
  // The other request reuses the cached prefix and decodes its last prompt token first.
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].sequence->request, 3u);
  EXPECT_EQ(plan.chunks[0].sequence->cache.cached, 20);
  EXPECT_FALSE(plan.chunks[0].prompt_rows);
  EXPECT_EQ(plan.chunks[1].sequence->request, 2u);
  EXPECT_EQ(plan.chunks[1].sequence->cache.cached, 0) << "nothing reused";
  EXPECT_EQ(plan.chunks[1].tokens, 8) << "the rows budget";
  EXPECT_TRUE(plan.chunks[1].prompt_rows);
  run(plan);
  int32_t row_tokens = 8;
  while (!scheduler.idle()) {
    plan = scheduler.schedule();
    for (const StepPlan::Chunk& c : plan.chunks) {
      EXPECT_LE(c.tokens, 8);
      if (c.prompt_rows) row_tokens += c.tokens;
      if (c.sequence->request == 2 && c.tokens == 1 && c.samples) {
        EXPECT_FALSE(c.prompt_rows) << "a decode";
      }
    }
    run(plan);
  }
  EXPECT_EQ(row_tokens, 21) << "every prompt position once";

  // Preempted after its prompt: the recompute may reuse the cache, and returns no rows.
  Sequence done;
  done.limits = &rows;
  done.prompt_tokens = 21;
  done.prompt_rows_done = 20;
  EXPECT_FALSE(done.wants_prompt_rows());
  done.prompt_rows_done = 19;
  EXPECT_TRUE(done.wants_prompt_rows());
  EXPECT_THROW(Scheduler({.max_running = 1, .step_token_budget = 8, .prompt_rows_budget = 0}, cached), Error);
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

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// A model with state and a prefix cache: prefill chunks end where checkpoints are kept (every
// interval, the last whole block before the last token); a sequence that stops on a block boundary
// leaves its live state to the cache; the next turn of the conversation starts from it with a copy
// of its state and computes only what is new.
TEST(Scheduler, CheckpointsAtIntervalsPromptEndsAndFinishes) {
  Harness h(64, 4, 2, {.max_running = 2, .step_token_budget = 32, .checkpoint_interval = 8}, 8);
  std::vector<int32_t> turn = iota_tokens(14);
  h.add_tokens(1, turn, 7);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 12, false})) << "cut at the second checkpoint";
  EXPECT_THAT(h.saves, ElementsAre(std::pair(8, true))) << "inside it: the interval's";
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 2, true}));
  EXPECT_THAT(h.saves, ElementsAre(std::pair(12, true))) << "left behind: the last whole block's";
  std::vector<std::vector<std::pair<int32_t, bool>>> decode_saves;
  while (h.reason(1, 0).empty()) {
    h.step();
    decode_saves.push_back(h.saves);
  }
  // Decodes take the cache from 14 to 20 tokens: 16 is an interval's (kept: no rolling one from
  // there), and 20, where it stops, the live state's.
  using Saves = std::vector<std::pair<int32_t, bool>>;
  EXPECT_THAT(decode_saves, ElementsAre(Saves{}, Saves{{16, true}}, Saves{}, Saves{}, Saves{}, Saves{}));
  EXPECT_EQ(h.reason(1, 0), "length");
  EXPECT_EQ(h.blocks.attached_checkpoints(), 4) << "8, 12, 16 and, at the finish, 20";
  EXPECT_EQ(h.blocks.used_slots(), 0);
  EXPECT_EQ(h.blocks.free_slots(), 2) << "the live slot went to the cache, a checkpoint's took its place";

  // The next turn: the whole conversation so far (its last token was never fed back) and more.
  for (int i = 0; i < 7; ++i) turn.push_back(7);
  for (int32_t t : {500, 501, 502}) turn.push_back(t);
  h.add_tokens(2, turn, 1);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{2, 0, 4, true})) << "20 of 24 tokens cached";
  ASSERT_EQ(h.last.slot_work.size(), 1u);
  EXPECT_GE(h.last.slot_work[0].from, 0) << "a copy of the checkpoint";
  EXPECT_NE(h.last.slot_work[0].from, h.last.slot_work[0].to);
  EXPECT_EQ(h.scheduler.counts().reused_tokens, 20);
  EXPECT_EQ(h.scheduler.counts().prefix_hits, 1);
  EXPECT_EQ(h.scheduler.counts().prefix_misses, 1);
}

// A step from a block boundary past the kept checkpoints writes the state into the rolling slot and
// leaves the state it read behind: the slots swap, nothing is copied. At a finish off a boundary the
// rolling slot (the state at the last boundary passed) is attached, and the next turn resumes there.
TEST(Scheduler, RollingCheckpointIsTheStateAStepFromABoundaryLeavesBehind) {
  Harness h(64, 4, 2, {.max_running = 2, .step_token_budget = 32}, 8);
  std::vector<int32_t> turn = iota_tokens(6);
  h.add_tokens(1, turn, 9);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{1, 0, 6, true}));
  EXPECT_THAT(h.saves, ElementsAre(std::pair(4, true))) << "the last whole block before the last token";
  std::vector<std::pair<int32_t, int32_t>> swaps;  // (tokens at the step's start, slot before -> after)
  std::vector<int32_t> slots;
  while (h.reason(1, 0).empty()) {
    const StepPlan plan = h.scheduler.schedule();
    ASSERT_EQ(plan.chunks.size(), 1u);
    const StepPlan::Chunk& c = plan.chunks[0];
    EXPECT_EQ(c.save_to, -1);
    const int32_t start = c.sequence->cache.cached, slot = c.sequence->cache.slot;
    if (c.state_to >= 0) {
      EXPECT_NE(c.state_to, slot);
      swaps.push_back({start, c.state_to});
    }
    slots.push_back(slot);
    const auto out = h.scheduler.postprocess(plan, {7});
    if (!out[0].finish_reason.empty()) h.finished[{1, 0}] = out[0].finish_reason;
    else if (c.state_to >= 0) EXPECT_EQ(c.sequence->cache.slot, swaps.back().second) << "now the live slot";
  }
  // Decodes 6 -> 14: steps from 8 and 12 start on boundaries.
  ASSERT_EQ(swaps.size(), 2u);
  EXPECT_EQ(swaps[0].first, 8);
  EXPECT_EQ(swaps[1].first, 12);
  EXPECT_EQ(swaps[1].second, slots[2]) << "the second swap writes back into the slot the first left behind";
  EXPECT_EQ(h.blocks.attached_checkpoints(), 2) << "4, and 12 (the rolling one) at the finish";
  EXPECT_EQ(h.blocks.used_slots(), 0);
  EXPECT_EQ(h.blocks.free_slots(), 2);

  for (int i = 0; i < 8; ++i) turn.push_back(7);  // 14 fed tokens (the 9th reply token never was)
  turn.push_back(500);
  h.add_tokens(2, turn, 1);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{2, 0, 3, true})) << "12 of 15 tokens cached";
  ASSERT_EQ(h.last.slot_work.size(), 1u);
  EXPECT_EQ(h.last.slot_work[0].from, slots[6]) << "the checkpoint is the slot the step from 12 read";
}

// Interval checkpoints cost a long prefill no extra chunks: each chunk keeps the one at its start (the
// state it leaves behind) and one inside it, and runs the whole budget.
TEST(Scheduler, IntervalCheckpointsKeepChunksWhole) {
  Harness h(64, 4, 2, {.max_running = 2, .step_token_budget = 16, .checkpoint_interval = 8}, 16);
  h.add_tokens(1, iota_tokens(40), 1);
  std::vector<std::vector<std::pair<int32_t, bool>>> saves;
  std::vector<int32_t> chunks;
  while (h.reason(1, 0).empty()) {
    h.step();
    ASSERT_EQ(h.chunks.size(), 1u);
    chunks.push_back(h.chunks[0].tokens);
    saves.push_back(h.saves);
  }
  using Saves = std::vector<std::pair<int32_t, bool>>;
  EXPECT_THAT(chunks, ElementsAre(16, 16, 8));
  EXPECT_THAT(saves, ElementsAre(Saves{{8, true}}, Saves{{16, true}, {24, true}}, Saves{{32, true}, {36, true}}));
  EXPECT_EQ(h.blocks.attached_checkpoints(), 6) << "8, 16, 24, 32, 36 (the prompt's end) and 40 (where it stopped)";
  EXPECT_EQ(h.blocks.used_slots(), 0);
  EXPECT_EQ(h.blocks.free_slots(), 2);
}

// A request that leaves a cached path past its deepest checkpoint computes from that checkpoint and
// keeps a new one where it leaves (the junction), so the next request sharing that prefix starts there.
TEST(Scheduler, JunctionCheckpointWhereARequestLeavesACachedPath) {
  Harness h(64, 4, 2, {.max_running = 2, .step_token_budget = 32}, 8);
  h.add_tokens(1, iota_tokens(22), 1);
  h.step();
  EXPECT_THAT(h.saves, ElementsAre(std::pair(20, true))) << "no interval: only the prompt's end";
  h.step();
  std::vector<int32_t> other = iota_tokens(22);
  for (size_t i = 13; i < other.size(); ++i) other[i] = 900 + static_cast<int32_t>(i);  // leaves in block 3
  h.add_tokens(2, other, 1);
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{2, 0, 20, false})) << "no checkpoint on the path: from 0";
  EXPECT_THAT(h.saves, ElementsAre(std::pair(12, true))) << "the junction after three shared blocks";
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{2, 0, 2, true}));
  EXPECT_THAT(h.saves, ElementsAre(std::pair(20, true))) << "the prompt's end, left behind";
  h.step();
  h.add_tokens(3, iota_tokens(16), 1);  // shares the junction
  h.step();
  EXPECT_THAT(h.chunks, ElementsAre(Harness::Chunk{3, 0, 4, true})) << "12 cached, from the junction";
  EXPECT_EQ(h.scheduler.counts().reused_tokens, 12);
  EXPECT_EQ(h.blocks.used_blocks(), 0);
}

// A preempted sequence with state gives its rolling checkpoint to the cache and resumes from it.
TEST(Scheduler, PreemptedSequenceResumesFromItsCheckpoint) {
  Harness h(7, 4, 2, {.max_running = 2, .step_token_budget = 32}, 8);
  h.add_tokens(1, iota_tokens(5), 12);
  h.add_tokens(2, iota_tokens(5, 300), 12);
  for (int i = 0; i < 100 && !h.scheduler.idle(); ++i) h.step();
  EXPECT_TRUE(h.scheduler.idle());
  EXPECT_GT(h.scheduler.counts().preemptions, 0);
  EXPECT_GT(h.scheduler.counts().reused_tokens, 0) << "the recompute started from a checkpoint";
  EXPECT_EQ(h.count(1, 0), 12);
  EXPECT_EQ(h.count(2, 0), 12);
  EXPECT_EQ(h.blocks.used_blocks(), 0);
  EXPECT_EQ(h.blocks.used_slots(), 0);
}

}  // namespace
}  // namespace qinfer::engine
