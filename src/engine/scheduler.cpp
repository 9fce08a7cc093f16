#include "engine/scheduler.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace qinfer::engine {

int32_t StepPlan::sampled_rows() const {
  return static_cast<int32_t>(std::count_if(chunks.begin(), chunks.end(), [](const Chunk& c) { return c.samples; }));
}

int64_t StepPlan::tokens() const {
  int64_t n = 0;
  for (const Chunk& c : chunks) n += c.tokens;
  return n;
}

bool StepPlan::decode_only() const {
  return !chunks.empty() &&
         std::all_of(chunks.begin(), chunks.end(), [](const Chunk& c) { return c.tokens == 1 && c.samples; });
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks) : config_(config), blocks_(blocks) {
  QINFER_CHECK(config.max_running > 0, "scheduler: max_running must be positive, got {}", config.max_running);
  QINFER_CHECK(config.checkpoint_interval >= 0 && config.checkpoint_interval % blocks.block_size() == 0,
               "scheduler: checkpoint_interval ({}) must be a multiple of the block size ({})",
               config.checkpoint_interval, blocks.block_size());
  QINFER_CHECK(config.prompt_rows_budget > 0, "scheduler: prompt_rows_budget must be positive, got {}",
               config.prompt_rows_budget);
  QINFER_CHECK(config.step_token_budget >= config.max_running,
               "scheduler: step_token_budget ({}) must be at least max_running ({}) so that every running "
               "sequence can decode in each step",
               config.step_token_budget, config.max_running);
}

void Scheduler::add(std::unique_ptr<Sequence> sequence) {
  QINFER_CHECK(sequence && sequence->limits && !sequence->tokens.empty(), "scheduler: a sequence needs tokens and limits");
  QINFER_CHECK(1 + sequence->forks <= config_.max_running, "scheduler: {} choices exceed max_running {}",
               1 + sequence->forks, config_.max_running);
  sequence->status = Sequence::Status::waiting;
  waiting_.push_back(std::move(sequence));
}

void Scheduler::hold(Sequence& s, int64_t tokens) {
  if (blocks_.hold(s.cache, tokens)) blocks_.add_work({-1, s.cache.slot});
}

void Scheduler::let_go(Sequence& s, bool keep_cache) {
  const int64_t bs = blocks_.block_size(), at = s.cache.cached / bs;
  if (keep_cache && checkpoints() && s.cache.slot >= 0 && s.cache.cached % bs == 0 &&
      at > std::max(s.rolling_blocks, s.kept_blocks)) {
    // Stopped on a block boundary, past the rolling checkpoint: its live state is the better one. The
    // live slot becomes the checkpoint and the rolling slot (or a fresh one) goes back in its place.
    if (s.rolling < 0) s.rolling = blocks_.take_checkpoint(true);
    if (s.rolling >= 0) {
      std::swap(s.cache.slot, s.rolling);
      s.rolling_blocks = at;
    }
  }
  if (s.rolling >= 0) {
    if (keep_cache && s.rolling_blocks > 0) blocks_.attach_checkpoint(s.cache, s.rolling_blocks, s.rolling, true);
    else blocks_.drop_checkpoint(s.rolling, true);
    s.rolling = -1;
  }
  s.rolling_blocks = s.kept_blocks = 0;
  blocks_.release(s.cache);
}

Sequence* Scheduler::youngest_running() {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if ((*it)->status == Sequence::Status::running) return it->get();
  return nullptr;
}

void Scheduler::admit() {
  // Running places and KV blocks already spoken for: pending branches and unprefilled tokens.
  auto blocks_wanted = [&](const Sequence& s) {
    const int64_t own = blocks_.blocks_for(static_cast<int64_t>(s.tokens.size()));
    const int64_t branch = own - s.fork_at / blocks_.block_size();
    return std::max<int64_t>(0, own - static_cast<int64_t>(s.cache.blocks.size())) + s.forks * branch;
  };
  int64_t places = 0, promised = 0;
  for (const auto& s : running_) {
    places += 1 + s->forks;
    promised += blocks_wanted(*s);
  }
  // Strictly first come, first served: the head waits until it fits, and everything behind it too.
  while (!waiting_.empty()) {
    Sequence& s = *waiting_.front();
    const int64_t blocks = blocks_wanted(s);
    if (places + 1 + s.forks > config_.max_running) break;
    if (!running_.empty() && blocks > blocks_.free_blocks() - promised) break;
    places += 1 + s.forks;
    promised += blocks;
    s.status = Sequence::Status::running;
    if (s.cache.blocks.empty()) reuse_prefix(s);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    Sequence& admitted = *running_.back();
    if (admitted.forks > 0 && admitted.fork_at == admitted.cache.cached) fork(admitted);
  }
}

void Scheduler::reuse_prefix(Sequence& s) {
  if (!blocks_.prefix_caching() || s.wants_prompt_rows()) return;
  // Whole cached blocks, leaving at least the last token to compute (its logits are the next pick).
  const int64_t most = (static_cast<int64_t>(s.tokens.size()) - 1) / blocks_.block_size();
  BlockManager::Match m = blocks_.match(s.tokens, most);
  s.cache.blocks = std::move(m.blocks);
  s.cache.cached = static_cast<int32_t>(s.cache.blocks.size()) * blocks_.block_size();
  if (m.checkpoint >= 0) {
    blocks_.take_slot(s.cache);
    blocks_.add_work({m.checkpoint, s.cache.slot});
    s.kept_blocks = static_cast<int64_t>(s.cache.blocks.size());
  }
  if (checkpoints()) {
    s.junction_blocks = m.path_blocks > static_cast<int64_t>(s.cache.blocks.size()) ? std::min(m.path_blocks, most) : 0;
    s.end_blocks = most;
  }
  s.cached_prompt_tokens = std::max(s.cached_prompt_tokens, std::min(s.cache.cached, s.prompt_tokens));
  reused_tokens_ += s.cache.cached;
  (s.cache.cached > 0 ? hits_ : misses_) += 1;
}

int64_t Scheduler::next_checkpoint(const Sequence& s, int64_t cached) const {
  const int64_t bs = blocks_.block_size();
  int64_t next = 0;
  auto consider = [&](int64_t at) {
    if (at > cached && (next == 0 || at < next)) next = at;
  };
  consider(s.junction_blocks * bs);
  consider(s.end_blocks * bs);
  if (config_.checkpoint_interval > 0) consider((cached / config_.checkpoint_interval + 1) * config_.checkpoint_interval);
  return next;
}

bool Scheduler::checkpoint_at(const Sequence& s, int64_t position) const {
  return position > 0 && next_checkpoint(s, position - 1) == position;
}

void Scheduler::plan_checkpoint(Sequence& s, int64_t end, StepPlan::Chunk& chunk) {
  const int64_t bs = blocks_.block_size(), start = s.cache.cached;
  if (s.cache.slot < 0) return;
  // A step from a block boundary writes the state to another slot and leaves the one it read behind:
  // kept, where a checkpoint belongs at the boundary, else the sequence's rolling one.
  if (start > 0 && start % bs == 0 && start / bs > s.kept_blocks) {
    if (checkpoint_at(s, start)) {
      chunk.state_to = blocks_.take_checkpoint(false);
      chunk.keep_start = chunk.state_to >= 0;
    } else {
      if (s.rolling < 0) s.rolling = blocks_.take_checkpoint(true);
      chunk.state_to = s.rolling;
    }
  }
  if (const int64_t at = next_checkpoint(s, start); at > 0 && at <= end) {
    chunk.save_to = blocks_.take_checkpoint(false);
    chunk.save_at = static_cast<int32_t>(at - start);
  }
}

StepPlan Scheduler::schedule() {
  admit();
  StepPlan plan;
  while (true) {
    int64_t budget = config_.step_token_budget, rows_budget = config_.prompt_rows_budget;
    // Decodes first, oldest first: each needs one token and, at a block boundary, one block.
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence& s = *running_[i];
      if (s.status != Sequence::Status::running || s.uncached() != 1 || !make_room(s)) continue;
      plan.chunks.push_back({&s, 1, true});
      if (checkpoints()) plan_checkpoint(s, s.cache.cached + 1, plan.chunks.back());
      --budget;
    }
    // Then prefill chunks, oldest first, as far as the budget and the free blocks go.
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence& s = *running_[i];
      if (s.status != Sequence::Status::running || s.uncached() <= 1) continue;
      int64_t chunk = std::min<int64_t>(s.uncached(), budget);
      if (s.forks > 0) chunk = std::min<int64_t>(chunk, s.fork_at - s.cache.cached);  // branch at fork_at
      const bool rows = s.wants_prompt_rows();
      if (rows) chunk = std::min(chunk, rows_budget);
      // A chunk keeps the checkpoint at its start (the state it leaves behind) and one inside it or at
      // its end: one that would pass two ends at the second, which the next chunk starts from.
      if (checkpoints())
        if (const int64_t at = next_checkpoint(s, s.cache.cached); at > 0 && at < s.cache.cached + chunk)
          if (const int64_t after = next_checkpoint(s, at); after > 0 && after < s.cache.cached + chunk)
            chunk = after - s.cache.cached;
      const int64_t room =
          (static_cast<int64_t>(s.cache.blocks.size()) + blocks_.free_blocks()) * blocks_.block_size() - s.cache.cached;
      chunk = std::min(chunk, room);
      if (chunk <= 0 || !blocks_.can_hold(s.cache, s.cache.cached + chunk)) continue;
      hold(s, s.cache.cached + chunk);
      plan.chunks.push_back({&s, static_cast<int32_t>(chunk), chunk == s.uncached(), rows});
      if (checkpoints()) plan_checkpoint(s, s.cache.cached + chunk, plan.chunks.back());
      budget -= chunk;
      if (rows) rows_budget -= chunk;
    }
    if (!plan.chunks.empty()) break;
    // Nothing could move (prefills holding the blocks each other need): free the youngest and retry.
    Sequence* youngest = youngest_running();
    if (!youngest) break;
    preempt(*youngest);
  }
  requeue_preempted();
  plan.slot_work = blocks_.take_work();
  return plan;
}

bool Scheduler::make_room(Sequence& s) {
  while (!blocks_.can_hold(s.cache, s.cache.cached + 1)) {
    // Recompute preemption: the youngest running sequence gives its blocks back (possibly s itself).
    Sequence& victim = *youngest_running();
    preempt(victim);
    if (&victim == &s) return false;
  }
  hold(s, s.cache.cached + 1);
  return true;
}

void Scheduler::preempt(Sequence& s) {
  let_go(s);
  s.status = Sequence::Status::waiting;
  ++preemptions_;
}

void Scheduler::requeue_preempted() {
  // Preempted sequences go back to the front of the queue, the oldest first, to be recomputed.
  std::vector<std::unique_ptr<Sequence>> kept, preempted;
  for (auto& s : running_) (s->status == Sequence::Status::running ? kept : preempted).push_back(std::move(s));
  running_ = std::move(kept);
  for (auto it = preempted.rbegin(); it != preempted.rend(); ++it) waiting_.push_front(std::move(*it));
}

void Scheduler::fork(Sequence& parent) {
  const int32_t forks = parent.forks;
  parent.forks = 0;
  for (int32_t c = 1; c <= forks; ++c) {
    auto s = std::make_unique<Sequence>();
    s->request = parent.request;
    s->choice = c;
    s->tokens.assign(parent.tokens.begin(), parent.tokens.begin() + parent.prompt_tokens);
    s->prompt_tokens = parent.prompt_tokens;
    s->sampling = parent.sampling;
    s->sampling.seed += static_cast<uint64_t>(c);
    s->limits = parent.limits;
    s->status = Sequence::Status::running;
    s->prompt_rows_done = parent.prompt_rows_done;
    // Forks happen before the parent generates: each choice starts the grammar afresh.
    if (parent.constraint) s->constraint = std::make_unique<grammar::TokenConstraint>(parent.constraint->masks());
    if (parent.fork_at > 0) {
      // Whole blocks only: the tail after fork_at goes to each choice's own new block.
      s->cache = blocks_.fork(parent.cache, parent.fork_at);
      s->cached_prompt_tokens = parent.fork_at;
      // A parent with no slot yet has computed nothing; the branch's slot is zeroed when it holds.
      if (s->cache.slot >= 0 && parent.cache.slot >= 0) blocks_.add_work({parent.cache.slot, s->cache.slot});
    }
    running_.push_back(std::move(s));
  }
}

std::vector<SampledToken> Scheduler::postprocess(const StepPlan& plan, const std::vector<int32_t>& sampled) {
  QINFER_CHECK(static_cast<int32_t>(sampled.size()) == plan.sampled_rows(),
               "scheduler: {} sampled ids for a plan of {} sampling chunks", sampled.size(), plan.sampled_rows());
  std::vector<SampledToken> out;
  int32_t row = 0;
  for (const StepPlan::Chunk& chunk : plan.chunks) {
    Sequence& s = *chunk.sequence;
    const int32_t before = s.cache.cached;
    s.cache.cached += chunk.tokens;
    blocks_.publish(s.cache, s.tokens, before);  // the blocks this chunk filled
    if (chunk.prompt_rows) s.prompt_rows_done = std::max(s.prompt_rows_done, std::min(s.cache.cached, s.prompt_tokens - 1));
    if (chunk.state_to >= 0 && chunk.keep_start) {
      const int32_t left = std::exchange(s.cache.slot, chunk.state_to);
      s.kept_blocks = before / blocks_.block_size();
      blocks_.attach_checkpoint(s.cache, s.kept_blocks, left, false);
    } else if (chunk.state_to >= 0) {
      std::swap(s.cache.slot, s.rolling);
      s.rolling_blocks = before / blocks_.block_size();
    }
    if (chunk.save_to >= 0) {
      s.kept_blocks = (before + chunk.save_at) / blocks_.block_size();
      blocks_.attach_checkpoint(s.cache, s.kept_blocks, chunk.save_to, false);
    }
    if (s.forks > 0 && s.cache.cached == s.fork_at) fork(s);
    if (!chunk.samples) continue;
    const int32_t token = sampled[static_cast<size_t>(row)];
    SampledToken t{s.request, s.choice, token, row++};
    t.cached_prompt_tokens = s.cached_prompt_tokens;
    const SequenceLimits& limits = *s.limits;
    t.stop_id = std::find(limits.stop_ids.begin(), limits.stop_ids.end(), token) != limits.stop_ids.end();
    if (!t.stop_id) s.tokens.push_back(token);
    // The mask allowed only what the grammar takes: a refusal here is a broken mask, not the model's.
    const bool constrained_ok = !s.constraint || s.constraint->accept(token);
    if (t.stop_id) t.finish_reason = "stop";
    else if (!constrained_ok) t.finish_reason = "error", t.error = "the sampled token does not continue the grammar";
    else if (s.constraint && s.constraint->must_stop()) t.finish_reason = "stop";  // complete: nothing may follow
    else if (s.generated() >= limits.max_tokens || static_cast<int64_t>(s.tokens.size()) >= limits.max_context)
      t.finish_reason = "length";
    if (!t.finish_reason.empty()) {
      let_go(s);
      s.status = Sequence::Status::finished;
    }
    out.push_back(std::move(t));
  }
  std::erase_if(running_, [](const auto& s) { return s->finished(); });
  return out;
}

std::vector<int32_t> Scheduler::finish(uint64_t request, int32_t choice, bool keep_cache) {
  std::vector<int32_t> ended;
  auto matches = [&](const Sequence& s) { return s.request == request && (choice < 0 || s.choice == choice); };
  auto end = [&](Sequence& s) {
    let_go(s, keep_cache);
    s.status = Sequence::Status::finished;
    ended.push_back(s.choice);
    // Choices not yet branched off end with their parent.
    for (int32_t c = 1; c <= s.forks; ++c) ended.push_back(c);
    s.forks = 0;
  };
  for (auto& s : running_)
    if (matches(*s)) end(*s);
  for (auto& s : waiting_)
    if (matches(*s)) end(*s);
  std::erase_if(running_, [](const auto& s) { return s->finished(); });
  std::erase_if(waiting_, [](const auto& s) { return s->finished(); });
  std::sort(ended.begin(), ended.end());
  return ended;
}

namespace {
std::vector<uint64_t> sorted_unique(std::vector<uint64_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}
}  // namespace

std::vector<uint64_t> Scheduler::requests_of(const StepPlan& plan) {
  std::vector<uint64_t> ids;
  for (const StepPlan::Chunk& c : plan.chunks) ids.push_back(c.sequence->request);
  return sorted_unique(std::move(ids));
}

std::vector<uint64_t> Scheduler::requests() const {
  std::vector<uint64_t> ids;
  for (const auto& s : running_) ids.push_back(s->request);
  for (const auto& s : waiting_) ids.push_back(s->request);
  return sorted_unique(std::move(ids));
}

SchedulerCounts Scheduler::counts() const {
  return {static_cast<int64_t>(running_.size()), static_cast<int64_t>(waiting_.size()), preemptions_, reused_tokens_,
          hits_, misses_};
}

}  // namespace qinfer::engine
