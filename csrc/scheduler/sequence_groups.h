// sequence_groups: the live requests, each a group of sequences, and their lifecycle around the Scheduler —
// admission, the fork of an n > 1 request once its prompt is computed, the end of a step's rows, aborts and
// finishes (a sequence's blocks back to the pool). What happens to a sequence between the schedule and its
// next one without a model: the Engine drives it with a forward pass and real samplers, SchedulerSim
// (bindings/testing/scheduler.cpp) with made-up tokens, so both run these code paths and not two copies of them.
//
// A request is one sequence until its prompt is computed; one of n > 1 samples stands for all of them then
// (Sequence::pending_samples) and forks into one sequence per sample still pending. Not thread-safe: the
// step's thread alone calls it (the Engine's other threads only fill its inboxes).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/scheduler.h"
#include "scheduler/sequence.h"

namespace pyserve {

// A request's first sequence: id, prompt (its tokens, n_prompt), stop config and, for n > 1, the n sample
// indexes it stands for until the fork. No sampler (the caller gives it one: the engine, from its sampling
// config; the simulator none). Checks nothing: the caller has checked the request (Engine::check).
std::unique_ptr<Sequence> request_sequence(std::string id, std::vector<int32_t> prompt, StopConfig stop, int n);

class SequenceGroups {
 public:
  using Group = std::vector<std::unique_ptr<Sequence>>;  // a request's live sequences, in fork order
  // An ended sample: the sequence standing for it (still alive) and the sample's index.
  using Ended = std::function<void(const Sequence& seq, int index)>;

  // released(id) runs once a request's last sequence is gone (the engine's live ids follow it). sched must
  // outlive this.
  SequenceGroups(Scheduler& sched, std::function<void(const std::string& id)> released);

  // Queues seq (request_sequence's, with its samplers) on the scheduler and keeps it. The id must not be live.
  void admit(std::unique_ptr<Sequence> seq);
  // After the step's forward, for each scheduled s in order: s's rows are computed (its drafted rows are left
  // to Scheduler::verified once the draws are known). Returns who draws from its last row: nobody when it
  // does not sample or is prefill-only (the caller ends it), else seq — or, when an n > 1 prompt is complete,
  // seq and its new siblings (fork()), every sample drawing its first token from that one row.
  std::vector<Sequence*> computed(const ScheduledSeq& s);
  // After seq's draws are its tokens: a draft's accepted rows are kept (Scheduler::verified, before the finish
  // so the prefix cache holds what plain decoding's would), then seq finishes if it `ended`. Returns the
  // draft's {drafted tokens, accepted tokens} ({0, 0}: no draft).
  std::pair<int, int> drawn(Sequence* seq, bool ended);
  // Ends sample `index` (< 0: every sample) of request id wherever it is, calling ended() for each sample
  // before its sequence goes; a sample not forked yet leaves the sequence that stands for it, which finishes
  // with its last one. Unknown ids and indexes: no-op.
  void abort(const std::string& id, int index, const Ended& ended);
  // seq leaves the scheduler (its blocks released) and its group; released() when it was the request's last.
  // seq is destroyed: the caller must not touch it after.
  void finish(Sequence* seq);

  bool empty() const { return groups_.empty(); }
  bool contains(const std::string& id) const { return groups_.count(id) > 0; }
  const Group* find(const std::string& id) const;  // null when the id is not live
  std::vector<std::string> ids() const;             // the live requests, in id order

 private:
  // An n > 1 sequence whose prompt is computed → itself (the first pending index) and one new sibling per
  // other pending index, sharing its blocks (Scheduler::fork); each takes its sampler from fork_samplers when
  // there are any (the simulator has none).
  std::vector<Sequence*> fork(Sequence* parent);
  void abort_pending(Sequence* seq, int index, const Ended& ended);  // seq not forked yet

  Scheduler& sched_;
  std::function<void(const std::string&)> released_;
  std::map<std::string, Group> groups_;  // request id → its live sequences (one until an n > 1 request forks)
};

}  // namespace pyserve
