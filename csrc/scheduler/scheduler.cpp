#include "scheduler/scheduler.h"

#include <algorithm>

namespace pyserve {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockManager& blocks) : cfg_(cfg), blocks_(blocks) {}

namespace {
bool by_priority(const Sequence* a, const Sequence* b) { return a->priority < b->priority; }
}  // namespace

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::WAITING;
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), seq, by_priority), seq);  // last of its priority
}

void Scheduler::remove(Sequence* seq) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  blocks_.free(seq->blocks);
  release_states(seq);
}

void Scheduler::release_states(Sequence* seq) {
  if (!states_) return;
  states_->release(seq->state_slot);
  for (int s : seq->spare_slots) states_->release(s);
  for (int s : seq->draft_slots) states_->release(s);
  states_->release(seq->checkpoint_slot);
  seq->state_slot = seq->checkpoint_slot = -1;
  seq->spare_slots.clear();
  seq->draft_slots.clear();
}

bool Scheduler::take_states(Sequence* seq, int n) {
  if (!states_) return true;
  if (states_->num_free() < n) return false;
  seq->state_slot = states_->acquire();
  for (int i = 1; i < n; i++) seq->spare_slots.push_back(states_->acquire());
  return true;
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  blocks_.free(seq->blocks);
  release_states(seq);  // recomputed from its first token: the state starts again from zero
  seq->n_computed = 0;
  seq->draft.clear();
  seq->status = SeqStatus::WAITING;
  waiting_.insert(std::lower_bound(waiting_.begin(), waiting_.end(), seq, by_priority), seq);  // first of its priority
  preemptions_++;
}

void Scheduler::computed(Sequence* seq, int n) {
  const int committed = seq->blocks.n_committed;
  seq->n_computed += n;
  blocks_.commit(seq->blocks, seq->tokens, seq->n_computed);
  if (disk_ && seq->write_through)  // the prompt's newly committed blocks go to disk now, not at eviction
    disk_->save_table(seq->blocks, seq->tokens.data(), committed,
                      std::min(seq->blocks.n_committed, seq->n_prompt / cfg_.block_size));
  if (seq->checkpoint_slot >= 0) {  // the state within the step, at the prompt's last full block
    checkpoint(seq, seq->checkpoint_at, seq->checkpoint_slot);
    states_->release(seq->checkpoint_slot);
    seq->checkpoint_slot = -1;
  }
  if (seq->draft_slots.empty()) checkpoint(seq, seq->n_computed, seq->state_slot);  // else: at its verification
}

void Scheduler::checkpoint(const Sequence* seq, int n_tokens, int slot) {
  if (checkpoints_ && slot >= 0 && n_tokens % cfg_.block_size == 0)
    checkpoints_->save(seq->tokens, n_tokens, *states_, slot, seq->blocks.root);
}

// A drafted hybrid decode keeps `rows` of its step's rows (positions first, first + 1, …): the state after row
// j is draft slot j's (the live slot's after the last row), checkpointed where a plain decode would have been,
// and the live slot takes the state after the last row kept.
void Scheduler::keep_drafted_state(Sequence* seq, int first, int rows) {
  std::vector<int>& snaps = seq->draft_slots;
  for (int j = 0; j < rows; j++) checkpoint(seq, first + j + 1, j < (int)snaps.size() ? snaps[j] : seq->state_slot);
  if (rows - 1 < (int)snaps.size()) states_->copy(snaps[rows - 1], seq->state_slot);
  for (int s : snaps) states_->release(s);
  snaps.clear();
}

// A hybrid's prompt chunk [start, start + n) that runs past its last full block's boundary (short of the last
// token) checkpoints the state there, the state a repeated prompt can resume from: the forward copies it into a
// slot of its own mid-step (Sequence::checkpoint_slot). With no slot free the chunk stops at the boundary
// instead, so that the step ends on it (a second step for the rest: a pass over the weights).
int Scheduler::checkpoint_within(Sequence* seq, int start, int n) {
  if (!checkpoints_ || n <= 1) return n;
  const int bs = cfg_.block_size, boundary = ((int)seq->tokens.size() - 1) / bs * bs;
  if (start >= boundary || start + n <= boundary) return n;
  const int slot = states_->acquire(false);  // overwritten whole by the snapshot
  if (slot < 0) return boundary - start;
  seq->checkpoint_slot = slot, seq->checkpoint_at = boundary;
  return n;
}

int Scheduler::verified(Sequence* seq) {
  const std::vector<int32_t>& draft = seq->draft;
  const int drawn = (int)seq->tokens.size() - seq->n_computed;  // from the last computed token's row on
  int agreed = 0;
  while (agreed < std::min<int>(drawn, (int)draft.size()) && draft[agreed] == seq->tokens[seq->n_computed + agreed])
    agreed++;
  seq->draft_policy.observe((int)draft.size(), agreed);
  const int first = seq->n_computed - 1;  // the step's first row (its pending token's), computed already
  computed(seq, drawn - 1);  // every draw but the last followed a drafted row that agreed
  blocks_.truncate(seq->blocks, seq->n_computed);
  if (!seq->draft_slots.empty()) keep_drafted_state(seq, first, drawn);
  seq->draft.clear();
  return agreed;
}

void Scheduler::fork(Sequence* parent, Sequence* child) {
  blocks_.fork(parent->blocks, child->blocks);
  if (states_ && !parent->spare_slots.empty()) {  // the slot reserved at the parent's admission
    child->state_slot = parent->spare_slots.back();
    parent->spare_slots.pop_back();
    states_->copy(parent->state_slot, child->state_slot);
  }
  child->n_computed = parent->n_computed;
  child->status = SeqStatus::RUNNING;
  child->arrival = admitted_++;
  running_.insert(std::upper_bound(running_.begin(), running_.end(), child, by_priority), child);
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

// The step's walk takes running and waiting sequences best priority first (a running one first on a tie): a
// waiting request of better priority than a running one is admitted before that one's chunk is planned, and may
// preempt running ones of worse priority for seats and blocks. With one priority this is the plain order:
// every running sequence, then the waiting ones.
Schedule Scheduler::schedule() {
  Schedule out;
  Walk w{cfg_.max_batched_tokens, prefill_budget()};
  for (const Sequence* s : running_) w.seats += seats(s);
  size_t i = 0;  // running_[0, i) are planned (or skipped); the rest are not
  while (w.budget > 0) {
    Sequence* run = i < running_.size() ? running_[i] : nullptr;
    Sequence* wait = w.admitting && !w.preempted && !waiting_.empty() ? waiting_.front() : nullptr;
    if (wait && (!run || wait->priority < run->priority)) {
      w.admitting = admit(wait, i, out, w);
      i += w.admitting;
    } else if (run && plan_running(run, out, w)) {
      i++;
    } else {
      break;
    }
  }
  add_drafts(out, w.preempted ? 0 : w.budget, w.time);  // blocks short: no draft takes one
  return out;
}

// A request of n samples takes n seats of the sequence cap from its admission on (it forks later).
int Scheduler::seats(const Sequence* s) { return std::max<int>(1, (int)s->pending_samples.size()); }

// seq's next chunk (a decode: its token): false when seq itself had to be preempted (the step ends there).
bool Scheduler::plan_running(Sequence* seq, Schedule& out, Walk& w) {
  int n = std::min(seq->n_pending(), w.budget);
  if (n > 1) n = prefill_take(w.time, seq, seq->n_computed, n);  // a prompt still being computed
  if (n <= 0) return true;
  n = checkpoint_within(seq, seq->n_computed, n);
  // Free blocks by preempting the worst running sequences (never one already planned: they come before seq).
  bool ok;
  while (!(ok = blocks_.append(seq->blocks, seq->n_computed, seq->n_computed + n, &out.copies)) &&
         running_.back() != seq) {
    w.seats -= seats(running_.back());
    preempt(running_.back());
    w.preempted = true;
  }
  if (!ok) {
    preempt(seq);
    w.preempted = true;
    return false;
  }
  out.seqs.push_back({seq, n, seq->n_computed + n == (int)seq->tokens.size()});
  w.budget -= n;
  return true;
}

// Whether a running sequence not yet planned (from `at` on) is of worse priority than seq: it may be preempted
// to make room for seq.
bool Scheduler::can_bump(const Sequence* seq, size_t at) const {
  return running_.size() > at && running_.back()->priority > seq->priority;
}

void Scheduler::bump(Walk& w) {
  w.seats -= seats(running_.back());
  preempt(running_.back());
  w.preempted = true;  // blocks are tight: nothing else is admitted this step
}

// The longest cached prefix seq may reuse: short of the rows it must record (one that must record its first
// row, mean pooling or prompt logprobs, skips the lookup), and for a hybrid only to a checkpointed state.
std::vector<int32_t> Scheduler::usable_prefix(const Sequence* seq) const {
  const int cacheable = seq->cacheable();
  std::vector<int32_t> prefix;
  if (cacheable > 0) prefix = blocks_.lookup(seq->tokens, seq->blocks.root);
  prefix.resize(std::min<size_t>(prefix.size(), cacheable / cfg_.block_size));
  if (states_)
    prefix.resize(checkpoints_ ? checkpoints_->usable(seq->tokens, (int)prefix.size(), cfg_.block_size,
                                                      seq->blocks.root) : 0);
  return prefix;
}

// Reads back what the disk tier holds of seq's prompt past the pool's cached prefix; false when the time bound
// cut it short (seq waits for the next step, which goes on from there).
bool Scheduler::promote_from_disk(const Sequence* seq) {
  if (!disk_ || states_ || seq->cacheable() < (int)seq->tokens.size()) return true;
  constexpr double kReadBound = 0.020;  // seconds a step beside running streams may read, without a step target
  const bool streams = std::any_of(running_.begin(), running_.end(), [](const Sequence* s) { return !s->prefill_only(); });
  const double bound = streams ? (target_ > 0 ? target_ : kReadBound) : 0.0;
  const double compute = cost_ ? cost_->chunk_cost(cfg_.block_size, 0, false) : 0.0;
  return disk_->promote(seq->tokens, seq->blocks.root, bound, compute).complete;
}

// Admits waiting_.front() (seq) as running_[at] with its first chunk; false (nothing changed but the
// preemptions it made) when it does not fit: nothing after it is admitted this step.
bool Scheduler::admit(Sequence* seq, size_t at, Schedule& out, Walk& w) {
  while (w.seats + seats(seq) > cfg_.max_num_seqs && can_bump(seq, at)) bump(w);
  if (w.seats + seats(seq) > cfg_.max_num_seqs || !promote_from_disk(seq)) return false;
  const std::vector<int32_t> prefix = usable_prefix(seq);
  const int hit = (int)prefix.size() * cfg_.block_size;
  int n = std::min((int)seq->tokens.size() - hit, w.budget);
  if (n > 1) n = prefill_take(w.time, seq, hit, n);
  if (n <= 0) return false;
  auto fits = [&] { return blocks_.can_allocate(prefix, hit + n) && (!states_ || states_->num_free() >= seats(seq)); };
  while (!fits() && can_bump(seq, at)) bump(w);
  if (!fits() || !take_states(seq, seats(seq))) return false;
  n = checkpoint_within(seq, hit, n);
  waiting_.pop_front();
  blocks_.allocate(seq->blocks, seq->tokens, prefix, hit + n, seq->cacheable() > 0);
  if (hit > 0 && states_) checkpoints_->restore(seq->tokens, hit, *states_, seq->state_slot, seq->blocks.root);
  seq->n_computed = hit;
  if (seq->n_cached < 0) seq->n_cached = hit;  // what the request's prompt got, not a later re-admission's
  seq->status = SeqStatus::RUNNING;
  seq->arrival = admitted_++;
  running_.insert(running_.begin() + at, seq);  // after every running one of its priority or better
  w.seats += seats(seq);
  out.seqs.push_back({seq, n, seq->n_computed + n == (int)seq->tokens.size()});
  w.budget -= n;
  return true;
}

// Each scheduled decode with a draft gets the rows draft_rows gives it; a draft whose blocks are short is
// dropped (the decode itself stays), and the rest of every draft is cut.
void Scheduler::add_drafts(Schedule& out, int budget, PrefillBudget& time) {
  int rows = 0;
  for (const ScheduledSeq& s : out.seqs) rows += s.n_tokens;
  const std::vector<int> take = draft_rows(out, std::max(0, std::min(budget, cfg_.spec_rows - rows)), time);
  for (size_t i = 0; i < out.seqs.size(); i++) {
    Sequence* seq = out.seqs[i].seq;
    int d = states_ ? std::min(take[i], states_->num_free()) : take[i];  // a hybrid: a state slot per drafted row
    if (d > 0 && !blocks_.append(seq->blocks, seq->n_computed + 1, seq->n_computed + 1 + d, &out.copies)) d = 0;
    seq->draft.resize(d);
    for (int j = 0; states_ && j < d; j++) seq->draft_slots.push_back(states_->acquire(false));  // overwritten whole
    out.seqs[i].n_tokens += d;
  }
}

// Drafted rows per scheduled sequence, at most `room` in all: the row expected to give most tokens next (the
// j-th drafted token of a sequence stands with probability p^j) while it is worth its time (RowCosts) and
// the step target leaves that time.
std::vector<int> Scheduler::draft_rows(const Schedule& out, int room, PrefillBudget& time) const {
  std::vector<int> take(out.seqs.size(), 0);
  std::vector<double> next(out.seqs.size(), 0.0);  // the expected tokens of each sequence's next row
  int rows = 0, streams = 0;
  double tokens = 0;
  for (size_t i = 0; i < out.seqs.size(); i++) {
    const ScheduledSeq& s = out.seqs[i];
    rows += s.n_tokens, streams += s.sample, tokens += s.sample;
    if (s.sample && s.n_tokens == 1 && s.seq->n_pending() == 1 && !s.seq->draft.empty())
      next[i] = s.seq->draft_policy.p();
  }
  for (; room > 0; room--, rows++) {
    const size_t i = std::max_element(next.begin(), next.end()) - next.begin();
    if (next.empty() || next[i] <= 0 || (row_costs_ && !row_costs_->worth(next[i], tokens, rows, streams))) break;
    const Sequence* seq = out.seqs[i].seq;
    const double cost = time.bounded ? cost_->chunk_cost(1, seq->n_computed + 1 + take[i], 1) : 0.0;
    if (time.bounded && cost > time.seconds) break;
    time.seconds -= cost;
    tokens += next[i];
    take[i]++;
    next[i] = take[i] < (int)seq->draft.size() ? next[i] * seq->draft_policy.p() : 0.0;
  }
  return take;
}
}  // namespace pyserve
