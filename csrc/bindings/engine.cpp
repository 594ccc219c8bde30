// engine: the engine as Python drives it — EngineConfig (bound field by field from one list,
// PYSERVE_ENGINE_CONFIG_FIELDS), kv_geometry, Engine (load, calibrate, add / check / abort, step, stats) and
// EngineLoop (the same on its own thread), and NgramIndex for tests of drafting.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <stdexcept>

#include "bindings/bindings.h"
#include "engine/engine.h"
#include "engine/engine_loop.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "sampling/grammar.h"
#include "scheduler/ngram_draft.h"

namespace py = pybind11;

namespace pyserve {

namespace {

py::dict hparams_dict(const HParams& h) {
  return py::dict(py::arg("arch") = h.arch, py::arg("n_vocab") = h.n_vocab, py::arg("n_embd") = h.n_embd,
                  py::arg("n_layer") = h.n_layer, py::arg("n_head") = h.n_head, py::arg("n_head_kv") = h.n_head_kv,
                  py::arg("head_dim") = h.head_dim, py::arg("n_ff") = h.n_ff, py::arg("n_ctx_train") = h.n_ctx_train,
                  py::arg("n_swa") = h.n_swa, py::arg("n_expert") = h.moe.n_expert,
                  py::arg("n_expert_used") = h.moe.n_used, py::arg("pooling_type") = h.pooling_type,
                  py::arg("n_cls_out") = h.n_cls_out, py::arg("n_recurrent") = h.n_recurrent());
}

py::dict config_dict(const EngineConfig& c) {
  py::dict d;
#define PYSERVE_CONFIG_ITEM(f) d[#f] = c.f;
  PYSERVE_ENGINE_CONFIG_FIELDS(PYSERVE_CONFIG_ITEM)
#undef PYSERVE_CONFIG_ITEM
  return d;
}

// An EngineConfig from keyword arguments named as its fields (unset ones keep their defaults). An unknown
// name is a TypeError; a value that does not convert a ValueError naming the field.
EngineConfig config_from_py(const py::kwargs& kw) {
  py::object cfg = py::cast(EngineConfig());
  for (auto item : kw) {
    const std::string k = py::str(item.first);
    if (!py::hasattr(cfg, k.c_str()) || k.rfind("_", 0) == 0) throw py::type_error("unknown engine option '" + k + "'");
    try {
      cfg.attr(k.c_str()) = item.second;
    } catch (const py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      throw std::invalid_argument(k + " has the wrong type: " + py::repr(item.second).cast<std::string>());
    }
  }
  return cfg.cast<EngineConfig>();
}

std::unique_ptr<Engine> make_engine(const std::string& path, bool calibrate, const std::string& packed_weights,
                                    const py::kwargs& kw) {
  const EngineConfig c = config_from_py(kw);
  py::gil_scoped_release nogil;
  return std::make_unique<Engine>(path, c, calibrate, packed_weights);
}

// The model file's hyper-parameters and the KV geometry an engine with these options would give it, from
// the header alone (no weights read).
py::dict py_kv_geometry(const std::string& path, const py::kwargs& kw) {
  const EngineConfig c = config_from_py(kw);
  KVGeometry g;
  HParams hp;
  {
    py::gil_scoped_release nogil;
    GGUFFile f(path);
    hp = read_hparams(f);
    g = kv_geometry(hp, c);
  }
  return py::dict(py::arg("n_ctx") = g.n_ctx, py::arg("num_kv_blocks") = g.num_kv_blocks,
                  py::arg("block_size") = g.block_size, py::arg("bytes_per_block") = g.bytes_per_block,
                  py::arg("max_model_len") = g.max_model_len(), py::arg("state_slots") = g.state_slots,
                  py::arg("state_checkpoints") = g.state_checkpoints, py::arg("state_bytes") = g.state_bytes(),
                  py::arg("hparams") = hparams_dict(hp));
}

void bind_engine_config(py::module_& m) {
  py::class_<EngineConfig> cls(m, "EngineConfig", "The engine's options (csrc/engine/engine.h); pyserve.engine.options."
                                                  "EngineOptions is their Python definition");
  cls.def(py::init<>());
#define PYSERVE_CONFIG_FIELD(f) cls.def_readwrite(#f, &EngineConfig::f);
  PYSERVE_ENGINE_CONFIG_FIELDS(PYSERVE_CONFIG_FIELD)
#undef PYSERVE_CONFIG_FIELD
  cls.def("as_dict", &config_dict);
  m.def("check_engine_config", [](const py::kwargs& kw) { check_config(config_from_py(kw)); },
        "Raises the ValueError an Engine with these options (EngineConfig's fields) would raise for them");
  m.def("kv_geometry", &py_kv_geometry, py::arg("path"),
        "-> {n_ctx, num_kv_blocks, block_size, bytes_per_block, max_model_len, state_slots, state_checkpoints, "
        "state_bytes, hparams} for these engine options "
        "(EngineConfig's fields as keywords), from the file's header alone; GGUFError / ModelError / ValueError "
        "as loading would raise them");
}

// What a request asks of the scheduler rather than the sampler (Request's last four fields).
struct Placement {
  std::string cache_salt;
  int priority = 0;
  bool return_progress = false;
  bool write_through = false;
  void apply(Request& r) const {
    r.cache_salt = cache_salt, r.priority = priority, r.return_progress = return_progress;
    r.write_through = write_through;
  }
};

Request make_request(const std::string& id, std::vector<int32_t> prompt, py::handle sampling, int max_tokens,
                     bool ignore_eos, std::vector<int32_t> stop_token_ids, int n, std::optional<int> prompt_logprobs,
                     std::shared_ptr<Matcher> grammar, const Placement& placement) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling = sampling_of(sampling);
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = ignore_eos;
  r.stop.stop_token_ids = std::move(stop_token_ids);
  r.n = n;
  if (prompt_logprobs && *prompt_logprobs < 0)  // None is "none" here; the engine's -1 is not a Python value
    throw std::invalid_argument("prompt_logprobs must be >= 0 or None, got " + std::to_string(*prompt_logprobs));
  r.prompt_logprobs = prompt_logprobs.value_or(-1);
  r.grammar = std::move(grammar);
  placement.apply(r);
  return r;
}

// Binds `name` on an Engine or an EngineLoop with add's Python arguments, building the Request for
// `method` (add, or check: the same validation, nothing queued).
template <class C, class Method>
void def_request(py::class_<C>& cls, const char* name, Method method, const char* doc) {
  cls.def(name, [method](C& self, const std::string& id, std::vector<int32_t> prompt, const py::object& sampling,
                         int max_tokens, bool ignore_eos, std::vector<int32_t> stop_token_ids, int n,
                         std::optional<int> prompt_logprobs, std::shared_ptr<Matcher> grammar, std::string cache_salt,
                         int priority, bool return_progress, bool write_through) {
    (self.*method)(make_request(id, std::move(prompt), sampling, max_tokens, ignore_eos, std::move(stop_token_ids), n,
                                prompt_logprobs, std::move(grammar),
                                {std::move(cache_salt), priority, return_progress, write_through}));
  }, py::arg("request_id"), py::arg("prompt"), py::arg("sampling"), py::arg("max_tokens"),
     py::arg("ignore_eos") = false, py::arg("stop_token_ids") = std::vector<int32_t>{}, py::kw_only(),
     py::arg("n") = 1, py::arg("prompt_logprobs") = py::none(), py::arg("grammar") = py::none(),
     py::arg("cache_salt") = "", py::arg("priority") = 0, py::arg("return_progress") = false,
     py::arg("write_through") = false, doc);
}

Request make_embed(const std::string& id, std::vector<int32_t> prompt, const std::string& pooling, bool normalize,
                   std::string cache_salt = "") {
  Request r;
  r.cache_salt = std::move(cache_salt);
  r.id = id;
  r.prompt = std::move(prompt);
  r.stop.max_tokens = 0;
  if (pooling == "last") r.pooling = Pooling::LAST;
  else if (pooling == "mean") r.pooling = Pooling::MEAN;
  else if (pooling == "rank") r.pooling = Pooling::RANK;
  else throw std::invalid_argument("pooling must be 'last', 'mean' or 'rank', got '" + printable(pooling) + "'");
  r.normalize = normalize;
  return r;
}

// add_embed and check_embed on an Engine or an EngineLoop: an embedding request (Request::pooling).
template <class C, class Add, class Check>
void def_embed(py::class_<C>& cls, Add add, Check check) {
  cls.def("add_embed", [add](C& self, const std::string& id, std::vector<int32_t> prompt, const std::string& pooling,
                             bool normalize, std::string cache_salt) {
            (self.*add)(make_embed(id, std::move(prompt), pooling, normalize, std::move(cache_salt)));
          }, py::arg("request_id"), py::arg("prompt"), py::arg("pooling") = "last", py::arg("normalize") = true,
          py::kw_only(), py::arg("cache_salt") = "",
          "Validates and queues an embedding request (prefill only): its one output (finish_reason 'stop') "
          "carries the pooled final-norm state, 'last' row or 'mean' of the rows, L2-normalised if `normalize`; "
          "'rank': [1] the last row's relevance score through a reranker's classifier head");
  cls.def("check_embed", [check](C& self, std::vector<int32_t> prompt, const std::string& pooling, bool normalize) {
            (self.*check)(make_embed("check", std::move(prompt), pooling, normalize));
          }, py::arg("prompt"), py::arg("pooling") = "last", py::arg("normalize") = true,
          "Raises the ValueError add_embed would raise (a live id aside); queues nothing; thread-safe");
}

py::list engine_step(Engine& e) {
  std::vector<StepOutput> outs;
  {
    py::gil_scoped_release nogil;
    outs = e.step();
  }
  return outputs_to_py(outs);
}

py::list loop_drain(EngineLoop& l) {
  std::vector<StepOutput> outs = l.drain();
  return outputs_to_py(outs);
}

py::array_t<float> logits_array(const std::vector<float>& logits, py::ssize_t rows, py::ssize_t V) {
  py::array_t<float> out({rows, V});
  std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
  return out;
}

py::array_t<float> engine_prompt_logits(Engine& e, const std::vector<int32_t>& tokens,
                                        const std::vector<int32_t>& rows) {
  std::vector<float> logits;
  {
    py::gil_scoped_release nogil;
    logits = e.prompt_logits(tokens, rows);
  }
  const py::ssize_t T = (py::ssize_t)(rows.empty() ? tokens.size() : rows.size());
  return logits_array(logits, T, e.hparams().n_vocab);
}

py::array_t<float> engine_mtp_logits(Engine& e, const std::vector<int32_t>& tokens) {
  std::vector<float> logits;
  {
    py::gil_scoped_release nogil;
    logits = e.mtp_logits(tokens);
  }
  return logits_array(logits, std::max<py::ssize_t>((py::ssize_t)tokens.size() - 1, 0), e.hparams().n_vocab);
}

py::dict engine_stats(Engine& e) {
  EngineStats s = e.stats();
  return py::dict(py::arg("running") = s.running, py::arg("waiting") = s.waiting,
                  py::arg("blocks_total") = s.blocks_total, py::arg("blocks_used") = s.blocks_used,
                  py::arg("preemptions") = s.preemptions, py::arg("steps") = s.steps,
                  py::arg("tokens_computed") = s.tokens_computed,
                  py::arg("prefix_cache_queries") = s.prefix_cache_queries,
                  py::arg("prefix_cache_hits") = s.prefix_cache_hits, py::arg("blocks_cached") = s.blocks_cached,
                  py::arg("state_slots_total") = s.state_slots_total, py::arg("state_slots_used") = s.state_slots_used,
                  py::arg("state_slot_bytes") = s.state_slot_bytes, py::arg("kv_cache_bytes") = s.kv_cache_bytes,
                  py::arg("state_bytes") = s.state_bytes,
                  py::arg("state_checkpoints") = s.state_checkpoints,
                  py::arg("state_checkpoints_total") = s.state_checkpoints_total,
                  py::arg("state_checkpoint_restores") = s.state_checkpoint_restores,
                  py::arg("grammar_matchers") = s.grammar_matchers, py::arg("step_cost") = s.step_cost,
                  py::arg("last_step_s") = s.last_step_s, py::arg("step_buckets") = s.step_buckets,
                  py::arg("step_seconds_sum") = s.step_seconds_sum,
                  py::arg("step_bucket_bounds") = kStepBuckets, py::arg("spec_drafts") = s.spec_drafts,
                  py::arg("spec_draft_tokens") = s.spec_draft_tokens,
                  py::arg("spec_accepted_tokens") = s.spec_accepted_tokens, py::arg("mtp_guesses") = s.mtp_guesses,
                  py::arg("row_costs") = s.row_costs, py::arg("disk_hits") = s.disk.hits,
                  py::arg("disk_misses") = s.disk.misses, py::arg("disk_corrupt") = s.disk.corrupt,
                  py::arg("disk_bytes_read") = s.disk.bytes_read, py::arg("disk_bytes_written") = s.disk.bytes_written,
                  py::arg("disk_write_errors") = s.disk.write_errors, py::arg("disk_bytes") = s.disk.bytes,
                  py::arg("disk_entries") = s.disk.entries);
}

// Engine's construction, its load-time calibration and what it tells of its model.
void def_engine_model(py::class_<Engine>& engine) {
  engine
      .def(py::init(&make_engine), py::arg("path"), py::kw_only(), py::arg("calibrate") = true,
           py::arg("packed_weights") = "",
           "Engine(path, *, calibrate=True, packed_weights='', **options): options named as EngineConfig's "
           "fields (unknown: TypeError); calibrate=False: the timed scratch forwards wait for calibrate(); "
           "packed_weights: a file save_packed_weights wrote, mapped instead of packing the weights when it "
           "holds this model's (any other file: packed as without it); releases the GIL")
      .def_property_readonly("packed_from_file", [](Engine& e) { return e.model().packed_from_file(); },
                             "whether the packed weights were mapped from packed_weights")
      .def_property_readonly("packed_bytes", [](Engine& e) { return e.model().packed_bytes(); })
      .def("save_packed_weights", [](Engine& e, const std::string& path) { e.model().save_packed(path); },
           py::arg("path"), py::call_guard<py::gil_scoped_release>(),
           "writes the packed weights to `path` (replaced; write a temporary name and rename it) for a later "
           "Engine's packed_weights; RuntimeError when a write fails; releases the GIL")
      .def("calibrate", &Engine::calibrate_costs, py::call_guard<py::gil_scoped_release>(),
           "the load's step-cost calibration, if the constructor was told not to run it (once, before the "
           "first step; a no-op otherwise); releases the GIL")
      .def("seed_costs", &Engine::seed_costs, py::arg("step_weights"), py::arg("row_costs"),
           "instead of calibrate(): a past calibration's figures (calibration()); ValueError if they do not fit")
      .def("calibration", [](const Engine& e) {
        auto c = e.calibration();
        return py::dict(py::arg("step_weights") = c.first, py::arg("row_costs") = c.second);
      }, "-> {step_weights: [floor s, s per GMAC] or [], row_costs: [0, T(1), ...] or []}")
      .def_property_readonly("hparams", [](const Engine& e) { return hparams_dict(e.hparams()); })
      .def_property_readonly("config", [](const Engine& e) { return config_dict(e.config()); })
      .def_property_readonly("max_model_len", [](const Engine& e) {
        const EngineConfig& c = e.config();
        return KVGeometry{c.n_ctx, c.num_kv_blocks, c.block_size, 0}.max_model_len();
      }, "tokens one sequence can reach: min(context, the KV pool) (KVGeometry::max_model_len)")
      .def_property_readonly("metadata", [](const Engine& e) { return metadata_dict(e.file()); });
}

// Engine's requests and steps: add / check / abort, step, stats, and the knobs tests fix.
void def_engine_steps(py::class_<Engine>& engine) {
  engine
      .def_property("eos_ids", &Engine::eos_ids, &Engine::set_eos_ids)
      .def("abort", &Engine::abort, py::arg("request_id"), py::arg("index") = -1,
           "index < 0: every sample of the request; else that sample only")
      .def("step", &engine_step, "-> [StepOutput] of one step; releases the GIL")
      .def("has_work", &Engine::has_work)
      .def("persist_kv_cache", &Engine::persist_kv_cache, py::call_guard<py::gil_scoped_release>(),
           "with a disk tier (kv_cache_dir): saves every cached block no request holds, waits for the writes")
      .def("stats", &engine_stats)
      .def("set_price_drafts", &Engine::set_price_drafts, py::arg("on"),
           "False: every drafted row that fits is taken (drafting independent of timings, for tests)")
      .def("set_row_costs", &Engine::set_row_costs, py::arg("seconds"),
           "Drafted rows priced on these fixed forward times ([r] = seconds of r rows, [0] = 0), no longer "
           "followed: drafting independent of timings, for tests of the pricing")
      .def("prompt_logits", &engine_prompt_logits, py::arg("tokens"), py::arg("rows") = std::vector<int32_t>{})
      .def("mtp_logits", &engine_mtp_logits, py::arg("tokens"),
           "MTP drafting: the MTP layer's logits of a fresh sequence, row t joining the target's state at t "
           "with tokens[t + 1] ([len - 1 × n_vocab], each a guess at tokens[t + 2]); for tests");
  def_request(engine, "add", &Engine::add,
              "Validates (as check_request; also refuses an id already live) and queues the request");
  def_request(engine, "check_request", &Engine::check,
              "Raises the ValueError add would raise for these arguments (a live id aside); queues nothing; "
              "thread-safe");
  def_embed(engine, &Engine::add, &Engine::check);
}

void bind_engine_loop(py::module_& m) {
  py::class_<EngineLoop> loop(m, "EngineLoop");
  loop
      .def(py::init<Engine&>(), py::arg("engine"), py::keep_alive<1, 2>())
      .def("start", &EngineLoop::start)
      .def("stop", &EngineLoop::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("fd", &EngineLoop::fd)
      .def("abort", &EngineLoop::abort, py::arg("request_id"), py::arg("index") = -1,
           "thread-safe, never blocks on a step; index < 0: every sample")
      .def("drain", &loop_drain, "-> [StepOutput] since the last drain; resets the fd");
  def_request(loop, "add", &EngineLoop::add, "Engine.add, then wakes the loop; thread-safe");
  def_request(loop, "check_request", &EngineLoop::check, "Engine.check_request; thread-safe, queues nothing");
  def_embed(loop, &EngineLoop::add, &EngineLoop::check);
}

void bind_runtime(py::module_& m) {
  py::class_<NgramIndex>(m, "NgramIndex", "A sequence's prompt-lookup index (ngram_draft.h), for tests")
      .def(py::init<>())
      .def("extend", &NgramIndex::extend, py::arg("tokens"), "indexes the tokens appended since the last call")
      .def("propose", &NgramIndex::propose, py::arg("tokens"), py::arg("k"),
           "-> up to k tokens that followed the latest earlier occurrence of the longest suffix (<= 4 tokens)")
      .def_readonly_static("max_ngram", &NgramIndex::kMaxNgram);
}

}  // namespace

void bind_engine(py::module_& m) {
  bind_engine_config(m);
  py::class_<Engine> engine(m, "Engine");
  def_engine_model(engine);
  def_engine_steps(engine);
  bind_engine_loop(m);
  bind_runtime(m);
}

}  // namespace pyserve
