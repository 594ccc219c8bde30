// module: pyserve._engine, the engine as Python sees it. C++ exceptions become Python ones here, once:
// GGUFError / ModelError / ContextLengthError (with its numbers) / ValueError (std::invalid_argument); each
// part of the engine is bound by its own file (bindings.h).
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "kernels/packed.h"
#include "model/hparams.h"

namespace py = pybind11;
using namespace pyserve;

namespace {

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

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "pyserve's C++ engine";
  // GGUFError and ModelError are ValueErrors; std::invalid_argument is ValueError too (pybind11's default).
  py::register_exception<GGUFError>(m, "GGUFError", PyExc_ValueError);
  py::register_exception<ModelError>(m, "ModelError", PyExc_ValueError);
  bind_context_length_error(m);
  m.attr("supported_architectures") = supported_architectures();
  m.attr("packed_layout") = packed_layout();  // packed_file.h: a packed-weights file names the layout it holds
  bind_sampling(m);
  bind_gguf(m);
  bind_step_output(m);
  bind_engine(m);
  bind_tokenizer(m);
  py::module_ testing = m.def_submodule("testing", "the engine's parts alone, for tests and benchmarks: kernels, "
                                                  "the sampler, the block manager, the scheduler over a simulated model");
  bind_testing(testing);
}

