#include "kernels/machine_limits.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/packed_amx.h"
#include "base/simd.h"

namespace pyserve {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The OR of bytes [p, p + n) as 64-bit words (n a multiple of 256), read as the 512-bit decode kernels read
// (packed.cpp): each line prefetched into L2 16 KB ahead and into L1 4 KB ahead, 64-byte loads where the
// CPU has them. On this machine, alternated passes: 13-15 % more than 32-byte loads with only an L1 prefetch
// 2 KB ahead (the loop before; the faster read is the limit: docs/BENCHMARKS.md 2026-12-06, night).
uint64_t or_reduce(const uint8_t* p, size_t n) {
#if PS_AVX2
  auto ahead = [p](size_t i) {
    for (size_t l = 0; l < 128; l += 64) {
      _mm_prefetch((const char*)p + i + 16384 + l, _MM_HINT_T1);
      _mm_prefetch((const char*)p + i + 4096 + l, _MM_HINT_T0);
    }
  };
#if PS_AVX512BW
  __m512i a[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  for (size_t i = 0; i < n; i += 128) {
    ahead(i);
    for (int k = 0; k < 2; k++) a[k] = _mm512_or_si512(a[k], _mm512_load_si512((const void*)(p + i + 64 * k)));
  }
  const __m512i v = _mm512_or_si512(a[0], a[1]);
  const __m256i folded = _mm256_or_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  alignas(32) uint64_t w[4];
  _mm256_store_si256((__m256i*)w, folded);
  return w[0] | w[1] | w[2] | w[3];
#else
  __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (size_t i = 0; i < n; i += 128) {
    ahead(i);
    for (int k = 0; k < 4; k++) a[k] = _mm256_or_si256(a[k], _mm256_load_si256((const __m256i*)(p + i + 32 * k)));
  }
  alignas(32) uint64_t w[4];
  _mm256_store_si256((__m256i*)w, _mm256_or_si256(_mm256_or_si256(a[0], a[1]), _mm256_or_si256(a[2], a[3])));
  return w[0] | w[1] | w[2] | w[3];
#endif
#else
  uint64_t a = 0, b = 0;
  for (size_t i = 0; i < n; i += 16) {
    uint64_t x, y;
    std::memcpy(&x, p + i, 8), std::memcpy(&y, p + i + 8, 8);
    a |= x, b |= y;
  }
  return a | b;
#endif
}

// vpdpbusd MACs done by one thread in `passes` passes of 12 independent 256-bit accumulators.
uint64_t vnni_loop(int64_t passes, int seed) {
#if PS_AVX2 && PS_VNNI
  __m256i acc[12];
  const __m256i u = _mm256_set1_epi8((char)(seed | 1)), s = _mm256_set1_epi8(3);
  for (__m256i& a : acc) a = _mm256_set1_epi32(seed);
  for (int64_t i = 0; i < passes; i++)
    for (__m256i& a : acc) {
#if PS_VNNI == 1  // EVEX, as the kernels' (register-only operands would get VEX's 16 registers and moves)
      a = _mm256_mask_dpbusd_epi32(a, 0xFF, u, s);
#else
      a = dp4(a, u, s);
#endif
    }
  __m256i t = acc[0];
  for (int k = 1; k < 12; k++) t = _mm256_add_epi32(t, acc[k]);
  volatile int sink = _mm256_extract_epi32(t, 0);
  (void)sink;
  return (uint64_t)passes * 12 * 32;  // 32 u8 · s8 products per instruction
#else
  (void)passes, (void)seed;
  return 0;
#endif
}

// fn(ith) on `threads` threads started together; the seconds from the start until the last one ends.
template <class F>
double together(int threads, F fn) {
  std::vector<std::thread> team;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  for (int ith = 0; ith < threads; ith++)
    team.emplace_back([&, ith] {
      ready++;
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      fn(ith);
    });
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& t : team) t.join();
  return seconds_since(t0);
}

// MACs per second of kernel(ith) run on `threads` threads together, the best of 5 rounds.
template <class K>
double macs_per_second(int threads, K kernel) {
  double best = 0;
  for (int round = 0; round < 5; round++) {
    std::vector<uint64_t> macs(threads, 0);
    const double s = together(threads, [&](int ith) { macs[ith] = kernel(ith); });
    uint64_t total = 0;
    for (uint64_t m : macs) total += m;
    best = std::max(best, total / s);
  }
  return best;
}

}  // namespace

double read_bandwidth(int threads, size_t bytes, int rounds) {
  if (threads < 1 || bytes < (64u << 20) || rounds < 1)
    throw std::invalid_argument("read_bandwidth: threads >= 1, bytes >= 64 MiB, rounds >= 1");
  constexpr size_t ALIGN = 2u << 20;
  bytes = bytes / ALIGN * ALIGN;
  std::unique_ptr<uint8_t, void (*)(void*)> buf((uint8_t*)std::aligned_alloc(ALIGN, bytes), std::free);
  if (!buf) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(buf.get(), bytes, MADV_HUGEPAGE);  // best effort, as packed weights ask
#endif
  std::memset(buf.get(), 1, bytes);
  const size_t share = bytes / threads / 256 * 256;  // whole 256-byte passes per thread
  std::vector<uint64_t> sink(threads);
  double best = 0;
  for (int r = 0; r < rounds; r++) {
    const double s = together(threads, [&](int ith) { sink[ith] = or_reduce(buf.get() + ith * share, share); });
    best = std::max(best, share * threads / s);
  }
  return best;
}

double int8_peak_macs(int threads, bool amx) {
  if (threads < 1) throw std::invalid_argument("int8_peak_macs: threads >= 1");
  if (amx) return amx_usable() ? macs_per_second(threads, [](int) { return amx_peak_loop(1 << 16); }) : 0.0;
  return macs_per_second(threads, [](int ith) { return vnni_loop(1 << 23, ith); });
}

}  // namespace pyserve
