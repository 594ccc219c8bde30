// scheduler: continuous batching. Each step takes running sequences first (oldest first), then admits
// waiting ones, under a token budget and a sequence cap; a long prompt is cut into chunks that fit the
// budget. When KV blocks run out, the most recently admitted running sequence is preempted: its blocks
// are freed and it waits again, to be recomputed from its tokens.
#pragma once

#include <deque>
#include <vector>

#include "kv_cache.h"
#include "sequence.h"

namespace pyserve {

struct SchedulerConfig {
  int max_num_seqs = 64;          // running sequences at most
  int max_batched_tokens = 512;   // tokens per step at most
  int block_size = 16;            // tokens per KV block
};

struct ScheduledSeq {
  Sequence* seq;
  int n_tokens;   // tokens computed this step, from seq->n_computed on
  bool sample;    // the step computes its last token, so a new one is drawn
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& cfg, BlockPool& pool);

  void add(Sequence* seq);                   // queues a new sequence (WAITING)
  void remove(Sequence* seq);                // from whichever queue; frees its blocks
  std::vector<ScheduledSeq> schedule();      // the next step; empty when there is nothing to do
  int blocks_needed(int n_tokens) const { return (n_tokens + cfg_.block_size - 1) / cfg_.block_size; }

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  uint64_t num_preemptions() const { return preemptions_; }

 private:
  bool grow_table(Sequence* seq, int n_tokens);  // blocks to hold n_tokens; false if the pool is short
  void free_blocks(Sequence* seq);
  void preempt(Sequence* seq);

  SchedulerConfig cfg_;
  BlockPool& pool_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  uint64_t preemptions_ = 0;
  uint64_t admitted_ = 0;
};

}  // namespace pyserve
