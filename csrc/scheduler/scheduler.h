// scheduler: continuous batching. Each step takes running sequences first (oldest first), then admits
// waiting ones, under a token budget and a sequence cap; a long prompt is cut into chunks that fit the
// budget. An admitted sequence reuses the longest cached prefix of its tokens (its computed count starts at
// the hit), short of any prompt row it has still to record (Sequence::cacheable: mean-pooled embeddings and
// prompt logprobs compute their rows). When KV blocks run out, the most recently admitted running sequence is preempted: its blocks are
// released (full computed ones stay cached) and it waits again, to be recomputed from its tokens.
//
// With a step-time target (Sarathi-Serve's stall-free batching): decodes first, each one token, then chunks
// of prompts (running ones in admission order, then waiting ones) in the time the decodes leave.
//
// Speculative decoding: a decoding sequence's drafted tokens (Sequence::draft) ride on its decode as extra rows,
// after every prompt chunk, within the token budget, the time the step target leaves and while the step's
// rows stay within spec_rows — each row only if the tokens it is expected to give (DraftPolicy) pay for the
// time it adds (RowCosts), the most promising rows first; verified() then keeps the accepted ones' K/V and
// rolls the rest back.
//
// Hybrid models (a recurrent state pool set): a sequence is admitted only with a free state slot for each of
// its samples; slots are freed where its blocks are (finish, abort, preemption) and copied on a fork. A drafted
// decode also takes a slot per drafted row (Sequence::draft_slots; a draft is cut to the slots free), each
// holding the state after one of the step's rows, and verified() keeps the state after the last accepted row. With
// state checkpoints (state_checkpoints.h), a prefix-cache hit is cut back to the last block boundary whose state
// is held, restored into the new slot; a step that ends on a boundary checkpoints it, and a prompt's chunk that
// runs past its last full block's boundary takes a slot for the state there, copied mid-step (or, with none
// free, stops at the boundary) so that a repeated prompt finds one there.
//
// Priorities (Sequence::priority, lower first; vLLM's): the waiting queue and the running set are kept in
// priority order, oldest first within one; a step plans them best first, so a better request is admitted before
// a worse running one's chunk, may preempt worse running ones for seats and blocks, and preemption takes the worst,
// newest sequence first. With one priority everything is first come, first served.
//
// One rule drives everything: a running sequence's computed tokens catch up with its total tokens.
// computed() is how a step reports progress (the engine after its forward, the simulator at once).
#pragma once

#include <deque>
#include <vector>

#include "scheduler/block_manager.h"
#include "scheduler/disk_blocks.h"
#include "kv/recurrent_state.h"
#include "scheduler/state_checkpoints.h"
#include "scheduler/sequence.h"
#include "scheduler/step_cost.h"

namespace pyserve {

struct SchedulerConfig {
  int max_num_seqs = 64;          // running sequences at most (a request of n samples counts n)
  int max_batched_tokens = 512;   // tokens per step at most (a hard cap, with or without a step target)
  int block_size = 16;            // tokens per KV block
  int min_prefill_chunk = 16;     // with a step target: the least a step beside decodes gives prompts
  // Drafted tokens only while a step's rows stay within this: the packed kernels' columns per weight load,
  // below which a row costs little more than the weights streamed once (above it, a row of compute each).
  int spec_rows = 8;
};

struct ScheduledSeq {
  Sequence* seq;
  int n_tokens;   // tokens computed this step, from seq->n_computed on (a decode's drafted ones included)
  bool sample;    // the step computes its last token, so a new one is drawn
};

struct Schedule {
  std::vector<ScheduledSeq> seqs;
  std::vector<BlockCopy> copies;  // copy-on-write: KVCache::copy_block(src, dst) before the forward
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockManager& blocks);

  void add(Sequence* seq);                   // queues a new sequence (WAITING)
  void remove(Sequence* seq);                // from whichever queue; releases its blocks
  Schedule schedule();                       // the next step; empty when there is nothing to do
  // seconds > 0 with a predictor (owned by the caller): a step beside decodes takes only the prompt tokens
  // its predicted time leaves room for under `seconds` (at least min_prefill_chunk, so prompts always
  // progress); a step without decodes takes up to max_batched_tokens. 0 or null: the token budget alone.
  void set_step_target(double seconds, const StepCostModel* cost) { target_ = seconds, cost_ = cost; }
  // The recurrent state slots of a hybrid model and its checkpoints (owned by the caller; null: an
  // attention-only model; checkpoints null: no prefix-cache hit for it).
  void set_state_pool(RecurrentStatePool* states, StateCheckpoints* checkpoints = nullptr) {
    states_ = states, checkpoints_ = checkpoints;
  }
  // The prefix cache's disk tier (owned by the caller; null: none): before a request is admitted, its prompt's
  // blocks the pool no longer holds are promoted from disk (disk_blocks.h), within the step target's time (20 ms
  // without one) while streams run; a request whose promotion is cut short waits for the next step. Not for
  // hybrid models (their state checkpoints stay in memory). A write_through sequence's prompt blocks are saved
  // as they are computed.
  void set_disk(DiskBlocks* disk) { disk_ = disk; }
  // Prices drafted rows (null: any that fits the rows, the budget and the target is taken).
  void set_row_costs(const RowCosts* costs) { row_costs_ = costs; }
  const RowCosts* row_costs() const { return row_costs_; }
  // After the step ran: seq's next n tokens are computed; its newly full blocks enter the prefix cache.
  void computed(Sequence* seq, int n);
  // After a verification, once seq's draws are its tokens (computed(seq, n_tokens - draft size) first): the
  // drafted rows the draws followed keep their K/V (computed, committed to the prefix cache), the blocks past
  // its computed tokens are released, its DraftPolicy learns how many drafted tokens the draws agreed with,
  // and the draft is cleared; a hybrid's state is rolled back to the last row kept (and checkpointed at each
  // block boundary those rows reach), its draft slots freed. Returns that count.
  int verified(Sequence* seq);
  // child (fresh, same tokens as the running parent) joins the running set sharing the parent's blocks.
  void fork(Sequence* parent, Sequence* child);
  int blocks_needed(int n_tokens) const { return (n_tokens + cfg_.block_size - 1) / cfg_.block_size; }

  const SchedulerConfig& config() const { return cfg_; }
  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  uint64_t num_preemptions() const { return preemptions_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }

 private:
  // One step's walk: the tokens it may still take, the time the step target leaves, the seats taken, whether
  // anything was preempted (then nothing more is admitted) and whether admissions go on.
  struct PrefillBudget;
  struct Walk;
  static int seats(const Sequence* s);
  bool plan_running(Sequence* seq, Schedule& out, Walk& w);
  bool admit(Sequence* seq, size_t at, Schedule& out, Walk& w);
  bool can_bump(const Sequence* seq, size_t at) const;
  void bump(Walk& w);
  std::vector<int32_t> usable_prefix(const Sequence* seq) const;
  bool promote_from_disk(const Sequence* seq);
  void preempt(Sequence* seq);
  void release_states(Sequence* seq);
  void checkpoint(const Sequence* seq, int n_tokens, int slot);  // at a block boundary: slot's state after n_tokens
  void keep_drafted_state(Sequence* seq, int first, int rows);   // rows from position first on are kept
  bool take_states(Sequence* seq, int n);  // n slots (the first its own) or none when fewer are free
  int checkpoint_within(Sequence* seq, int start, int n);  // n, or less to end on the last full block
  // Prompt tokens a step may still take: the time the step target leaves after the decodes.
  struct PrefillBudget {
    bool bounded = false;      // false: no target, or no decodes in the step (the token budget alone)
    double seconds = 0.0;      // what the step target leaves for prompt chunks
    bool floor_given = false;  // the step's first chunk got its min_prefill_chunk
  };
  struct Walk {
    int budget;
    PrefillBudget time;
    int seats = 0;
    bool preempted = false;
    bool admitting = true;
  };
  PrefillBudget prefill_budget() const;
  int prefill_take(PrefillBudget& b, const Sequence* seq, int start, int want);  // tokens, and charges b
  void add_drafts(Schedule& out, int budget, PrefillBudget& time);
  std::vector<int> draft_rows(const Schedule& out, int room, PrefillBudget& time) const;

  SchedulerConfig cfg_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;   // by priority, then arrival (a preempted one first of its priority)
  std::vector<Sequence*> running_;  // by priority, then admission order
  uint64_t preemptions_ = 0;
  uint64_t admitted_ = 0;
  double target_ = 0.0;
  const StepCostModel* cost_ = nullptr;
  const RowCosts* row_costs_ = nullptr;
  RecurrentStatePool* states_ = nullptr;
  StateCheckpoints* checkpoints_ = nullptr;
  DiskBlocks* disk_ = nullptr;
};

}  // namespace pyserve
