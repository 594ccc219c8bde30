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

// Float vectors behind one interface, so that a kernel is written once for AVX2's 8 lanes and AVX-512's 16.
struct F32x8 {
  using T = __m256;
  static constexpr int W = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }    // a·b + c, one rounding
  static T fnma(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }  // c − a·b, one rounding
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T round(T x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T pow2(T n) {  // 2^n for integral n in [−126, 127]
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static T first(T x, int n) {  // lanes ≥ n set to 0
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane)));
  }
};

#if PS_AVX512BW
struct F32x16 {
  using T = __m512;
  static constexpr int W = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fnma(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T round(T x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T pow2(T n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static T first(T x, int n) {
    const __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
    return _mm512_maskz_mov_ps(m, x);
  }
};
#endif

// e^x per lane: 2^n · p(r), x = n·ln2 + r, |r| <= ln2/2, p of degree 6 (relative error ~2e-7).
// exp8_lane (below) is its bits for one value, whatever the width.
template <class V>
inline typename V::T exp_lanes(typename V::T x) {
  x = V::min(V::max(x, V::set1(-87.3f)), V::set1(88.3f));
  const typename V::T n = V::round(V::mul(x, V::set1(1.44269504f)));
  typename V::T r = V::fnma(n, V::set1(0.693145752f), x);
  r = V::fnma(n, V::set1(1.42860677e-6f), r);
  typename V::T p = V::fma(V::set1(1.0f / 720), r, V::set1(1.0f / 120));
  p = V::fma(p, r, V::set1(1.0f / 24));
  p = V::fma(p, r, V::set1(1.0f / 6));
  p = V::fma(p, r, V::set1(0.5f));
  p = V::fma(p, r, V::set1(1.0f));
  p = V::fma(p, r, V::set1(1.0f));
  return V::mul(p, V::pow2(n));
}
static inline __m256 exp8(__m256 x) { return exp_lanes<F32x8>(x); }

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

#include <cmath>
#include <cstdint>
#include <cstring>
namespace pyserve {
// exp8's value for one lane, bit for bit: the same clamp (max, then min, as the instructions order their
// operands), rounding to nearest even, fused multiply-adds and power of two.
static inline float exp8_lane(float x) {
  x = x > -87.3f ? x : -87.3f;
  x = x < 88.3f ? x : 88.3f;
  const float t = x * 1.44269504f, n = std::nearbyint(t);
  float r = std::fma(-n, 0.693145752f, x);
  r = std::fma(-n, 1.42860677e-6f, r);
  float p = std::fma(1.0f / 720, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float e;
  std::memcpy(&e, &bits, 4);
  return p * e;
}
}  // namespace pyserve
