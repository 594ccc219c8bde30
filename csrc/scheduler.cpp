#include "scheduler.h"

#include <algorithm>

namespace pyserve {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockManager& blocks) : cfg_(cfg), blocks_(blocks) {}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::WAITING;
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  blocks_.free(seq->blocks);
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  blocks_.free(seq->blocks);
  seq->n_computed = 0;
  seq->draft.clear();
  seq->status = SeqStatus::WAITING;
  waiting_.push_front(seq);
  preemptions_++;
}

void Scheduler::computed(Sequence* seq, int n) {
  seq->n_computed += n;
  blocks_.commit(seq->blocks, seq->tokens, seq->n_computed);
}

void Scheduler::verified(Sequence* seq, int accepted) {
  computed(seq, accepted);
  blocks_.truncate(seq->blocks, seq->n_computed);
  seq->draft.clear();
}

void Scheduler::fork(Sequence* parent, Sequence* child) {
  blocks_.fork(parent->blocks, child->blocks);
  child->n_computed = parent->n_computed;
  child->status = SeqStatus::RUNNING;
  child->arrival = admitted_++;
  running_.push_back(child);
}

Scheduler::PrefillBudget Scheduler::prefill_budget() const {
  if (target_ <= 0 || !cost_) return {};
  StepShape decodes;
  for (const Sequence* seq : running_)
    if (seq->n_pending() == 1) decodes.add(1, seq->n_computed, !seq->prefill_only());
  if (decodes.tokens == 0) return {};  // nothing streams: prompts go at the token budget's pace
  return {true, target_ - cost_->predict(decodes)};
}

// Up to `want` tokens of seq's prompt from position `start` within b (the first chunk of a step gets at least
// min_prefill_chunk); b is charged what they cost.
int Scheduler::prefill_take(PrefillBudget& b, const Sequence* seq, int start, int want) {
  if (!b.bounded) return want;
  const bool last = start + want == (int)seq->tokens.size() && !seq->prefill_only();
  int n = cost_->tokens_within(b.seconds, start, want, last);
  if (!b.floor_given) n = std::max(n, std::min(want, cfg_.min_prefill_chunk)), b.floor_given = true;
  b.seconds -= cost_->chunk_cost(n, start, last && n == want);
  return n;
}

Schedule Scheduler::schedule() {
  Schedule out;
  int budget = cfg_.max_batched_tokens;
  PrefillBudget time = prefill_budget();
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0; i++) {
    Sequence* seq = running_[i];
    int n = std::min(seq->n_pending(), budget);
    if (n > 1) n = prefill_take(time, seq, seq->n_computed, n);  // a prompt still being computed
    if (n <= 0) continue;
    // Free blocks by preempting the newest running sequences (never one already scheduled).
    bool ok;
    while (!(ok = blocks_.append(seq->blocks, seq->n_computed, seq->n_computed + n, &out.copies)) &&
           running_.back() != seq) {
      preempt(running_.back());
      preempted = true;
    }
    if (!ok) {
      preempt(seq);
      preempted = true;
      break;
    }
    out.seqs.push_back({seq, n, seq->n_computed + n == (int)seq->tokens.size()});
    budget -= n;
  }
  // A request of n samples takes n seats of the sequence cap from its admission on (it forks later).
  auto seats = [](const Sequence* s) { return std::max<int>(1, (int)s->pending_samples.size()); };
  int used = 0;
  for (const Sequence* s : running_) used += seats(s);
  while (!preempted && !waiting_.empty() && budget > 0 && used + seats(waiting_.front()) <= cfg_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // A hit stops short of the rows the sequence must record; one that must record its first row (mean
    // pooling, prompt logprobs) skips the lookup, and is no prefix-cache query (as vLLM counts them).
    const int cacheable = seq->cacheable();
    std::vector<int32_t> prefix;
    if (cacheable > 0) prefix = blocks_.lookup(seq->tokens);
    prefix.resize(std::min<size_t>(prefix.size(), cacheable / cfg_.block_size));
    int hit = (int)prefix.size() * cfg_.block_size;
    int n = std::min((int)seq->tokens.size() - hit, budget);
    if (n > 1) n = prefill_take(time, seq, hit, n);
    if (n <= 0 || !blocks_.can_allocate(prefix, hit + n)) break;
    waiting_.pop_front();
    blocks_.allocate(seq->blocks, seq->tokens, prefix, hit + n, cacheable > 0);
    seq->n_computed = hit;
    if (seq->n_cached < 0) seq->n_cached = hit;  // what the request's prompt got, not a later re-admission's
    seq->status = SeqStatus::RUNNING;
    seq->arrival = admitted_++;
    running_.push_back(seq);
    used += seats(seq);
    out.seqs.push_back({seq, n, seq->n_computed + n == (int)seq->tokens.size()});
    budget -= n;
  }
  add_drafts(out, preempted ? 0 : budget, time);  // blocks short: no draft takes one
  return out;
}

// Each scheduled decode with a draft takes what is left of its rows in step order; a draft that does not fit
// (rows, budget, time, blocks) is cut, the decode itself stays.
void Scheduler::add_drafts(Schedule& out, int budget, PrefillBudget& time) {
  int rows = 0;
  for (const ScheduledSeq& s : out.seqs) rows += s.n_tokens;
  int room = std::max(0, std::min(budget, cfg_.spec_rows - rows));
  for (ScheduledSeq& s : out.seqs) {
    Sequence* seq = s.seq;
    if (seq->draft.empty()) continue;
    const bool decode = s.sample && s.n_tokens == 1 && seq->n_pending() == 1;
    int d = decode ? draft_take(time, seq, std::min<int>((int)seq->draft.size(), room)) : 0;
    if (d > 0 && !blocks_.append(seq->blocks, seq->n_computed + 1, seq->n_computed + 1 + d, &out.copies)) d = 0;
    seq->draft.resize(d);
    s.n_tokens += d;
    room -= d;
  }
}

// The most of `want` drafted rows (each projected) the step target leaves time for; b is charged them.
int Scheduler::draft_take(PrefillBudget& b, const Sequence* seq, int want) const {
  if (want <= 0 || !b.bounded) return std::max(want, 0);
  int d = want;
  while (d > 0 && cost_->chunk_cost(d, seq->n_computed + 1, d) > b.seconds) d--;
  b.seconds -= cost_->chunk_cost(d, seq->n_computed + 1, d);
  return d;
}

}  // namespace pyserve
