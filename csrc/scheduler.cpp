#include "scheduler.h"

#include <algorithm>

namespace pyserve {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockPool& pool) : cfg_(cfg), pool_(pool) {}

void Scheduler::add(Sequence* seq) {
  seq->status = SeqStatus::WAITING;
  waiting_.push_back(seq);
}

void Scheduler::remove(Sequence* seq) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  free_blocks(seq);
}

bool Scheduler::grow_table(Sequence* seq, int n_tokens) {
  int need = blocks_needed(n_tokens) - (int)seq->block_table.size();
  if (need <= 0) return true;
  if (!pool_.can_allocate(need)) return false;
  for (int i = 0; i < need; i++) seq->block_table.push_back(pool_.allocate());
  return true;
}

void Scheduler::free_blocks(Sequence* seq) {
  for (int b : seq->block_table) pool_.release(b);
  seq->block_table.clear();
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  free_blocks(seq);
  seq->n_computed = 0;
  seq->status = SeqStatus::WAITING;
  waiting_.push_front(seq);
  preemptions_++;
}

std::vector<ScheduledSeq> Scheduler::schedule() {
  std::vector<ScheduledSeq> out;
  int budget = cfg_.max_batched_tokens;
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && budget > 0; i++) {
    Sequence* seq = running_[i];
    int n = std::min(seq->n_pending(), budget);
    // Free blocks by preempting the newest running sequences (never one already scheduled).
    while (!grow_table(seq, seq->n_computed + n) && running_.back() != seq) {
      preempt(running_.back());
      preempted = true;
    }
    if (!grow_table(seq, seq->n_computed + n)) {
      preempt(seq);
      preempted = true;
      break;
    }
    out.push_back({seq, n, seq->n_computed + n == (int)seq->tokens.size()});
    budget -= n;
  }
  while (!preempted && !waiting_.empty() && budget > 0 && (int)running_.size() < cfg_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    int n = std::min(seq->n_pending(), budget);
    if (!grow_table(seq, seq->n_computed + n)) break;
    waiting_.pop_front();
    seq->status = SeqStatus::RUNNING;
    seq->arrival = admitted_++;
    running_.push_back(seq);
    out.push_back({seq, n, seq->n_computed + n == (int)seq->tokens.size()});
    budget -= n;
  }
  return out;
}

}  // namespace pyserve
