"""Micro-benchmark of the quant dot-product kernels: ns per row-dot (ref vs simd vs vec_dot_cols), and the
packed matmul kernels (packed.h) against the per-row tiles they replaced, in GMAC/s per thread.

The Python bindings quantize the activation on every call, which would swamp a 100 ns kernel, so this
script compiles a small C++ driver against csrc/quant.cpp (same flags as the engine: -O3 -march=native)
and prints its figures. Usage:  python3 scripts/bench_quant.py [--cxx g++] [--quick]
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = r"""
#include "packed.h"
#include "quant.h"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
using namespace pyserve;
using clk = std::chrono::steady_clock;

static std::mt19937 rng(1234);

// Random raw blocks with sane fp16 scales: every byte pattern is a valid block otherwise.
static std::vector<uint8_t> rand_rows(GGMLType t, int64_t n, int rows) {
  const TypeTraits* tt = type_traits((uint32_t)t);
  size_t rs = row_size(t, n);
  std::vector<uint8_t> v(rs * rows);
  for (auto& b : v) b = (uint8_t)rng();
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto put = [&](uint8_t* p, float f) { uint16_t h = fp32_to_fp16(f); std::memcpy(p, &h, 2); };
  size_t nb = v.size() / tt->type_size;
  for (size_t i = 0; i < nb; i++) {
    uint8_t* b = v.data() + i * tt->type_size;
    switch (t) {
      case GGMLType::F32: { float f = u(rng); std::memcpy(b, &f, 4); break; }
      case GGMLType::F16: put(b, u(rng)); break;
      case GGMLType::Q4_1: case GGMLType::Q5_1: case GGMLType::Q4_K: case GGMLType::Q5_K:
        put(b, 0.01f * u(rng)); put(b + 2, 0.01f * u(rng)); break;
      case GGMLType::Q6_K: put(b + 208, 0.01f * u(rng)); break;
      default: put(b, 0.01f * u(rng)); break;
    }
  }
  return v;
}

// Minimum over many short runs: the machine may be shared, the minimum is the kernel's own speed.
template <class F> static double time_ns(F f, double min_s = 0.15) {
  double best = 1e30, total = 0;
  for (int rep = 0; rep < 100000 && (total < min_s || rep < 20); rep++) {
    auto t0 = clk::now();
    f();
    double el = std::chrono::duration<double>(clk::now() - t0).count();
    total += el;
    best = std::min(best, el * 1e9);
  }
  return best;
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  const double ms = quick ? 0.03 : 0.15;
  struct T { GGMLType t; const char* name; };
  const T types[] = {{GGMLType::Q8_0, "Q8_0"}, {GGMLType::Q5_0, "Q5_0"}, {GGMLType::Q4_K, "Q4_K"},
                     {GGMLType::Q6_K, "Q6_K"}, {GGMLType::Q4_0, "Q4_0"}, {GGMLType::Q4_1, "Q4_1"},
                     {GGMLType::Q5_1, "Q5_1"}, {GGMLType::Q5_K, "Q5_K"}, {GGMLType::F16, "F16"},
                     {GGMLType::F32, "F32"}};
  const int ROWS = 32, COLS = 32;  // weights stay in L2: compute-bound figures
  volatile float sink = 0;
  std::printf("ns per row-dot (%d rows in cache; cols = vec_dot_cols over %d activation rows)\n", ROWS, COLS);
  std::printf("%-5s %5s %9s %9s %9s %7s %9s\n", "type", "n", "ref", "simd", "cols", "x(ref)", "GMAC/s");
  for (const T& ty : types) {
    const TypeTraits* tt = type_traits((uint32_t)ty.t);
    for (int64_t n : {640, 1024, 2048}) {
      if (n % tt->block_size) continue;
      auto w = rand_rows(ty.t, n, ROWS);
      size_t rs = row_size(ty.t, n), as = act_row_size(tt->act, n);
      std::vector<float> x(n * COLS);
      std::normal_distribution<float> g;
      for (auto& f : x) f = g(rng);
      std::vector<uint8_t> act(as * COLS);
      for (int c = 0; c < COLS; c++) quantize_act_row(tt->act, x.data() + c * n, act.data() + c * as, n);
      std::vector<float> out(COLS);
      double r = time_ns([&] { float s = 0; for (int i = 0; i < ROWS; i++) s += vec_dot_ref(ty.t, n, w.data() + i * rs, act.data()); sink = s; }, ms) / ROWS;
      double s = time_ns([&] { float a = 0; for (int i = 0; i < ROWS; i++) a += vec_dot(ty.t, n, w.data() + i * rs, act.data()); sink = a; }, ms) / ROWS;
      double c = time_ns([&] { for (int i = 0; i < ROWS; i++) vec_dot_cols(ty.t, n, w.data() + i * rs, act.data(), as, COLS, out.data()); sink = out[0]; }, ms) / (ROWS * COLS);
      std::printf("%-5s %5lld %9.1f %9.1f %9.1f %7.1f %9.1f\n", ty.name, (long long)n, r, s, c, r / c, n / c);
    }
  }
  // Packed groups of 8 rows vs the per-row tiles (vec_dot_tile, 8 columns per call), same rows and columns.
  std::printf("\nmatmul GMAC/s, 1 thread: per-row tiles vs packed (n = 2048 for K-quants, else 640)\n");
  std::printf("%-5s %7s %4s %9s %9s %7s\n", "type", "rows", "T", "tiles", "packed", "x");
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q5_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K}) {
    const TypeTraits* tt = type_traits((uint32_t)t);
    const int64_t n = tt->block_size == QK_K ? 2048 : 640;
    for (int64_t rows : {(int64_t)256, (int64_t)(quick ? 8192 : 65536)}) {
      auto w = rand_rows(t, n, (int)rows);
      const size_t rs = row_size(t, n), as = act_row_size(tt->act, n);
      auto p = pack_weight(t, w.data(), rs, rows, n);
      for (int T : {1, 8, 16}) {
        std::vector<float> x(n * T);
        std::normal_distribution<float> g;
        for (auto& f : x) f = g(rng);
        std::vector<uint8_t> act(as * T);
        for (int c = 0; c < T; c++) quantize_act_row(tt->act, x.data() + c * n, act.data() + c * as, n);
        std::vector<float> out(rows * T);
        const double macs = (double)rows * n * T, tm = rows > 256 ? 0.5 : ms;
        double a = time_ns([&] {
          for (int c0 = 0; c0 < T; c0 += 8)
            vec_dot_tile(t, n, w.data(), rs, rows, act.data() + c0 * as, as, std::min(8, T - c0), out.data() + c0 * rows, rows);
          sink = out[0]; }, tm);
        double b = time_ns([&] { packed_tile(*p, 0, rows / 8, act.data(), as, T, out.data(), rows); sink = out[0]; }, tm);
        std::printf("%-5s %7lld %4d %9.1f %9.1f %7.2f\n", tt->name, (long long)rows, T, macs / a, macs / b, a / b);
      }
    }
  }
  // Decode shape: the whole Q8_0 output matrix (262144 x 640, 178 MB) streamed from memory per token.
  {
    const int64_t n = 640, rows = quick ? 32768 : 262144;
    auto w = rand_rows(GGMLType::Q8_0, n, (int)rows);
    size_t rs = row_size(GGMLType::Q8_0, n);
    std::vector<float> x(n, 0.5f);
    std::vector<uint8_t> act(act_row_size(ActFormat::Q8_32, n));
    quantize_act_row(ActFormat::Q8_32, x.data(), act.data(), n);
    std::vector<float> out(rows);
    double t = time_ns([&] { for (int64_t i = 0; i < rows; i++) out[i] = vec_dot(GGMLType::Q8_0, n, w.data() + i * rs, act.data()); }, 1.0);
    std::printf("\nQ8_0 %lldx%lld matrix-vector (1 thread, from DRAM): %.2f ms, %.1f ns/row, %.1f GB/s\n",
                (long long)rows, (long long)n, t / 1e6, t / rows, rows * rs / t);
  }
  return (int)sink * 0;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--quick", action="store_true", help="shorter timings")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "bench.cpp"), os.path.join(tmp, "bench")
        with open(src, "w") as f:
            f.write(DRIVER)
        cmd = [a.cxx, "-std=c++17", "-O3", "-march=native", "-I", os.path.join(ROOT, "csrc"), src,
               os.path.join(ROOT, "csrc", "quant.cpp"), os.path.join(ROOT, "csrc", "packed.cpp"), "-o", exe]
        print(" ".join(cmd[:5]) + " ...", file=sys.stderr)
        subprocess.run(cmd, check=True)
        subprocess.run([exe] + (["quick"] if a.quick else []), check=True)


if __name__ == "__main__":
    main()
