// sampler: the sampler alone, on logits a test gives it (and a grammar, if any).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/testing/testing.h"
#include "sampling/grammar.h"
#include "sampling/sampler.h"

namespace py = pybind11;

namespace pyserve {

namespace {

class PySampler {
 public:
  PySampler(int n_vocab, const py::kwargs& kw) : s_(config_from_kwargs(kw), n_vocab), n_vocab_(n_vocab) {}
  void set_prompt(const std::vector<int32_t>& p) { s_.set_prompt(p); }
  void set_grammar(const std::shared_ptr<Matcher>& g) { s_.set_grammar(g ? g->clone() : nullptr); }
  py::tuple sample(f32array logits) {
    if (logits.size() != n_vocab_) throw std::invalid_argument("logits must have n_vocab elements");
    SampleResult r = s_.sample(logits.data());
    grammar_end_ = r.grammar_end;
    return py::make_tuple(r.token, r.logprob, r.top);
  }
  const std::string& grammar_end() const { return grammar_end_; }
 private:
  Sampler s_;
  int n_vocab_;
  std::string grammar_end_;  // of the last sample
};

}  // namespace

void bind_testing_sampler(py::module_& m) {
  py::class_<PySampler>(m, "Sampler", "the sampler alone, on logits given to it")
      .def(py::init<int, const py::kwargs&>(), py::arg("n_vocab"))
      .def("set_prompt", &PySampler::set_prompt)
      .def("set_grammar", &PySampler::set_grammar, py::arg("grammar"), "draws under a clone of `grammar` (None: free)")
      .def("sample", &PySampler::sample, "-> (token, logprob, [(id, logprob), ...])")
      .def_property_readonly("grammar_end", &PySampler::grammar_end,
                             "the last sample's: 'stop' when it completed the grammar, 'error: …', or ''");
}

}  // namespace pyserve
