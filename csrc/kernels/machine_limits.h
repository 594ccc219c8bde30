// machine_limits: what this machine's cores and memory can do at most, measured, so that the benchmarks can
// give each figure as a fraction of its limit (docs/BENCHMARKS.md): decode against the memory read bandwidth,
// prefill against the int8 multiply-add peak of the instruction its kernels use (vpdpbusd on 256-bit
// vectors, or AMX's TDPBSSD). Measured, not looked up: a VM's clocks and memory are not its CPU's datasheet.
#pragma once

#include <cstddef>

namespace pyserve {

// Bytes per second `threads` threads (each its own std::thread, started together: a thread pool may let one
// thread take another's share) read together from a buffer of `bytes` (2 MiB-aligned, transparent
// huge pages asked for, every page written before timing), the best of `rounds`: each thread OR-reduces its
// contiguous share with vector loads (64-byte ones with AVX-512) and software prefetches into L2 16 KB
// ahead and into L1 4 KB ahead, as the packed decode kernels read.
// Throws std::invalid_argument when threads < 1, bytes < 64 MiB or rounds < 1, std::bad_alloc when the buffer does not fit.
double read_bandwidth(int threads, size_t bytes, int rounds);

// int8 multiply-adds per second of `threads` such threads together, operands in registers, the best of 5:
// amx false, vpdpbusd on 256-bit vectors with 12 independent accumulators (0 in a build without VNNI);
// amx true, TDPBSSD on four independent tiles (0 where amx_usable() is false). Throws std::invalid_argument
// when threads < 1.
double int8_peak_macs(int threads, bool amx);

}  // namespace pyserve
