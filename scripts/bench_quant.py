"""Micro-benchmark of the dot-product kernels the engine's matmul runs: ns per row-dot of the scalar
reference and of the engine's path (the packed kernels of packed.h for Q4_0 … Q6_K, quant.cpp's per-row
kernels for the other types) at 1 and 32 columns, then the packed matmul in GMAC/s per thread at 1 / 8 /
16 columns against the scalar reference, a 4096-wide matrix-vector product streamed from memory for Q4_K
and the 4-bit-and-smaller per-row types (GB/s of weight bytes), one packed Q8_0 matrix-vector product, and
(without --quick) Q4_K, Q6_K and Q8_0 decode products over 1.4-2.6 GB of packed weights with 2 threads, each
pass beside a pass of the read bandwidth's loop (csrc/kernels/machine_limits.h), which --stream runs alone (--repeat N
times, to set one build's kernels beside another's).

The Python bindings quantize the activation on every call, which would swamp a 100 ns kernel, so this
script compiles a small C++ driver against csrc/kernels/quant.cpp (same flags as the engine: -O3 -march=native)
and prints its figures. Usage:  python3 scripts/bench_quant.py [--cxx g++] [--quick | --stream [--repeat N]]
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = r"""
#include "machine_limits.h"
#include "packed.h"
#include "quant.h"
#include "simd.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
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
      case GGMLType::Q2_K: put(b + 80, 0.01f * u(rng)); put(b + 82, 0.01f * u(rng)); break;
      case GGMLType::Q3_K: put(b + 108, 0.01f * u(rng)); break;
      case GGMLType::MXFP4: b[0] = (uint8_t)(118 + rng() % 12); break;  // E8M0 scale 2^-10 .. 2^1
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

// The engine's path for rows of type t: the packed kernels when t is packable, vec_dot_tile otherwise.
struct Rows {
  GGMLType t;
  int64_t n, rows;
  size_t rs, as;
  std::vector<uint8_t> raw;
  std::unique_ptr<PackedWeight> packed;  // null: not packable
  Rows(GGMLType t_, int64_t n_, int64_t rows_) : t(t_), n(n_), rows(rows_), rs(row_size(t_, n_)),
      as(act_row_size(type_traits((uint32_t)t_)->act, n_)), raw(rand_rows(t_, n_, (int)rows_)) {
    if (packable(t)) packed = pack_weight(t, raw.data(), rs, rows, n);
  }
  void product(const uint8_t* act, int T, float* out) const {  // out[c · rows + r]
    if (packed) return packed_tile(*packed, 0, rows / 8, act, as, T, out, rows);
    for (int c0 = 0; c0 < T; c0 += 8)
      vec_dot_tile(t, n, raw.data(), rs, rows, act + c0 * as, as, std::min(8, T - c0), out + c0 * rows, rows);
  }
  void reference(const uint8_t* act, int T, float* out) const {
    for (int c = 0; c < T; c++)
      for (int64_t r = 0; r < rows; r++) out[c * rows + r] = vec_dot_ref(t, n, raw.data() + r * rs, act + c * as);
  }
  std::vector<uint8_t> activations(int T) const {
    std::vector<float> x(n * T);
    std::normal_distribution<float> g;
    for (auto& f : x) f = g(rng);
    std::vector<uint8_t> act(as * T);
    for (int c = 0; c < T; c++) quantize_act_row(type_traits((uint32_t)t)->act, x.data() + c * n, act.data() + c * as, n);
    return act;
  }
};

// Decode at size: the packed one-column product streamed from memory by 2 threads (each half of the
// groups), over three 393,216 x 2,048 matrices of a type (1.4 GB of Q4_K, 2 GB of Q6_K: past even a 300 MB
// L3, which the 4096-row figures above are not), GB/s of packed weight bytes: the best and the median of 9
// passes, each followed by machine_limits' read (the best of 3 passes over 1 GiB), and the median of the ratios
// (the kernel's share of the read measured in the same seconds: a shared machine's bandwidth swings 2x).
static double stream_pass(const std::vector<std::unique_ptr<Rows>>& ws, const std::vector<uint8_t>& act,
                          std::vector<float>& out) {
  auto t0 = clk::now();
  for (auto& w : ws) {
    const PackedWeight& p = *w->packed;
    const int64_t half = p.n_groups / 2;
    std::thread other([&] { packed_tile(p, half, p.n_groups, act.data(), 0, 1, out.data() + 8 * half, 0); });
    packed_tile(p, 0, half, act.data(), 0, 1, out.data(), 0);
    other.join();
  }
  return std::chrono::duration<double>(clk::now() - t0).count();
}
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
static void stream_section() {
  if (!packable(GGMLType::Q4_K)) return;
  std::printf("\npacked matrix-vector streamed from memory, 2 threads, 3 x 393216 x 2048 (GB/s; vs the read)\n");
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q8_0}) {
    std::vector<std::unique_ptr<Rows>> ws;
    for (int m = 0; m < 3; m++) {
      ws.push_back(std::make_unique<Rows>(t, 2048, 393216));
      std::vector<uint8_t>().swap(ws.back()->raw);  // the engine hands the file's pages back once packed
    }
    const auto act = ws[0]->activations(1);
    std::vector<float> out(393216);
    const double bytes = 3.0 * ws[0]->packed->n_groups * ws[0]->packed->group_bytes;
    std::vector<double> rate, share;
    for (int pass = 0; pass < 9; pass++) {
      rate.push_back(bytes / stream_pass(ws, act, out) / 1e9);
      share.push_back(rate.back() / (read_bandwidth(2, 1u << 30, 3) / 1e9));
    }
    std::printf("%-5s best %5.1f  median %5.1f  median share of the read %5.1f %%\n", type_traits((uint32_t)t)->name,
                *std::max_element(rate.begin(), rate.end()), median(rate), 100 * median(share));
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "stream") == 0) return stream_section(), 0;
  bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  const double ms = quick ? 0.03 : 0.15;
  struct T { GGMLType t; const char* name; };
  const T types[] = {{GGMLType::Q8_0, "Q8_0"}, {GGMLType::Q5_0, "Q5_0"}, {GGMLType::Q4_K, "Q4_K"},
                     {GGMLType::Q6_K, "Q6_K"}, {GGMLType::Q4_0, "Q4_0"}, {GGMLType::Q4_1, "Q4_1"},
                     {GGMLType::Q5_1, "Q5_1"}, {GGMLType::Q5_K, "Q5_K"}, {GGMLType::F16, "F16"},
                     {GGMLType::F32, "F32"}, {GGMLType::IQ4_NL, "IQ4_NL"}, {GGMLType::MXFP4, "MXFP4"},
                     {GGMLType::Q2_K, "Q2_K"}, {GGMLType::Q3_K, "Q3_K"}, {GGMLType::IQ4_XS, "IQ4_XS"},
                     {GGMLType::IQ3_S, "IQ3_S"}};
  const int ROWS = 32, COLS = 32;  // weights stay in L2: compute-bound figures
  volatile float sink = 0;
  std::printf("ns per row-dot, %d rows in cache: the scalar reference, and the engine's path (packed: packed.h; "
              "rows: per-row kernels) at 1 and %d activation columns\n", ROWS, COLS);
  std::printf("%-6s %5s %6s %9s %9s %9s %7s %9s %9s\n", "type", "n", "path", "ref", "1 col", "32 cols", "x(ref)",
              "GMAC/s", "GB/s 1col");
  for (const T& ty : types) {
    for (int64_t n : {640, 1024, 2048}) {
      if (n % type_traits((uint32_t)ty.t)->block_size) continue;
      const Rows w(ty.t, n, ROWS);
      const auto act = w.activations(COLS);
      std::vector<float> out(ROWS * COLS);
      double r = time_ns([&] { w.reference(act.data(), 1, out.data()); sink = out[0]; }, ms) / ROWS;
      double s = time_ns([&] { w.product(act.data(), 1, out.data()); sink = out[0]; }, ms) / ROWS;
      double c = time_ns([&] { w.product(act.data(), COLS, out.data()); sink = out[0]; }, ms) / (ROWS * COLS);
      const char* path = w.packed ? "packed" : PS_AVX2 ? "rows" : "ref";
      std::printf("%-6s %5lld %6s %9.1f %9.1f %9.1f %7.1f %9.1f %9.1f\n", ty.name, (long long)n, path, r, s, c, r / c,
                  n / c, w.rs / s);
    }
  }
  // The packed matmul at decode (T = 1) and batched (8, 16 columns) shapes, against the scalar reference
  // (timed on 256 rows only: it is linear in rows and columns).
  std::printf("\nmatmul GMAC/s, 1 thread: scalar reference vs packed (n = 2048 for K-quants, else 640)\n");
  std::printf("%-5s %7s %4s %9s %9s %7s\n", "type", "rows", "T", "ref", "packed", "x(ref)");
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q5_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K}) {
    if (!packable(t)) break;  // a scalar build
    const int64_t n = type_traits((uint32_t)t)->block_size == QK_K ? 2048 : 640;
    double ref_gmacs = 0;
    for (int64_t rows : {(int64_t)256, (int64_t)(quick ? 8192 : 65536)}) {
      const Rows w(t, n, rows);
      for (int T : {1, 8, 16}) {
        const auto act = w.activations(T);
        std::vector<float> out(rows * T);
        const double macs = (double)rows * n * T, tm = rows > 256 ? 0.5 : ms;
        if (rows == 256 && T == 1)
          ref_gmacs = macs / time_ns([&] { w.reference(act.data(), T, out.data()); sink = out[0]; }, tm);
        const double b = macs / time_ns([&] { w.product(act.data(), T, out.data()); sink = out[0]; }, tm);
        std::printf("%-5s %7lld %4d %9.1f %9.1f %7.1f\n", type_traits((uint32_t)t)->name, (long long)rows, T,
                    ref_gmacs, b, b / ref_gmacs);
      }
    }
  }
  // Decode shape: a 4096-wide matrix-vector product streamed from memory (Q4_K packed, the 4-bit and smaller
  // types through their per-row kernels), in GB/s of the file's weight bytes. 32768 rows: 48 to 75 MB, above
  // a 32 MB L3.
  std::printf("\nmatrix-vector from DRAM, 1 thread, %d rows x 4096: GB/s of weight bytes\n", quick ? 4096 : 32768);
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::IQ4_NL, GGMLType::MXFP4, GGMLType::Q2_K, GGMLType::Q3_K,
                     GGMLType::IQ4_XS, GGMLType::IQ3_S}) {
    const int64_t n = 4096, rows = quick ? 4096 : 32768;
    const Rows w(t, n, rows);
    const auto act = w.activations(1);
    std::vector<float> out(rows);
    const double tm = time_ns([&] { w.product(act.data(), 1, out.data()); sink = out[0]; }, quick ? 0.2 : 1.0);
    std::printf("%-6s %6s %8.2f ms %7.1f GB/s %7.1f GMAC/s\n", type_traits((uint32_t)t)->name,
                w.packed ? "packed" : PS_AVX2 ? "rows" : "ref", tm / 1e6, rows * w.rs / tm, (double)rows * n / tm);
  }
  // Decode shape: the whole packed Q8_0 output matrix (262144 x 640, 178 MB) streamed from memory per token.
  if (packable(GGMLType::Q8_0)) {
    const int64_t n = 640, rows = quick ? 32768 : 262144;
    Rows w(GGMLType::Q8_0, n, rows);
    std::vector<uint8_t>().swap(w.raw);  // the engine hands the file's pages back once packed
    const auto act = w.activations(1);
    std::vector<float> out(rows);
    double t = time_ns([&] { w.product(act.data(), 1, out.data()); sink = out[0]; }, 1.0);
    std::printf("\nQ8_0 %lldx%lld packed matrix-vector (1 thread, from DRAM): %.2f ms, %.1f ns/row, %.1f GB/s\n",
                (long long)rows, (long long)n, t / 1e6, t / rows, rows * w.rs / t);
  }
  if (!quick) stream_section();
  return (int)sink * 0;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--quick", action="store_true", help="shorter timings")
    ap.add_argument("--stream", action="store_true", help="only the 2-thread decode products streamed from memory")
    ap.add_argument("--repeat", type=int, default=1, help="with --stream: runs of it, one after another")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "bench.cpp"), os.path.join(tmp, "bench")
        with open(src, "w") as f:
            f.write(DRIVER)
        cmd = [a.cxx, "-std=c++17", "-O3", "-march=native", "-pthread", "-I", os.path.join(ROOT, "csrc"), src,
               os.path.join(ROOT, "csrc", "quant.cpp"), os.path.join(ROOT, "csrc", "packed.cpp"),
               os.path.join(ROOT, "csrc", "machine_limits.cpp"),
               # packed.cpp hands 16+ columns to the AMX kernels where the CPU has them (as CMakeLists.txt builds it)
               "-mamx-tile", "-mamx-int8", os.path.join(ROOT, "csrc", "packed_amx.cpp"), "-o", exe]
        print(" ".join(cmd[:5]) + " ...", file=sys.stderr)
        subprocess.run(cmd, check=True)
        mode = ["stream"] if a.stream else ["quick"] if a.quick else []
        for _ in range(a.repeat if a.stream else 1):
            subprocess.run([exe] + mode, check=True)


if __name__ == "__main__":
    main()
