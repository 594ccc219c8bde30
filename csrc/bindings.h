// bindings.h: what the two pybind11 files share (bindings.cpp: the engine; bindings_testing.cpp: its parts
// alone, for tests).
#pragma once

#include <pybind11/pybind11.h>

#include "sampler.h"

namespace pyserve {

// Sampler parameters from a dict of SamplingParams.engine_sampling()'s keys. Throws std::invalid_argument
// (ValueError) naming the parameter for an unknown key or a value that does not convert.
SamplingConfig config_from_kwargs(const pybind11::dict& kw);

// Binds SpmTokenizer (bindings_tokenizer.cpp) into `m`.
void bind_tokenizer(pybind11::module_& m);

// Binds the harnesses into `m` (the `testing` submodule of _engine).
void bind_testing(pybind11::module_& m);

}  // namespace pyserve
