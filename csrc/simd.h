// simd: which x86 SIMD paths this build compiles (from the compiler's macros under -march=native), shared
// by the kernel files. Every path has a scalar twin, so a build without any of them is complete.
#pragma once

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PS_AVX2 1
#else
#define PS_AVX2 0
#endif
#if PS_AVX2 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define PS_VNNI 1  // EVEX 256-bit vpdpbusd / vpdpwssd
#elif PS_AVX2 && defined(__AVXVNNI__)
#define PS_VNNI 2  // VEX encoding (Alder Lake, Zen 5)
#else
#define PS_VNNI 0
#endif
#if PS_AVX2 && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PS_AVX512BW 1
#else
#define PS_AVX512BW 0
#endif

#if PS_AVX2
namespace pyserve {
// acc + Σ of 4 consecutive u8·s8 products per int32 lane. Exact when no int16 pair sum of maddubs
// saturates (callers keep |u| ≤ 128 against |s| ≤ 127); VNNI computes it in one instruction.
static inline __m256i dp4(__m256i acc, __m256i u, __m256i s) {
#if PS_VNNI == 1
  return _mm256_dpbusd_epi32(acc, u, s);
#elif PS_VNNI == 2
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The sum of 8 lanes in one fixed order: lanes l + (l + 4), then (0 + 2) + (1 + 3).
static inline float hsum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// acc + Σ of 2 int16·int16 products per int32 lane, exact.
static inline __m256i dp2(__m256i acc, __m256i a, __m256i b) {
#if PS_VNNI == 1
  return _mm256_dpwssd_epi32(acc, a, b);
#elif PS_VNNI == 2
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}
}  // namespace pyserve
#endif

#if PS_AVX2 && !PS_AVX512BW
#include <cstdint>
namespace pyserve {
// 0xFF in byte i where bit i of m is set (AVX-512 BW does this with a mask register instead).
static inline __m256i bits_to_bytes(uint32_t m) {
  const __m256i shuf = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), shuf);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}
}  // namespace pyserve
#endif
