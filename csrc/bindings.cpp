// bindings: the only pybind11 file. C++ exceptions are translated here, once, into Python ones.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>

#include "engine.h"
#include "engine_loop.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "sampler.h"

namespace py = pybind11;
using namespace pyserve;

namespace {

using u8array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
using f32array = py::array_t<float, py::array::c_style | py::array::forcecast>;

const TypeTraits& traits_or_throw(uint32_t type) {
  const TypeTraits* tt = type_traits(type);
  if (!tt) throw std::invalid_argument("unsupported GGML type id " + std::to_string(type));
  return *tt;
}

// ---- quant (tests hold the SIMD kernels to their scalar twins and the dequantizers to gguf's) ----

py::array_t<float> py_dequantize(uint32_t type, u8array raw, int64_t n) {
  const TypeTraits& tt = traits_or_throw(type);
  if (n % tt.block_size) throw std::invalid_argument("n is not a multiple of the block size");
  if ((size_t)raw.size() < row_size((GGMLType)type, n)) throw std::invalid_argument("raw data too short");
  py::array_t<float> out(n);
  dequantize_row((GGMLType)type, raw.data(), out.mutable_data(), n);
  return out;
}

std::vector<uint8_t> act_bytes(ActFormat f, const f32array& x) {
  std::vector<uint8_t> buf(act_row_size(f, x.size()));
  quantize_act_row(f, x.data(), buf.data(), x.size());
  return buf;
}

float py_vec_dot(uint32_t type, u8array w_row, f32array x, const std::string& impl) {
  const TypeTraits& tt = traits_or_throw(type);
  int64_t n = x.size();
  if ((size_t)w_row.size() < row_size((GGMLType)type, n)) throw std::invalid_argument("weight row too short");
  std::vector<uint8_t> act = act_bytes(tt.act, x);
  if (impl == "ref") return vec_dot_ref((GGMLType)type, n, w_row.data(), act.data());
  if (impl == "simd") return vec_dot((GGMLType)type, n, w_row.data(), act.data());
  throw std::invalid_argument("impl must be 'ref' or 'simd'");
}

// x: [ncols, n] float32 → out[ncols] via vec_dot_cols
py::array_t<float> py_vec_dot_cols(uint32_t type, u8array w_row, f32array x) {
  const TypeTraits& tt = traits_or_throw(type);
  if (x.ndim() != 2) throw std::invalid_argument("x must be 2-D [ncols, n]");
  int64_t ncols = x.shape(0), n = x.shape(1);
  if ((size_t)w_row.size() < row_size((GGMLType)type, n)) throw std::invalid_argument("weight row too short");
  size_t stride = act_row_size(tt.act, n);
  std::vector<uint8_t> act(stride * ncols);
  for (int64_t c = 0; c < ncols; c++) quantize_act_row(tt.act, x.data(c, 0), act.data() + c * stride, n);
  py::array_t<float> out(ncols);
  vec_dot_cols((GGMLType)type, n, w_row.data(), act.data(), stride, (int)ncols, out.mutable_data());
  return out;
}

// w_rows: [nrows, row_bytes] raw weight rows; x: [ncols, n] → [ncols, nrows] via vec_dot_tile
py::array_t<float> py_vec_dot_tile(uint32_t type, u8array w_rows, f32array x) {
  const TypeTraits& tt = traits_or_throw(type);
  if (w_rows.ndim() != 2 || x.ndim() != 2) throw std::invalid_argument("w_rows and x must be 2-D");
  const int64_t nrows = w_rows.shape(0), ncols = x.shape(0), n = x.shape(1);
  const size_t rb = row_size((GGMLType)type, n);
  if ((size_t)w_rows.shape(1) != rb) throw std::invalid_argument("w_rows' second dimension must be the row size");
  size_t stride = act_row_size(tt.act, n);
  std::vector<uint8_t> act(stride * ncols);
  for (int64_t c = 0; c < ncols; c++) quantize_act_row(tt.act, x.data(c, 0), act.data() + c * stride, n);
  py::array_t<float> out({ncols, nrows});
  vec_dot_tile((GGMLType)type, n, w_rows.data(), rb, nrows, act.data(), stride, (int)ncols, out.mutable_data(), nrows);
  return out;
}

// Round trip of an activation row through its quantized format (for tests of quantize_act_row).
py::array_t<float> py_act_roundtrip(uint32_t type, f32array x) {
  const TypeTraits& tt = traits_or_throw(type);
  int64_t n = x.size();
  std::vector<uint8_t> act = act_bytes(tt.act, x);
  py::array_t<float> out(n);
  float* o = out.mutable_data();
  if (tt.act == ActFormat::F32) {
    std::memcpy(o, act.data(), n * sizeof(float));
  } else if (tt.act == ActFormat::Q8_32) {
    auto* b = reinterpret_cast<const block_q8_32*>(act.data());
    for (int64_t i = 0; i < n; i++) o[i] = b[i / QK].d * b[i / QK].qs[i % QK];
  } else {
    auto* b = reinterpret_cast<const block_q8_K*>(act.data());
    for (int64_t i = 0; i < n; i++) o[i] = b[i / QK_K].d * b[i / QK_K].qs[i % QK_K];
  }
  return out;
}

void bind_quant(py::module_& m) {
  m.def("dequantize", &py_dequantize, py::arg("type"), py::arg("raw"), py::arg("n"),
        "Dequantize n elements of GGML type id `type` from raw bytes.");
  m.def("vec_dot", &py_vec_dot, py::arg("type"), py::arg("w_row"), py::arg("x"), py::arg("impl") = "simd",
        "Dot of one raw weight row with float x (quantized to the type's activation format first).");
  m.def("vec_dot_cols", &py_vec_dot_cols, py::arg("type"), py::arg("w_row"), py::arg("x"));
  m.def("vec_dot_tile", &py_vec_dot_tile, py::arg("type"), py::arg("w_rows"), py::arg("x"));
  m.def("act_roundtrip", &py_act_roundtrip, py::arg("type"), py::arg("x"));
  m.def("type_info", [](uint32_t type) {
    const TypeTraits& tt = traits_or_throw(type);
    return py::dict(py::arg("name") = tt.name, py::arg("block_size") = tt.block_size,
                    py::arg("type_size") = tt.type_size);
  });
}

// ---- sampler (unit-tested on synthetic logits) ----

SamplingConfig config_from_kwargs(const py::dict& kw) {
  SamplingConfig c;
  for (auto item : kw) {
    std::string k = py::str(item.first);
    py::handle v = item.second;
    if (k == "temperature") c.temperature = v.cast<float>();
    else if (k == "top_k") c.top_k = v.cast<int>();
    else if (k == "top_p") c.top_p = v.cast<float>();
    else if (k == "min_p") c.min_p = v.cast<float>();
    else if (k == "repetition_penalty") c.repetition_penalty = v.cast<float>();
    else if (k == "presence_penalty") c.presence_penalty = v.cast<float>();
    else if (k == "frequency_penalty") c.frequency_penalty = v.cast<float>();
    else if (k == "seed") c.seed = v.is_none() ? -1 : v.cast<int64_t>();
    else if (k == "logprobs") c.logprobs = v.is_none() ? -1 : v.cast<int>();
    else if (k == "logit_bias") {
      for (auto kv : v.cast<py::dict>()) c.logit_bias.emplace_back(
          py::int_(py::reinterpret_borrow<py::object>(kv.first)).cast<int32_t>(), kv.second.cast<float>());
    } else throw std::invalid_argument("unknown sampling parameter '" + k + "'");
  }
  return c;
}

class PySampler {
 public:
  PySampler(int n_vocab, const py::kwargs& kw) : s_(config_from_kwargs(kw), n_vocab), n_vocab_(n_vocab) {}
  void set_prompt(const std::vector<int32_t>& p) { s_.set_prompt(p); }
  py::tuple sample(f32array logits) {
    if (logits.size() != n_vocab_) throw std::invalid_argument("logits must have n_vocab elements");
    SampleResult r = s_.sample(logits.data());
    return py::make_tuple(r.token, r.logprob, r.top);
  }
 private:
  Sampler s_;
  int n_vocab_;
};

void bind_sampler(py::module_& m) {
  py::class_<PySampler>(m, "Sampler")
      .def(py::init<int, const py::kwargs&>(), py::arg("n_vocab"))
      .def("set_prompt", &PySampler::set_prompt)
      .def("sample", &PySampler::sample, "-> (token, logprob, [(id, logprob), ...])");
}

// ---- GGUF files ----

py::object to_py(const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::STRING: return py::str(v.s);
    case GGUFType::BOOL: return py::bool_(v.i != 0);
    case GGUFType::FLOAT32: case GGUFType::FLOAT64: return py::float_(v.f);
    case GGUFType::UINT64: return py::int_((uint64_t)v.i);
    case GGUFType::ARRAY: break;
    default: return py::int_(v.i);
  }
  py::list out;
  if (v.elem_type == GGUFType::STRING) {
    for (const std::string& x : v.as) {
      // Vocabularies may hold pieces that are not valid UTF-8: keep them lossless as surrogate escapes.
      PyObject* o = PyUnicode_DecodeUTF8(x.data(), (Py_ssize_t)x.size(), "surrogateescape");
      if (!o) throw py::error_already_set();
      out.append(py::reinterpret_steal<py::object>(o));
    }
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

py::dict metadata_dict(const GGUFFile& f) {
  py::dict d;
  for (const auto& [k, v] : f.metadata()) d[py::str(k)] = to_py(v);
  return d;
}

py::list tensor_list(const GGUFFile& f) {
  py::list out;
  for (const GGUFTensor& t : f.tensors()) {
    py::list shape;
    for (int d = 0; d < t.n_dims; d++) shape.append(t.ne[d]);
    out.append(py::dict(py::arg("name") = t.name, py::arg("type") = (uint32_t)t.type,
                        py::arg("type_name") = type_traits((uint32_t)t.type)->name, py::arg("shape") = shape,
                        py::arg("offset") = t.offset, py::arg("nbytes") = t.nbytes));
  }
  return out;
}

void bind_gguf(py::module_& m) {
  m.def("read_gguf", [](const std::string& path) {
    GGUFFile f(path);
    return py::make_tuple(metadata_dict(f), tensor_list(f), f.version());
  }, py::arg("path"), "-> (metadata: dict, tensors: list[dict], version). Raises GGUFError on a malformed file.");
  m.def("tensor_data", [](const std::string& path, const std::string& name) {
    GGUFFile f(path);
    const GGUFTensor* t = f.find(name);
    if (!t) throw std::invalid_argument("no tensor '" + name + "' in " + path);
    return py::bytes(reinterpret_cast<const char*>(t->data), t->nbytes);
  }, py::arg("path"), py::arg("name"), "raw bytes of one tensor");
}

// ---- engine ----

py::dict hparams_dict(const HParams& h) {
  return py::dict(py::arg("arch") = h.arch, py::arg("n_vocab") = h.n_vocab, py::arg("n_embd") = h.n_embd,
                  py::arg("n_layer") = h.n_layer, py::arg("n_head") = h.n_head, py::arg("n_head_kv") = h.n_head_kv,
                  py::arg("head_dim") = h.head_dim, py::arg("n_ff") = h.n_ff, py::arg("n_ctx_train") = h.n_ctx_train,
                  py::arg("n_swa") = h.n_swa);
}

py::dict config_dict(const EngineConfig& c) {
  return py::dict(py::arg("n_threads") = c.n_threads, py::arg("n_ctx") = c.n_ctx,
                  py::arg("num_kv_blocks") = c.num_kv_blocks, py::arg("block_size") = c.block_size,
                  py::arg("max_num_seqs") = c.max_num_seqs, py::arg("max_batched_tokens") = c.max_batched_tokens);
}

std::unique_ptr<Engine> make_engine(const std::string& path, int n_threads, int n_ctx, int num_kv_blocks,
                                    size_t kv_cache_memory, int block_size, int max_num_seqs, int max_batched_tokens) {
  EngineConfig c;
  c.n_threads = n_threads;
  c.n_ctx = n_ctx;
  c.num_kv_blocks = num_kv_blocks;
  c.kv_cache_memory = kv_cache_memory;
  c.block_size = block_size;
  c.max_num_seqs = max_num_seqs;
  c.max_batched_tokens = max_batched_tokens;
  py::gil_scoped_release nogil;
  return std::make_unique<Engine>(path, c);
}

Request make_request(const std::string& id, std::vector<int32_t> prompt, const py::dict& sampling, int max_tokens,
                     bool ignore_eos, std::vector<int32_t> stop_token_ids) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.sampling = config_from_kwargs(sampling);
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = ignore_eos;
  r.stop.stop_token_ids = std::move(stop_token_ids);
  return r;
}

void engine_add(Engine& e, const std::string& id, std::vector<int32_t> prompt, const py::dict& sampling,
                int max_tokens, bool ignore_eos, std::vector<int32_t> stop_token_ids) {
  e.add(make_request(id, std::move(prompt), sampling, max_tokens, ignore_eos, std::move(stop_token_ids)));
}

void loop_add(EngineLoop& l, const std::string& id, std::vector<int32_t> prompt, const py::dict& sampling,
              int max_tokens, bool ignore_eos, std::vector<int32_t> stop_token_ids) {
  l.add(make_request(id, std::move(prompt), sampling, max_tokens, ignore_eos, std::move(stop_token_ids)));
}

// (id, token, logprob, top, finish_reason, n_prompt) per output
py::list outputs_to_py(std::vector<StepOutput>& outs) {
  py::list l;
  for (StepOutput& o : outs)
    l.append(py::make_tuple(o.id, o.token, o.logprob, o.top, o.finish_reason, o.n_prompt));
  return l;
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

py::array_t<float> engine_prompt_logits(Engine& e, const std::vector<int32_t>& tokens,
                                        const std::vector<int32_t>& rows) {
  std::vector<float> logits;
  {
    py::gil_scoped_release nogil;
    logits = e.prompt_logits(tokens, rows);
  }
  const py::ssize_t V = e.hparams().n_vocab, T = (py::ssize_t)(rows.empty() ? tokens.size() : rows.size());
  py::array_t<float> out({T, V});
  std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
  return out;
}

py::dict engine_stats(Engine& e) {
  EngineStats s = e.stats();
  return py::dict(py::arg("running") = s.running, py::arg("waiting") = s.waiting,
                  py::arg("blocks_total") = s.blocks_total, py::arg("blocks_used") = s.blocks_used,
                  py::arg("preemptions") = s.preemptions, py::arg("steps") = s.steps,
                  py::arg("tokens_computed") = s.tokens_computed);
}

void bind_engine(py::module_& m) {
  py::class_<Engine>(m, "Engine")
      .def(py::init(&make_engine), py::arg("path"), py::arg("n_threads") = 0, py::arg("n_ctx") = 0,
           py::arg("num_kv_blocks") = 0, py::arg("kv_cache_memory") = 0, py::arg("block_size") = 16,
           py::arg("max_num_seqs") = 64, py::arg("max_batched_tokens") = 512)
      .def_property_readonly("hparams", [](const Engine& e) { return hparams_dict(e.hparams()); })
      .def_property_readonly("config", [](const Engine& e) { return config_dict(e.config()); })
      .def_property_readonly("metadata", [](const Engine& e) { return metadata_dict(e.file()); })
      .def_property("eos_ids", &Engine::eos_ids, &Engine::set_eos_ids)
      .def("add", &engine_add, py::arg("request_id"), py::arg("prompt"), py::arg("sampling"), py::arg("max_tokens"),
           py::arg("ignore_eos") = false, py::arg("stop_token_ids") = std::vector<int32_t>{})
      .def("abort", &Engine::abort, py::arg("request_id"))
      .def("step", &engine_step, "-> [(id, token, logprob, top, finish_reason, n_prompt)]; releases the GIL")
      .def("has_work", &Engine::has_work)
      .def("stats", &engine_stats)
      .def("prompt_logits", &engine_prompt_logits, py::arg("tokens"), py::arg("rows") = std::vector<int32_t>{});

  py::class_<EngineLoop>(m, "EngineLoop")
      .def(py::init<Engine&>(), py::arg("engine"), py::keep_alive<1, 2>())
      .def("start", &EngineLoop::start)
      .def("stop", &EngineLoop::stop, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("fd", &EngineLoop::fd)
      .def("add", &loop_add, py::arg("request_id"), py::arg("prompt"), py::arg("sampling"), py::arg("max_tokens"),
           py::arg("ignore_eos") = false, py::arg("stop_token_ids") = std::vector<int32_t>{})
      .def("abort", &EngineLoop::abort, py::arg("request_id"), "thread-safe, never blocks on a step")
      .def("drain", &loop_drain, "-> outputs since the last drain; resets the fd");
}

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "pyserve's C++ engine";
  // GGUFError and ModelError are ValueErrors; std::invalid_argument is ValueError too (pybind11's default).
  py::register_exception<GGUFError>(m, "GGUFError", PyExc_ValueError);
  py::register_exception<ModelError>(m, "ModelError", PyExc_ValueError);
  m.attr("supported_architectures") = supported_architectures();
  bind_quant(m);
  bind_sampler(m);
  bind_gguf(m);
  bind_engine(m);
}
