#include "scheduler/sequence_groups.h"

#include <algorithm>

namespace pyserve {

std::unique_ptr<Sequence> request_sequence(std::string id, std::vector<int32_t> prompt, StopConfig stop, int n) {
  auto seq = std::make_unique<Sequence>();
  seq->id = std::move(id);
  seq->n_prompt = (int)prompt.size();
  seq->tokens = std::move(prompt);
  seq->stop = std::move(stop);
  if (n > 1)
    for (int i = 0; i < n; i++) seq->pending_samples.push_back(i);
  return seq;
}

SequenceGroups::SequenceGroups(Scheduler& sched, std::function<void(const std::string& id)> released)
    : sched_(sched), released_(std::move(released)) {}

void SequenceGroups::admit(std::unique_ptr<Sequence> seq) {
  sched_.add(seq.get());
  groups_[seq->id].push_back(std::move(seq));
}

std::vector<Sequence*> SequenceGroups::computed(const ScheduledSeq& s) {
  Sequence* seq = s.seq;
  sched_.computed(seq, s.n_tokens - (int)seq->draft.size());
  if (!s.sample || seq->prefill_only()) return {};
  return seq->pending_samples.empty() ? std::vector<Sequence*>{seq} : fork(seq);
}

std::vector<Sequence*> SequenceGroups::fork(Sequence* parent) {
  std::vector<int> idx;
  idx.swap(parent->pending_samples);
  std::vector<std::unique_ptr<Sampler>> samplers;  // [n] by sample index, or none
  samplers.swap(parent->fork_samplers);
  auto sampler_of = [&](int i) -> std::unique_ptr<Sampler> {
    return samplers.empty() ? nullptr : std::move(samplers[i]);
  };
  parent->index = idx[0];
  parent->sampler = sampler_of(idx[0]);
  std::vector<Sequence*> out{parent};
  Group& group = groups_[parent->id];
  for (size_t k = 1; k < idx.size(); k++) {
    auto child = parent->sibling(idx[k]);
    child->sampler = sampler_of(idx[k]);
    sched_.fork(parent, child.get());
    out.push_back(child.get());
    group.push_back(std::move(child));
  }
  return out;
}

std::pair<int, int> SequenceGroups::drawn(Sequence* seq, bool ended) {
  const int drafted = (int)seq->draft.size();  // verified() clears it
  const int accepted = drafted ? sched_.verified(seq) : 0;
  if (ended) finish(seq);
  return {drafted, accepted};
}

void SequenceGroups::abort(const std::string& id, int index, const Ended& ended) {
  auto it = groups_.find(id);
  if (it == groups_.end()) return;
  std::vector<Sequence*> live;  // finish() edits the group (and may erase it) as we go
  for (auto& s : it->second) live.push_back(s.get());
  for (Sequence* seq : live) {
    if (!seq->pending_samples.empty()) {
      abort_pending(seq, index, ended);
    } else if (index < 0 || seq->index == index) {
      ended(*seq, seq->index);
      finish(seq);
    }
  }
}

void SequenceGroups::abort_pending(Sequence* seq, int index, const Ended& ended) {
  std::vector<int>& p = seq->pending_samples;
  if (index < 0) {
    for (int i : p) ended(*seq, i);
    p.clear();
  } else if (std::find(p.begin(), p.end(), index) != p.end()) {
    ended(*seq, index);
    p.erase(std::find(p.begin(), p.end(), index));
    if (index < (int)seq->fork_samplers.size()) seq->fork_samplers[index].reset();
  }
  if (p.empty()) finish(seq);
}

void SequenceGroups::finish(Sequence* seq) {
  sched_.remove(seq);
  seq->status = SeqStatus::FINISHED;
  const std::string id = seq->id;  // seq dies with its group entry
  auto it = groups_.find(id);
  Group& group = it->second;
  group.erase(std::find_if(group.begin(), group.end(), [&](const auto& p) { return p.get() == seq; }));
  if (!group.empty()) return;
  groups_.erase(it);
  released_(id);
}

const SequenceGroups::Group* SequenceGroups::find(const std::string& id) const {
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : &it->second;
}

std::vector<std::string> SequenceGroups::ids() const {
  std::vector<std::string> out;
  for (const auto& [id, group] : groups_) out.push_back(id);
  return out;
}

}  // namespace pyserve
