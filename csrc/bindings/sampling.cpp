// sampling: a request's sampler parameters (SamplingConfig, check_sampling, the ranges the HTTP fields take)
// and llguidance's constraints (GrammarVocab, Grammar) as pyserve._engine sees them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "bindings/bindings.h"
#include "sampling/grammar.h"
#include "sampling/llg_api.h"
#include "sampling/sampler.h"

namespace py = pybind11;

namespace pyserve {

// ---- sampling parameters (bindings.h) ----

namespace {

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

}  // namespace

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

SamplingConfig sampling_of(py::handle sampling) {
  if (py::isinstance<SamplingConfig>(sampling)) return sampling.cast<const SamplingConfig&>();
  if (!py::isinstance<py::dict>(sampling))
    throw py::type_error("sampling must be a SamplingConfig or a dict, got " + std::string(Py_TYPE(sampling.ptr())->tp_name));
  return config_from_kwargs(sampling.cast<py::dict>());
}

namespace {

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

}  // namespace

void bind_sampling(py::module_& m) {
  bind_sampler(m);
  bind_grammar(m);
}

}  // namespace pyserve
