// bindings.h: what the files of pyserve._engine share. Each file binds one part of the engine (module.cpp
// puts them together); the test harnesses, pyserve._engine.testing, are testing/'s.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file of the module: a type caster must be the same in all of them

#include <cstdint>
#include <vector>

#include "sampling/sampler.h"

namespace pyserve {

class GGUFFile;
struct StepOutput;

// Sampler parameters from a dict of SamplingParams.engine_sampling()'s keys. Throws std::invalid_argument
// (ValueError) naming the parameter for an unknown key or a value that does not convert.
SamplingConfig config_from_kwargs(const pybind11::dict& kw);

// A request's `sampling`: a SamplingConfig (built and checked once, SamplingParams keeps it) or a dict of
// its keys (the native API, converted here). TypeError for anything else; as config_from_kwargs for a dict.
SamplingConfig sampling_of(pybind11::handle sampling);

// A file's metadata as a dict (strings that are not UTF-8 as surrogate escapes); max_array >= 0 leaves out
// arrays longer than that (a vocabulary's ~260k strings are most of the work).
pybind11::dict metadata_dict(const GGUFFile& f, int64_t max_array = -1);

// A step's outputs as a list of StepOutput struct sequences (bind_step_output must have run).
pybind11::list outputs_to_py(std::vector<StepOutput>& outs);

// Each binds its part into `m`, the _engine module (bind_testing: its `testing` submodule).
void bind_sampling(pybind11::module_& m);     // sampling.cpp: SamplingConfig, check_sampling, the grammar
void bind_gguf(pybind11::module_& m);         // gguf.cpp: read_gguf, tensor_data
void bind_step_output(pybind11::module_& m);  // step_output.cpp: the StepOutput type
void bind_engine(pybind11::module_& m);       // engine.cpp: EngineConfig, Engine, EngineLoop, NgramIndex
void bind_tokenizer(pybind11::module_& m);    // tokenizer.cpp: SpmTokenizer
void bind_testing(pybind11::module_& m);      // testing/testing.cpp: the harnesses

}  // namespace pyserve
