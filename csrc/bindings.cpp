// bindings: the only pybind11 file. C++ exceptions are translated here, once, into Python ones.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <stdexcept>

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
      for (auto kv : v.cast<py::dict>()) c.logit_bias.emplace_back(py::int_(kv.first), kv.second.cast<float>());
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

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "pyserve's C++ engine";
  bind_quant(m);
  bind_sampler(m);
}
