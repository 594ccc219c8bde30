// bindings: the engine as Python sees it (pyserve._engine). C++ exceptions are translated here, once, into
// Python ones; the test harnesses are bindings_testing.cpp's (pyserve._engine.testing).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <stdexcept>

#include "bindings.h"
#include "engine.h"
#include "engine_loop.h"
#include "grammar.h"
#include "llg_api.h"
#include "scheduler.h"
#include "gguf.h"
#include "model.h"
#include "ngram_draft.h"
#include "ops.h"
#include "packed.h"
#include "quant.h"
#include "sampler.h"
#include "simd.h"

namespace py = pybind11;
using namespace pyserve;

namespace pyserve {

// ---- sampling parameters (bindings.h) ----

void set_sampling(SamplingConfig& c, const std::string& k, py::handle v) {
  if (k == "temperature") c.temperature = v.cast<float>();
  else if (k == "top_k") c.top_k = v.cast<int>();
  else if (k == "top_p") c.top_p = v.cast<float>();
  else if (k == "min_p") c.min_p = v.cast<float>();
  else if (k == "repetition_penalty") c.repetition_penalty = v.cast<float>();
  else if (k == "presence_penalty") c.presence_penalty = v.cast<float>();
  else if (k == "frequency_penalty") c.frequency_penalty = v.cast<float>();
  else if (k == "seed") c.seed = v.is_none() ? -1 : v.cast<int64_t>();
  else if (k == "logprobs") c.logprobs = v.is_none() ? -1 : v.cast<int>();
  else if (k == "min_tokens") c.min_tokens = v.cast<int>();
  else if (k == "logit_bias") {
    for (auto kv : v.cast<py::dict>()) c.logit_bias.emplace_back(
        py::int_(py::reinterpret_borrow<py::object>(kv.first)).cast<int32_t>(), kv.second.cast<float>());
  } else throw std::invalid_argument("unknown sampling parameter '" + k + "'");
}

// A value that does not convert is a ValueError naming the parameter, as a value out of range is.
SamplingConfig config_from_kwargs(const py::dict& kw) {
  SamplingConfig c;
  for (auto item : kw) {
    const std::string k = py::str(item.first);
    const auto wrong = [&] {
      return std::invalid_argument(k + " has the wrong type or is out of range: " +
                                   py::repr(item.second).cast<std::string>());
    };
    try {
      set_sampling(c, k, item.second);
    } catch (const py::cast_error&) {
      throw wrong();
    } catch (py::error_already_set& e) {  // a logit_bias key int() refuses
      if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError)) throw;
      throw wrong();
    }
  }
  return c;
}

}  // namespace pyserve

namespace {

// A request's `sampling`: a SamplingConfig (built and checked once, SamplingParams keeps it) or a dict of
// its keys (the native API, converted here).
SamplingConfig sampling_of(py::handle sampling) {
  if (py::isinstance<SamplingConfig>(sampling)) return sampling.cast<const SamplingConfig&>();
  if (!py::isinstance<py::dict>(sampling))
    throw py::type_error("sampling must be a SamplingConfig or a dict, got " + std::string(Py_TYPE(sampling.ptr())->tp_name));
  return config_from_kwargs(sampling.cast<py::dict>());
}

py::dict sampling_bounds() {
  py::dict d;
  for (const Bound& b : kSamplingBounds)
    d[b.name] = py::dict(py::arg("lo") = b.lo, py::arg("hi") = b.hi, py::arg("lo_open") = b.lo_open,
                         py::arg("hi_open") = b.hi_open, py::arg("rule") = b.rule);
  return d;
}

void bind_sampler(py::module_& m) {
  m.def("check_sampling", [](const py::dict& sampling) { check_sampling(config_from_kwargs(sampling)); },
        py::arg("sampling"),
        "Raises ValueError (the message starts with the parameter's name) unless the sampler accepts these "
        "parameters (the kwargs of Sampler / the `sampling` dict of Engine.add); the rules against a "
        "vocabulary (logit_bias ids, logprobs <= n_vocab) are Engine.check_request's.");
  m.def("sampling_bounds", &sampling_bounds,
        "-> {name: {lo, hi, lo_open, hi_open, rule}}: the ranges check_sampling applies (hi = inf: finite)");
  py::class_<SamplingConfig>(m, "SamplingConfig",
      "A request's sampler parameters, converted and checked once (check_sampling's ValueError at construction); "
      "Engine.add and check_request take it as `sampling`")
      .def(py::init([](const py::kwargs& kw) {
        SamplingConfig c = config_from_kwargs(kw);
        check_sampling(c);
        return c;
      }))
      .def_readonly("temperature", &SamplingConfig::temperature)
      .def_readonly("top_k", &SamplingConfig::top_k)
      .def_readonly("top_p", &SamplingConfig::top_p)
      .def_readonly("seed", &SamplingConfig::seed)
      .def_readonly("logprobs", &SamplingConfig::logprobs)
      .def_readonly("logit_bias", &SamplingConfig::logit_bias);
}

// ---- constrained decoding (llguidance) ----

std::shared_ptr<GrammarVocab> make_grammar_vocab(const py::list& token_bytes, const std::vector<int32_t>& eos_ids) {
  std::vector<std::string> toks;
  toks.reserve(token_bytes.size());
  for (auto b : token_bytes) toks.push_back(b.cast<std::string>());
  py::gil_scoped_release nogil;
  return std::make_shared<GrammarVocab>(toks, eos_ids);
}

std::shared_ptr<Matcher> compile_grammar(std::shared_ptr<const GrammarVocab> vocab, const std::string& kind,
                                         const std::string& data) {
  py::gil_scoped_release nogil;  // compiling may take a while: other Python threads (the event loop) go on
  return Matcher::compile(std::move(vocab), kind, data);
}

py::bytes matcher_mask(Matcher& m) {
  std::vector<uint32_t> mask(m.mask_words());
  if (!m.compute_mask(mask.data())) throw std::invalid_argument("grammar: " + m.error());
  return py::bytes(reinterpret_cast<const char*>(mask.data()), mask.size() * 4);
}

void bind_grammar(py::module_& m) {
  m.def("load_llguidance", [](const std::string& path) { load_llguidance(path); }, py::arg("path"),
        "dlopens llguidance's library (once per process); RuntimeError naming the path if it cannot");
  m.def("grammar_matchers_live", &Matcher::live, "matchers alive in the process (compiled or cloned)");
  py::class_<GrammarVocab, std::shared_ptr<GrammarVocab>>(m, "GrammarVocab",
      "llguidance's view of a vocabulary: token_bytes[n_vocab] (specials as b'\\xff' + name), eos_ids")
      .def(py::init(&make_grammar_vocab), py::arg("token_bytes"), py::arg("eos_ids"))
      .def_property_readonly("n_vocab", &GrammarVocab::n_vocab);
  py::class_<Matcher, std::shared_ptr<Matcher>>(m, "Grammar", "a compiled constraint and its state")
      .def_static("compile", &compile_grammar, py::arg("vocab"), py::arg("kind"), py::arg("data"),
                  "kind: 'json_schema', 'regex', 'lark' or 'llguidance'; ValueError with the compiler's message; "
                  "releases the GIL")
      .def("clone", [](const Matcher& g) { return std::shared_ptr<Matcher>(g.clone()); })
      .def_property_readonly("n_vocab", &Matcher::n_vocab)
      .def("mask", &matcher_mask, "-> the allowed ids as bytes of little-endian uint32 words (bit i % 32 of word i / 32)")
      .def("consume", &Matcher::consume, py::arg("token"), "False (and the error state) if the grammar refuses it")
      .def("rollback", &Matcher::rollback, py::arg("n_tokens"))
      .def("is_accepting", &Matcher::accepting)
      .def("is_stopped", &Matcher::stopped)
      .def_property_readonly("error", &Matcher::error);
}

// ---- GGUF files ----

// A string from a file as a Python str: bytes that are not valid UTF-8 (vocabulary pieces, or a damaged file)
// kept lossless as surrogate escapes, never a UnicodeDecodeError.
py::str file_str(const std::string& x) {
  PyObject* o = PyUnicode_DecodeUTF8(x.data(), (Py_ssize_t)x.size(), "surrogateescape");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

py::object to_py(const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::STRING: return file_str(v.s);
    case GGUFType::BOOL: return py::bool_(v.i != 0);
    case GGUFType::FLOAT32: case GGUFType::FLOAT64: return py::float_(v.f);
    case GGUFType::UINT64: return py::int_((uint64_t)v.i);
    case GGUFType::ARRAY: break;
    default: return py::int_(v.i);
  }
  py::list out;
  if (v.elem_type == GGUFType::STRING) {
    for (const std::string& x : v.as) out.append(file_str(x));
  } else if (v.elem_type == GGUFType::BOOL) {
    for (int64_t x : v.ai) out.append(py::bool_(x != 0));
  } else if (v.elem_type == GGUFType::UINT64) {
    for (int64_t x : v.ai) out.append(py::int_((uint64_t)x));
  } else {
    for (int64_t x : v.ai) out.append(py::int_(x));
    for (double x : v.af) out.append(py::float_(x));
    for (const GGUFValue& x : v.aa) out.append(to_py(x));
  }
  return out;
}

// max_array >= 0: arrays longer than that are left out (a vocabulary's ~260k strings are most of the work)
py::dict metadata_dict(const GGUFFile& f, int64_t max_array = -1) {
  py::dict d;
  for (const auto& [k, v] : f.metadata())
    if (max_array < 0 || v.type != GGUFType::ARRAY || (int64_t)v.size() <= max_array) d[file_str(k)] = to_py(v);
  return d;
}

py::list tensor_list(const GGUFFile& f) {
  py::list out;
  for (const GGUFTensor& t : f.tensors()) {
    py::list shape;
    for (int d = 0; d < t.n_dims; d++) shape.append(t.ne[d]);
    out.append(py::dict(py::arg("name") = file_str(t.name), py::arg("type") = (uint32_t)t.type,
                        py::arg("type_name") = type_traits((uint32_t)t.type)->name, py::arg("shape") = shape,
                        py::arg("offset") = t.offset, py::arg("nbytes") = t.nbytes));
  }
  return out;
}

void bind_gguf(py::module_& m) {
  m.def("read_gguf", [](const std::string& path, int64_t max_array) {
    std::unique_ptr<GGUFFile> f;
    {
      py::gil_scoped_release nogil;
      f = std::make_unique<GGUFFile>(path);
    }
    return py::make_tuple(metadata_dict(*f, max_array), tensor_list(*f), f->version());
  }, py::arg("path"), py::arg("max_array") = -1,
        "-> (metadata: dict, tensors: list[dict], version); max_array >= 0 leaves out arrays longer than that. "
        "Raises GGUFError on a malformed file; parses with the GIL released.");
  m.def("tensor_data", [](const std::string& path, const py::str& py_name) {
    // names come back from read_gguf with surrogate escapes for non-UTF-8 bytes: encode them the same way
    PyObject* b = PyUnicode_AsEncodedString(py_name.ptr(), "utf-8", "surrogateescape");
    if (!b) throw py::error_already_set();
    const std::string name = py::reinterpret_steal<py::bytes>(b);
    GGUFFile f(path);
    const GGUFTensor* t = f.find(name);
    if (!t) throw std::invalid_argument(printable("no tensor '" + name + "' in " + path));
    return py::bytes(reinterpret_cast<const char*>(t->data), t->nbytes);
  }, py::arg("path"), py::arg("name"), "raw bytes of one tensor");
}

// ---- engine ----

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
  py::class_<EngineConfig> cls(m, "EngineConfig", "The engine's options (csrc/engine.h); pyserve.engine.options."
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

Request make_request(const std::string& id, std::vector<int32_t> prompt, py::handle sampling, int max_tokens,
                     bool ignore_eos, std::vector<int32_t> stop_token_ids, int n, std::optional<int> prompt_logprobs,
                     std::shared_ptr<Matcher> grammar) {
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
  return r;
}

// Binds `name` on an Engine or an EngineLoop with add's Python arguments, building the Request for
// `method` (add, or check: the same validation, nothing queued).
template <class C, class Method>
void def_request(py::class_<C>& cls, const char* name, Method method, const char* doc) {
  cls.def(name, [method](C& self, const std::string& id, std::vector<int32_t> prompt, const py::object& sampling,
                         int max_tokens, bool ignore_eos, std::vector<int32_t> stop_token_ids, int n,
                         std::optional<int> prompt_logprobs, std::shared_ptr<Matcher> grammar) {
    (self.*method)(make_request(id, std::move(prompt), sampling, max_tokens, ignore_eos, std::move(stop_token_ids), n,
                                prompt_logprobs, std::move(grammar)));
  }, py::arg("request_id"), py::arg("prompt"), py::arg("sampling"), py::arg("max_tokens"),
     py::arg("ignore_eos") = false, py::arg("stop_token_ids") = std::vector<int32_t>{}, py::kw_only(),
     py::arg("n") = 1, py::arg("prompt_logprobs") = py::none(), py::arg("grammar") = py::none(), doc);
}

Request make_embed(const std::string& id, std::vector<int32_t> prompt, const std::string& pooling, bool normalize) {
  Request r;
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
                             bool normalize) { (self.*add)(make_embed(id, std::move(prompt), pooling, normalize)); },
          py::arg("request_id"), py::arg("prompt"), py::arg("pooling") = "last", py::arg("normalize") = true,
          "Validates and queues an embedding request (prefill only): its one output (finish_reason 'stop') "
          "carries the pooled final-norm state, 'last' row or 'mean' of the rows, L2-normalised if `normalize`; "
          "'rank': [1] the last row's relevance score through a reranker's classifier head");
  cls.def("check_embed", [check](C& self, std::vector<int32_t> prompt, const std::string& pooling, bool normalize) {
            (self.*check)(make_embed("check", std::move(prompt), pooling, normalize));
          }, py::arg("prompt"), py::arg("pooling") = "last", py::arg("normalize") = true,
          "Raises the ValueError add_embed would raise (a live id aside); queues nothing; thread-safe");
}

// One prompt position per entry, None for position 0 (nothing precedes it), else {prompt token: logprob,
// then its top alternatives} (the shape of a generated token's logprobs entry).
py::object prompt_logprobs_to_py(const std::shared_ptr<const std::vector<SampleResult>>& lp) {
  if (!lp) return py::none();
  py::list l;
  l.append(py::none());
  for (const SampleResult& r : *lp) {
    py::dict d;
    d[py::int_(r.token)] = r.logprob;
    for (const auto& [id, v] : r.top) {
      py::int_ key(id);
      if (!d.contains(key)) d[key] = v;
    }
    l.append(std::move(d));
  }
  return l;
}

py::object embedding_to_py(const std::vector<float>& e) {
  if (e.empty()) return py::none();
  py::array_t<float> a((py::ssize_t)e.size());
  std::memcpy(a.mutable_data(), e.data(), e.size() * sizeof(float));
  return a;
}

// A step's outputs cross as StepOutput: a struct sequence (a named tuple made in C, as os.stat_result), so
// building one costs what a tuple costs and each named field reads at C speed — it is on every token's path.
PyStructSequence_Field kStepOutputFields[] = {
    {"request_id", "the engine-side request id"},
    {"token", "the token drawn (-1: none, e.g. an abort or an embedding)"},
    {"logprob", "its raw log-probability"},
    {"top", "[(token, logprob)] of the top alternatives, best first"},
    {"finish_reason", "'' while the sample goes on, else 'stop', 'length', 'abort' or 'error: …'"},
    {"n_prompt", "prompt tokens"},
    {"index", "the sample, 0 … n-1"},
    {"scheduled_ts", "time.monotonic() of the step that first scheduled it (0: never)"},
    {"step_ts", "time.monotonic() at the end of this step's forward"},
    {"n_cached", "prompt tokens the prefix cache served"},
    {"embedding", "float32 [n_embd] on an embedding's output ([1] the score of a 'rank' one), else None"},
    {"prompt_logprobs", "[None, {token: logprob, …} per position 1 …] on the first output of a request that "
                        "asked for them, else None"},
    {nullptr, nullptr}};
PyStructSequence_Desc kStepOutputDesc = {"pyserve._engine.StepOutput", "one sample's output of one engine step",
                                         kStepOutputFields, 12};
PyTypeObject* step_output_type = nullptr;

py::object step_output_to_py(StepOutput& o) {
  PyObject* t = PyStructSequence_New(step_output_type);
  if (!t) throw py::error_already_set();
  py::object items[] = {py::str(o.id), py::int_(o.token), py::float_(o.logprob), py::cast(o.top),
                        py::str(o.finish_reason), py::int_(o.n_prompt), py::int_(o.index),
                        py::float_(o.scheduled_ts), py::float_(o.step_ts), py::int_(o.n_cached),
                        embedding_to_py(o.embedding), prompt_logprobs_to_py(o.prompt_logprobs)};
  for (int i = 0; i < 12; i++) PyStructSequence_SetItem(t, i, items[i].release().ptr());  // steals the reference
  return py::reinterpret_steal<py::object>(t);
}

py::list outputs_to_py(std::vector<StepOutput>& outs) {
  py::list l(outs.size());
  for (size_t i = 0; i < outs.size(); i++) l[i] = step_output_to_py(outs[i]);
  return l;
}

void bind_step_output(py::module_& m) {
  step_output_type = PyStructSequence_NewType(&kStepOutputDesc);
  if (!step_output_type) throw py::error_already_set();
  m.attr("StepOutput") = py::reinterpret_steal<py::object>((PyObject*)step_output_type);
  Py_INCREF(step_output_type);  // the module's reference above, and this file's pointer
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
                  py::arg("row_costs") = s.row_costs);
}

// _engine.ContextLengthError(ValueError) with the C++ error's numbers as attributes: max_len, n_prompt,
// max_tokens.
void bind_context_length_error(py::module_& m) {
  static py::handle type = PyErr_NewExceptionWithDoc(
      "pyserve._engine.ContextLengthError", "prompt + max_tokens exceeds what one sequence can hold",
      PyExc_ValueError, nullptr);
  if (!type) throw py::error_already_set();
  m.attr("ContextLengthError") = type;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ContextLengthError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(type)(e.what());
      exc.attr("max_len") = e.max_len, exc.attr("n_prompt") = e.n_prompt, exc.attr("max_tokens") = e.max_tokens;
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });
}

void bind_engine(py::module_& m) {
  bind_engine_config(m);
  bind_step_output(m);
  py::class_<Engine> engine(m, "Engine");
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
      .def_property_readonly("metadata", [](const Engine& e) { return metadata_dict(e.file()); })
      .def_property("eos_ids", &Engine::eos_ids, &Engine::set_eos_ids)
      .def("abort", &Engine::abort, py::arg("request_id"), py::arg("index") = -1,
           "index < 0: every sample of the request; else that sample only")
      .def("step", &engine_step, "-> [StepOutput] of one step; releases the GIL")
      .def("has_work", &Engine::has_work)
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

PYBIND11_MODULE(_engine, m) {
  m.doc() = "pyserve's C++ engine";
  // GGUFError and ModelError are ValueErrors; std::invalid_argument is ValueError too (pybind11's default).
  py::register_exception<GGUFError>(m, "GGUFError", PyExc_ValueError);
  py::register_exception<ModelError>(m, "ModelError", PyExc_ValueError);
  bind_context_length_error(m);
  m.attr("supported_architectures") = supported_architectures();
  m.attr("packed_layout") = packed_layout();  // packed_file.h: a packed-weights file names the layout it holds
  bind_sampler(m);
  bind_gguf(m);
  bind_grammar(m);
  bind_engine(m);
  bind_runtime(m);
  bind_tokenizer(m);
  py::module_ testing = m.def_submodule("testing", "the engine's parts alone, for tests and benchmarks: kernels, "
                                                  "the sampler, the block manager, the scheduler over a simulated model");
  bind_testing(testing);
}
