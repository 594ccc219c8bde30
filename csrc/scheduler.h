// scheduler: continuous batching. Each step takes running sequences first (oldest first), then admits
// waiting ones, under a token budget and a sequence cap; a long prompt is cut into chunks that fit the
// budget. An admitted sequence reuses the longest cached prefix of its tokens (its computed count starts at
// the hit), short of any prompt row it has still to record (Sequence::cacheable: mean-pooled embeddings and
// prompt logprobs compute their rows). When KV blocks run out, the most recently admitted running sequence is preempted: its blocks are
// released (full computed ones stay cached) and it waits again, to be recomputed from its tokens.
//
// One rule drives everything: a running sequence's computed tokens catch up with its total tokens.
// computed() is how a step reports progress (the engine after its forward, the simulator at once).
#pragma once

#include <deque>
#include <vector>

#include "block_manager.h"
#include "sequence.h"

namespace pyserve {

struct SchedulerConfig {
  int max_num_seqs = 64;          // running sequences at most (a request of n samples counts n)
  int max_batched_tokens = 512;   // tokens per step at most
  int block_size = 16;            // tokens per KV block
};

struct ScheduledSeq {
  Sequence* seq;
  int n_tokens;   // tokens computed this step, from seq->n_computed on
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
  // After the step ran: seq's next n tokens are computed; its newly full blocks enter the prefix cache.
  void computed(Sequence* seq, int n);
  // child (fresh, same tokens as the running parent) joins the running set sharing the parent's blocks.
  void fork(Sequence* parent, Sequence* child);
  int blocks_needed(int n_tokens) const { return (n_tokens + cfg_.block_size - 1) / cfg_.block_size; }

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  uint64_t num_preemptions() const { return preemptions_; }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }

 private:
  void preempt(Sequence* seq);

  SchedulerConfig cfg_;
  BlockManager& blocks_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // in admission order
  uint64_t preemptions_ = 0;
  uint64_t admitted_ = 0;
};

}  // namespace pyserve
