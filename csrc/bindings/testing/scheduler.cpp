// scheduler: the block manager over numbered tables, and the Scheduler with the engine's own lifecycle
// (SequenceGroups) over a simulated model (SchedulerSim), no model loaded.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/testing/testing.h"
#include "scheduler/block_manager.h"
#include "scheduler/scheduler.h"
#include "scheduler/sequence.h"
#include "scheduler/sequence_groups.h"
#include "scheduler/step_cost.h"

namespace py = pybind11;

namespace pyserve {

namespace {

class PyBlockManager {
 public:
  PyBlockManager(int num_blocks, int block_size, bool prefix_caching) : bm_(num_blocks, block_size, prefix_caching) {}
  BlockManager& bm() { return bm_; }
  BlockTable& table(int id) { return tables_[id]; }
  const BlockTable& table_or_throw(int id) const {
    auto it = tables_.find(id);
    if (it == tables_.end()) throw std::invalid_argument("no table " + std::to_string(id));
    return it->second;
  }
  // Admission with the cached prefix: -> hit tokens, or -1 (nothing changed) when blocks are short.
  int allocate(int id, const std::vector<int32_t>& tokens, int n_tokens) {
    std::vector<int32_t> prefix = bm_.lookup(tokens);
    if (!bm_.can_allocate(prefix, n_tokens)) return -1;
    return bm_.allocate(tables_[id], tokens, prefix, n_tokens);
  }
  py::object append(int id, int n_computed, int n_tokens) {
    std::vector<BlockCopy> copies;
    if (!bm_.append(tables_[id], n_computed, n_tokens, &copies)) return py::none();
    return py::cast(copies);
  }
  void fork(int src, int dst) { bm_.fork(table_or_throw(src), tables_[dst]); }
  void free(int id) {
    auto it = tables_.find(id);
    if (it == tables_.end()) return;
    bm_.free(it->second);
    tables_.erase(it);
  }
 private:
  BlockManager bm_;
  std::map<int, BlockTable> tables_;
};

// Drives the real Scheduler with fake sequences through the engine's own lifecycle (SequenceGroups: admission,
// the fork of n > 1 requests, finishes and aborts): a step marks the scheduled tokens computed and gives each
// sampling sequence a made-up token (1000 × (index + 1) + its generated count). Everything the engine does
// but the forward and the sampler.
class SchedulerSim {
 public:
  SchedulerSim(int num_blocks, int block_size, int max_num_seqs, int max_batched_tokens, bool prefix_caching,
               int spec_rows)
      : bm_(num_blocks, block_size, prefix_caching),
        sched_(SchedulerConfig{max_num_seqs, max_batched_tokens, block_size, 16, spec_rows}, bm_),
        groups_(sched_, [](const std::string&) {}),
        max_num_seqs_(max_num_seqs) {}

  // Plans against a fixed step-cost model: MACs per row / sampled row / context position, a floor (s) and a
  // rate (s per GMAC).
  void set_step_target(double seconds, const std::array<double, 3>& macs, double floor_s, double s_per_gmac) {
    cost_ = StepCostModel(StepMacs{macs[0], macs[1], macs[2]});
    cost_.set_weights(floor_s, s_per_gmac);
    sched_.set_step_target(seconds, &cost_);
  }
  // Prices drafted rows: seconds[r] is what a step of r rows takes (seconds[0] = 0).
  void set_row_costs(std::vector<double> seconds) {
    row_costs_.seconds = std::move(seconds);
    sched_.set_row_costs(&row_costs_);
  }

  void add(const std::string& id, std::vector<int32_t> tokens, int max_tokens, int n, int priority,
           const std::string& cache_salt) {
    if (tokens.empty() || max_tokens < 1 || n < 1 || n > max_num_seqs_)
      throw std::invalid_argument("empty prompt, max_tokens < 1, or n outside [1, max_num_seqs]");
    if (groups_.contains(id)) throw std::invalid_argument("duplicate request id '" + id + "'");
    StopConfig stop;
    stop.max_tokens = max_tokens;
    auto seq = request_sequence(id, std::move(tokens), std::move(stop), n);
    seq->priority = priority;
    seq->blocks.root = BlockManager::salted_root(cache_salt);  // as Engine::add
    groups_.admit(std::move(seq));
  }

  // Ends sample `index` of the request (< 0: all of them) at once, as the engine's next step would.
  void abort(const std::string& id, int index) { groups_.abort(id, index, [](const Sequence&, int) {}); }

  // drafts: {(id, index): tokens} proposed for decoding sequences this step (the engine's n-gram drafts); a
  // drafted token is accepted while it equals the made-up token the sim draws there.
  using Drafts = std::map<std::pair<std::string, int>, std::vector<int32_t>>;
  py::dict step(const Drafts& drafts) {
    for (Sequence* s : sched_.running()) {
      auto it = drafts.find({s->id, index_of(s)});
      s->draft = it != drafts.end() && s->n_pending() == 1 ? it->second : std::vector<int32_t>{};
      if (!s->draft.empty()) s->draft_policy.tick();
    }
    Schedule sc = sched_.schedule();
    py::list scheduled, finished, tokens;
    for (const ScheduledSeq& s : sc.seqs)
      scheduled.append(py::make_tuple(s.seq->id, index_of(s.seq), s.seq->n_computed, s.n_tokens, s.sample));
    for (const ScheduledSeq& s : sc.seqs)
      for (Sequence* d : groups_.computed(s)) draw(d, tokens, finished);
    return py::dict(py::arg("scheduled") = scheduled, py::arg("copies") = sc.copies, py::arg("tokens") = tokens,
                    py::arg("finished") = finished);
  }

  py::list running() const {
    py::list l;
    for (Sequence* s : sched_.running()) l.append(py::make_tuple(s->id, index_of(s)));
    return l;
  }
  py::list waiting() const {
    py::list l;
    for (Sequence* s : sched_.waiting()) l.append(py::make_tuple(s->id, index_of(s)));
    return l;
  }
  const Sequence& seq(const std::string& id, int index) const {
    if (const SequenceGroups::Group* g = groups_.find(id))
      for (auto& s : *g)
        if (index_of(s.get()) == index) return *s;
    throw std::invalid_argument("no live sequence '" + id + "' #" + std::to_string(index));
  }
  py::dict stats() const {
    return py::dict(py::arg("running") = sched_.num_running(), py::arg("waiting") = sched_.num_waiting(),
                    py::arg("preemptions") = sched_.num_preemptions(), py::arg("blocks_total") = bm_.num_blocks(),
                    py::arg("blocks_used") = bm_.num_used(), py::arg("blocks_cached") = bm_.num_cached(),
                    py::arg("blocks_free") = bm_.num_free(), py::arg("prefix_cache_queries") = bm_.queried_tokens(),
                    py::arg("prefix_cache_hits") = bm_.hit_tokens());
  }
  const BlockManager& bm() const { return bm_; }
  bool has_work() const { return !groups_.empty(); }

 private:
  // A sequence not forked yet answers to its first pending sample.
  static int index_of(const Sequence* s) { return s->pending_samples.empty() ? s->index : s->pending_samples[0]; }

  // d's made-up tokens: one, then one more per drafted token that matched, as the engine's verification.
  void draw(Sequence* d, py::list& tokens, py::list& finished) {
    bool done = false;
    for (size_t j = 0;; j++) {
      const int32_t tok = 1000 * (d->index + 1) + d->n_generated();
      d->tokens.push_back(tok);
      tokens.append(py::make_tuple(d->id, d->index, tok));
      done = d->n_generated() >= d->stop.max_tokens;
      if (done || j == d->draft.size() || tok != d->draft[j]) break;
    }
    if (done) finished.append(py::make_tuple(d->id, d->index));  // before drawn() ends d
    groups_.drawn(d, done);
  }

  BlockManager bm_;  // before sched_, which holds a reference to it
  Scheduler sched_;  // before groups_, likewise
  SequenceGroups groups_;
  StepCostModel cost_;
  RowCosts row_costs_;
  int max_num_seqs_;
};

}  // namespace

void bind_testing_blocks(py::module_& m) {
  py::class_<PyBlockManager>(m, "BlockManager", "The engine's KV block manager over numbered tables, no model.")
      .def(py::init<int, int, bool>(), py::arg("num_blocks"), py::arg("block_size"), py::arg("prefix_caching") = true)
      .def_property_readonly("num_blocks", [](PyBlockManager& b) { return b.bm().num_blocks(); })
      .def_property_readonly("block_size", [](PyBlockManager& b) { return b.bm().block_size(); })
      .def_property_readonly("num_free", [](PyBlockManager& b) { return b.bm().num_free(); })
      .def_property_readonly("num_used", [](PyBlockManager& b) { return b.bm().num_used(); })
      .def_property_readonly("num_cached", [](PyBlockManager& b) { return b.bm().num_cached(); })
      .def_property_readonly("queried_tokens", [](PyBlockManager& b) { return b.bm().queried_tokens(); })
      .def_property_readonly("hit_tokens", [](PyBlockManager& b) { return b.bm().hit_tokens(); })
      .def("ref_count", [](PyBlockManager& b, int blk) { return b.bm().ref_count(blk); })
      .def("is_cached", [](PyBlockManager& b, int blk) { return b.bm().is_cached(blk); })
      .def("allocate_block", [](PyBlockManager& b) { return b.bm().allocate_block(); })
      .def("release", [](PyBlockManager& b, int blk) { return b.bm().release(blk); })
      .def("lookup", [](PyBlockManager& b, const std::vector<int32_t>& t, const std::string& salt) {
             return b.bm().lookup(t, BlockManager::salted_root(salt));
           }, py::arg("tokens"), py::arg("cache_salt") = "",
           "-> the cached prefix's block ids under that salt's root (never the last token's block)")
      .def("can_allocate", [](PyBlockManager& b, const std::vector<int32_t>& tokens, int n_tokens) {
             return b.bm().can_allocate(b.bm().lookup(tokens), n_tokens);
           }, py::arg("tokens"), py::arg("n_tokens"))
      .def("allocate", &PyBlockManager::allocate, py::arg("table"), py::arg("tokens"), py::arg("n_tokens"),
           "-> hit tokens, or -1 when blocks are short")
      .def("append", &PyBlockManager::append, py::arg("table"), py::arg("n_computed"), py::arg("n_tokens"),
           "-> [(src, dst)] copies, or None when blocks are short")
      .def("commit", [](PyBlockManager& b, int id, const std::vector<int32_t>& tokens, int n_computed) {
             b.bm().commit(b.table(id), tokens, n_computed);
           }, py::arg("table"), py::arg("tokens"), py::arg("n_computed"))
      .def("fork", &PyBlockManager::fork, py::arg("src"), py::arg("dst"))
      .def("free", &PyBlockManager::free, py::arg("table"))
      .def("table", [](PyBlockManager& b, int id) { return b.table_or_throw(id).blocks; }, py::arg("table"))
      .def_static("hash_block", [](uint64_t parent, const std::vector<int32_t>& t) {
        return BlockManager::hash_block(parent, t.data(), (int)t.size());
      });
}

void bind_testing_scheduler(py::module_& m) {
  py::class_<SchedulerSim>(m, "SchedulerSim", "The engine's scheduler over fake sequences, no model.")
      .def(py::init<int, int, int, int, bool, int>(), py::arg("num_blocks"), py::arg("block_size") = 16,
           py::arg("max_num_seqs") = 64, py::arg("max_batched_tokens") = 512, py::arg("prefix_caching") = true,
           py::arg("spec_rows") = 8)
      .def("add", &SchedulerSim::add, py::arg("request_id"), py::arg("tokens"), py::arg("max_tokens"),
           py::arg("n") = 1, py::kw_only(), py::arg("priority") = 0, py::arg("cache_salt") = "",
           "queues a request: priority lower first, cache_salt \"\" the shared prefix cache")
      .def("abort", &SchedulerSim::abort, py::arg("request_id"), py::arg("index") = -1,
           "ends sample `index` of the request (-1: every sample), its blocks back to the pool")
      .def("step", &SchedulerSim::step, py::arg("drafts") = SchedulerSim::Drafts{},
           "drafts {(id, index): tokens} for decoding sequences -> {scheduled: [(id, index, n_computed, "
           "n_tokens, sample)], copies: [(src, dst)], "
           "tokens: [(id, index, token)], finished: [(id, index)]}")
      .def("has_work", &SchedulerSim::has_work)
      .def("set_step_target", &SchedulerSim::set_step_target, py::arg("seconds"), py::arg("macs"),
           py::arg("floor_s"), py::arg("s_per_gmac"),
           "plan each step under `seconds` with a fixed cost model: macs = (per row, per sampled row, per "
           "context position), step time = floor_s + s_per_gmac × GMACs")
      .def("set_row_costs", &SchedulerSim::set_row_costs, py::arg("seconds"),
           "price drafted rows: seconds[r] a step of r rows takes (seconds[0] = 0)")
      .def("running", &SchedulerSim::running, "[(id, index)] by priority, then admission order")
      .def("waiting", &SchedulerSim::waiting, "[(id, index)], next first (by priority, then arrival)")
      .def("table", [](const SchedulerSim& s, const std::string& id, int i) { return s.seq(id, i).blocks.blocks; },
           py::arg("request_id"), py::arg("index") = 0)
      .def("n_computed", [](const SchedulerSim& s, const std::string& id, int i) { return s.seq(id, i).n_computed; },
           py::arg("request_id"), py::arg("index") = 0)
      .def("tokens", [](const SchedulerSim& s, const std::string& id, int i) { return s.seq(id, i).tokens; },
           py::arg("request_id"), py::arg("index") = 0)
      .def("ref_count", [](const SchedulerSim& s, int blk) { return s.bm().ref_count(blk); })
      .def("stats", &SchedulerSim::stats);
}

}  // namespace pyserve
