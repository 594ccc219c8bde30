// testing.h: pyserve._engine.testing, the engine's parts alone for tests and benchmarks — the kernels beside
// their scalar twins, the sampler on given logits, the block manager over numbered tables, SchedulerSim (the
// Scheduler and the engine's SequenceGroups over a simulated model). Nothing in pyserve/ imports it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

namespace pyserve {

// Arrays as the harnesses take them: C-contiguous, converted from any dtype.
using u8array = pybind11::array_t<uint8_t, pybind11::array::c_style | pybind11::array::forcecast>;
using f32array = pybind11::array_t<float, pybind11::array::c_style | pybind11::array::forcecast>;

// Each binds its harnesses into `m` (the testing submodule); testing.cpp's bind_testing calls them all.
void bind_testing_kernels(pybind11::module_& m);    // kernels.cpp
void bind_testing_attention(pybind11::module_& m);  // attention.cpp
void bind_testing_sampler(pybind11::module_& m);    // sampler.cpp
void bind_testing_blocks(pybind11::module_& m);     // scheduler.cpp: BlockManager
void bind_testing_scheduler(pybind11::module_& m);  // scheduler.cpp: SchedulerSim
void bind_testing_machine(pybind11::module_& m);    // machine.cpp
void bind_testing_disk_tier(pybind11::module_& m);  // disk_tier.cpp

}  // namespace pyserve
