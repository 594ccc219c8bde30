// machine: the thread pool's chunks under a stalled worker, and the machine's limits the benchmarks give
// fractions of (machine_limits.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/testing/testing.h"
#include "base/threadpool.h"
#include "kernels/machine_limits.h"

namespace py = pybind11;

namespace pyserve {

namespace {

// The team's chunks over `jobs` jobs of n_chunks each: how many times each chunk ran (each must run once
// per job, whichever thread claims it).
std::vector<int> pool_chunk_runs(int threads, int64_t n_chunks, int jobs) {
  ThreadPool pool(threads);
  std::vector<std::atomic<int>> runs(n_chunks);
  for (int j = 0; j < jobs; j++) pool.run_chunks(n_chunks, [&](int c, int) { runs[c].fetch_add(1); });
  std::vector<int> out;
  for (auto& r : runs) out.push_back(r.load());
  return out;
}

// A two-thread team whose worker stalls inside the first chunk it claims until every other chunk of the
// job is done (a thread the kernel descheduled), over `jobs` jobs: each still finishes, the caller running
// the rest. Returns (the most chunks the worker ran in one job, jobs it took part in, whether a stalled
// chunk gave up waiting after 10 s: a job that needed the stalled thread's share).
std::tuple<int, int, bool> pool_takeover(int64_t n_chunks, int jobs) {
  py::gil_scoped_release nogil;
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> gave_up{false};
  int most = 0, joined = 0;
  for (int j = 0; j < jobs; j++) {
    std::atomic<int> finished{0}, by_worker{0};
    pool.run_chunks(n_chunks, [&](int, int nc) {
      if (std::this_thread::get_id() != caller) {
        by_worker.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (finished.load() < nc - 1 && !gave_up.load())
          if (std::chrono::steady_clock::now() > until) gave_up = true;
      } else {  // some work, so that the worker, spinning between jobs, claims a chunk
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
        while (std::chrono::steady_clock::now() < until) {}
      }
      finished.fetch_add(1);
    });
    most = std::max(most, by_worker.load());
    joined += by_worker.load() > 0;
  }
  return {most, joined, gave_up.load()};
}

}  // namespace

void bind_testing_machine(py::module_& m) {
  m.def("pool_chunk_runs", &pool_chunk_runs, py::arg("threads"), py::arg("n_chunks"), py::arg("jobs"));
  m.def("pool_takeover", &pool_takeover, py::arg("n_chunks"), py::arg("jobs"));
  m.def("read_bandwidth", [](int threads, int64_t mib, int rounds) {
    py::gil_scoped_release nogil;
    return read_bandwidth(threads, (size_t)mib << 20, rounds);
  }, py::arg("threads"), py::arg("mib") = 2048, py::arg("rounds") = 5,
     "bytes/s the threads read together (machine_limits.h); ValueError under 1 thread, 64 MiB or 1 round");
  m.def("int8_peak_macs", [](int threads, bool amx) {
    py::gil_scoped_release nogil;
    return int8_peak_macs(threads, amx);
  }, py::arg("threads"), py::arg("amx") = false,
     "int8 multiply-adds/s in registers: vpdpbusd (256-bit), or AMX TDPBSSD; 0 where this CPU/build has none");
}

}  // namespace pyserve
