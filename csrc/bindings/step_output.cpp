// step_output: a step's outputs as Python sees them, StepOutput struct sequences (a named tuple made in C,
// as os.stat_result): building one costs what a tuple costs and each named field reads at C speed — it is
// on every token's path.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <vector>

#include "bindings/bindings.h"
#include "engine/engine.h"

namespace py = pybind11;

namespace pyserve {

namespace {

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
    {"progress", "a progress output (return_progress): the prompt tokens computed so far, cached ones included; "
                 "else 0"},
    {nullptr, nullptr}};
PyStructSequence_Desc kStepOutputDesc = {"pyserve._engine.StepOutput", "one sample's output of one engine step",
                                         kStepOutputFields, 13};
PyTypeObject* step_output_type = nullptr;

py::object step_output_to_py(StepOutput& o) {
  PyObject* t = PyStructSequence_New(step_output_type);
  if (!t) throw py::error_already_set();
  py::object items[] = {py::str(o.id), py::int_(o.token), py::float_(o.logprob), py::cast(o.top),
                        py::str(o.finish_reason), py::int_(o.n_prompt), py::int_(o.index),
                        py::float_(o.scheduled_ts), py::float_(o.step_ts), py::int_(o.n_cached),
                        embedding_to_py(o.embedding), prompt_logprobs_to_py(o.prompt_logprobs), py::int_(o.progress)};
  for (int i = 0; i < 13; i++) PyStructSequence_SetItem(t, i, items[i].release().ptr());  // steals the reference
  return py::reinterpret_steal<py::object>(t);
}

}  // namespace

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

}  // namespace pyserve
