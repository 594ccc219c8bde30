// quant: block decoding, activation quantization, the scalar reference dot products and the per-row SIMD
// kernels of the types without a packed layout (see quant.h).
//
// Kernel shape: every SIMD dot product is one template `k_<type><NC>` that decodes a weight block once and
// applies it to NC activation columns; vec_dot_tile runs it row by row with NC ≤ 8, so each column sees
// exactly the same instruction sequence (same integer lanes, same fma chain, same final reduction)
// whatever NC is: that is what makes a column's result independent of its tile. Float math in the SIMD
// paths is written with explicit intrinsics / std::fma so that the compiler's fp-contraction cannot differ
// between instances.
//
// Integer domain: int8 activations times small unsigned weight codes are summed exactly in int16/int32
// lanes (maddubs pairs never saturate: w ≤ 31, |a| ≤ 127 since activations are quantized to [-127, 127]);
// with AVX-512 VNNI the same lanes come from vpdpbusd, so the results are identical to AVX2.
#include "quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "simd.h"

namespace pyserve {

static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22, "layout");
static_assert(sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34, "layout");
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210, "layout");
static_assert(sizeof(block_q8_32) == 40 && sizeof(block_q8_K) == 292, "layout");

// ================================================================ fp16 / bf16

static inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

[[maybe_unused]] static float fp16_to_fp32_scalar(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000 | (m << 13) | (m ? 0x400000u : 0));  // inf; nan made quiet like F16C
  if (e) return bits_f32(sign | ((e + 112) << 23) | (m << 13));
  const float v = (float)m * 5.9604644775390625e-8f;               // subnormal: m · 2^-24, exact
  return sign ? -v : v;
}

[[maybe_unused]] static uint16_t fp32_to_fp16_scalar(float f) {
  const uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
  if (ax > 0x7f800000) return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));  // nan, made quiet
  if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // ≥ 65520 rounds to inf (incl. inf)
  if (ax >= 0x38800000) {                                  // normal half: rebias, round to nearest even
    uint32_t r = ax - (112u << 23);
    r += 0xfff + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
  }
  if (ax <= 0x33000000) return (uint16_t)sign;             // ≤ 2^-25 (the tie goes to even 0)
  const uint32_t e = ax >> 23, mant = (ax & 0x7fffff) | 0x800000, shift = 126 - e;  // 14..24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return (uint16_t)(sign | q);
}

static inline float h2f(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return fp16_to_fp32_scalar(h);
#endif
}

float fp16_to_fp32(uint16_t h) { return h2f(h); }

uint16_t fp32_to_fp16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return fp32_to_fp16_scalar(f);
#endif
}

float bf16_to_fp32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

// ================================================================ dequantization (exact: every product of a
// fp16 scale with the small integer codes fits a float mantissa, so only the final add/sub rounds, as in gguf)

static void deq_f32(const void* s, float* y, int64_t n) { std::memcpy(y, s, n * sizeof(float)); }

static void deq_f16(const void* s, float* y, int64_t n) {
  const uint16_t* h = (const uint16_t*)s;
  for (int64_t i = 0; i < n; i++) y[i] = h2f(h[i]);
}

static void deq_bf16(const void* s, float* y, int64_t n) {
  const uint16_t* h = (const uint16_t*)s;
  for (int64_t i = 0; i < n; i++) y[i] = bf16_to_fp32(h[i]);
}

static inline uint32_t load_u32(const uint8_t* p) { uint32_t u; std::memcpy(&u, p, 4); return u; }

static void deq_q4_0(const void* s, float* y, int64_t n) {
  const block_q4_0* b = (const block_q4_0*)s;
  for (int64_t i = 0; i < n / QK; i++, y += QK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < QK / 2; j++) {
      y[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
      y[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
    }
  }
}

static void deq_q4_1(const void* s, float* y, int64_t n) {
  const block_q4_1* b = (const block_q4_1*)s;
  for (int64_t i = 0; i < n / QK; i++, y += QK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < QK / 2; j++) {
      y[j] = d * (float)(b[i].qs[j] & 0xF) + m;
      y[j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
    }
  }
}

// 5-bit code of element j of a Q5 block: nibble from qs, bit 4 from qh.
static inline int q5_code(const uint8_t* qs, uint32_t qh, int j) {
  const int nib = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
  return nib | (int)(((qh >> j) & 1) << 4);
}

static void deq_q5_0(const void* s, float* y, int64_t n) {
  const block_q5_0* b = (const block_q5_0*)s;
  for (int64_t i = 0; i < n / QK; i++, y += QK) {
    const float d = h2f(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < QK; j++) y[j] = d * (float)(q5_code(b[i].qs, qh, j) - 16);
  }
}

static void deq_q5_1(const void* s, float* y, int64_t n) {
  const block_q5_1* b = (const block_q5_1*)s;
  for (int64_t i = 0; i < n / QK; i++, y += QK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < QK; j++) y[j] = d * (float)q5_code(b[i].qs, qh, j) + m;
  }
}

static void deq_q8_0(const void* s, float* y, int64_t n) {
  const block_q8_0* b = (const block_q8_0*)s;
  for (int64_t i = 0; i < n / QK; i++, y += QK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < QK; j++) y[j] = d * (float)b[i].qs[j];
  }
}

// The 8 six-bit scales and mins of a Q4_K / Q5_K super-block (llama.cpp's get_scale_min_k4, four at a time):
// bytes 0-3: sc[0..3] | hi2(sc[4..7]) << 6, bytes 4-7: m[0..3] | hi2(m[4..7]) << 6,
// bytes 8-11: lo4(sc[4..7]) | lo4(m[4..7]) << 4.
static inline void k4_scales(const uint8_t* p, uint8_t sc[8], uint8_t m[8]) {
  const uint32_t w0 = load_u32(p), w1 = load_u32(p + 4), w2 = load_u32(p + 8);
  const uint32_t s[2] = {w0 & 0x3f3f3f3f, (w2 & 0x0f0f0f0f) | (((w0 >> 6) & 0x03030303) << 4)};
  const uint32_t mm[2] = {w1 & 0x3f3f3f3f, ((w2 >> 4) & 0x0f0f0f0f) | (((w1 >> 6) & 0x03030303) << 4)};
  std::memcpy(sc, s, 8);
  std::memcpy(m, mm, 8);
}

// Codes of one K-quant super-block in element order (Q4_K/Q5_K: 0..31, Q6_K: -32..31).
static void codes_q4_K(const block_q4_K& b, int8_t* q) {
  for (int j = 0; j < 4; j++)
    for (int l = 0; l < 32; l++) {
      q[64 * j + l] = (int8_t)(b.qs[32 * j + l] & 0xF);
      q[64 * j + 32 + l] = (int8_t)(b.qs[32 * j + l] >> 4);
    }
}

static void codes_q5_K(const block_q5_K& b, int8_t* q) {
  for (int j = 0; j < 4; j++)
    for (int l = 0; l < 32; l++) {
      q[64 * j + l] = (int8_t)((b.qs[32 * j + l] & 0xF) | (((b.qh[l] >> (2 * j)) & 1) << 4));
      q[64 * j + 32 + l] = (int8_t)((b.qs[32 * j + l] >> 4) | (((b.qh[l] >> (2 * j + 1)) & 1) << 4));
    }
}

static void codes_q6_K(const block_q6_K& b, int8_t* q) {
  for (int h = 0; h < 2; h++) {
    const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
    int8_t* o = q + 128 * h;
    for (int l = 0; l < 32; l++) {
      o[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      o[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

void k_block_codes(GGMLType t, const void* block, KBlockCodes& out) {
  int8_t q[QK_K];
  std::memset(out.sc, 0, sizeof(out.sc));
  std::memset(out.m, 0, sizeof(out.m));
  out.dmin = 0;
  if (t == GGMLType::Q4_K || t == GGMLType::Q5_K) {
    const block_q4_K& b4 = *(const block_q4_K*)block;  // d, dmin, scales lead both layouts
    if (t == GGMLType::Q4_K) codes_q4_K(b4, q);
    else codes_q5_K(*(const block_q5_K*)block, q);
    uint8_t sc[8];
    k4_scales(b4.scales, sc, out.m);
    for (int j = 0; j < 8; j++) out.sc[j] = (int8_t)sc[j];
    out.d = b4.d;
    out.dmin = b4.dmin;
    std::memcpy(out.q, q, QK_K);
  } else if (t == GGMLType::Q6_K) {
    const block_q6_K& b = *(const block_q6_K*)block;
    codes_q6_K(b, q);
    for (int l = 0; l < QK_K; l++) out.q[l] = (uint8_t)(q[l] + 32);
    std::memcpy(out.sc, b.scales, 16);
    out.d = b.d;
  } else {
    throw std::invalid_argument("k_block_codes: not a K-quant type");
  }
}

template <class B, void (*Codes)(const B&, int8_t*)>
static void deq_k_min(const void* s, float* y, int64_t n) {
  const B* b = (const B*)s;
  int8_t q[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    uint8_t sc[8], m[8];
    k4_scales(b[i].scales, sc, m);
    Codes(b[i], q);
    for (int j = 0; j < 8; j++) {
      const float dl = d * (float)sc[j], ml = dmin * (float)m[j];
      for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)q[32 * j + l] - ml;
    }
  }
}

static void deq_q6_K(const void* s, float* y, int64_t n) {
  const block_q6_K* b = (const block_q6_K*)s;
  int8_t q[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
    const float d = h2f(b[i].d);
    codes_q6_K(b[i], q);
    for (int l = 0; l < QK_K; l++) y[l] = (d * (float)b[i].scales[l / 16]) * (float)q[l];
  }
}

// ================================================================ activation quantization
// d = amax / 127, q = nearest-even(x · (1/d)) (so |x - d·q| ≤ d/2 up to float rounding); d = 0 → all zeros.
// The SIMD and scalar versions give identical bytes.

static float amax_row(const float* x, int n) {
#if PS_AVX2
  if (n % 8 == 0) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    r = _mm_max_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
  }
#endif
  float m = 0.0f;
  for (int i = 0; i < n; i++) m = std::max(m, std::fabs(x[i]));
  return m;
}

// Quantize 32 values with inverse scale id into q; returns Σ q.
static int quant32(const float* x, float id, int8_t* q) {
#if PS_AVX2
  const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i v[4];
  for (int k = 0; k < 4; k++) {
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid);
    t = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
  __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i*)q, p);
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0x4e));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 0xb1));
  return _mm_cvtsi128_si32(r);
#else
  int sum = 0;
  for (int j = 0; j < 32; j++) {
    const float t = std::min(std::max(std::nearbyint(x[j] * id), -127.0f), 127.0f);
    q[j] = (int8_t)t;
    sum += q[j];
  }
  return sum;
#endif
}

static void quant_q8_32(const float* x, block_q8_32* b, int64_t n) {
  for (int64_t i = 0; i < n / QK; i++, x += QK) {
    const float amax = amax_row(x, QK), d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const int sum = quant32(x, id, b[i].qs);
    b[i].d = d;
    b[i].sum = sum;
  }
}

static void quant_q8_K(const float* x, block_q8_K* b, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
    const float amax = amax_row(x, QK_K), d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int k = 0; k < QK_K / 32; k++) quant32(x + 32 * k, id, b[i].qs + 32 * k);
    b[i].d = d;
    for (int g = 0; g < QK_K / 16; g++) {
      int s = 0;
      for (int l = 0; l < 16; l++) s += b[i].qs[16 * g + l];
      b[i].bsums[g] = (int16_t)s;
    }
  }
}

// ================================================================ scalar reference dot products
// Legacy types: Σ_blocks (d_w·d_a)·Σ(q_w·q_a) [+ m_w·s_a]; K-quants: (d_w·d_a)·Σ_j sc_j·Σ(q·a) − (dmin·d_a)·Σ_j m_j·bsum_j.
// Float weights: double accumulation against the float activations.

template <class T, float (*Cvt)(T)>
static float ref_float(int64_t n, const void* vw, const void* va) {
  const T* w = (const T*)vw;
  const float* x = (const float*)va;
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)Cvt(w[i]) * (double)x[i];
  return (float)s;
}
static inline float cvt_f32(float f) { return f; }

// Signed codes of a legacy block (offset removed for the symmetric types).
static void codes_q4_0(const block_q4_0& b, int* q) {
  for (int j = 0; j < 16; j++) { q[j] = (b.qs[j] & 0xF) - 8; q[j + 16] = (b.qs[j] >> 4) - 8; }
}
static void codes_q4_1(const block_q4_1& b, int* q) {
  for (int j = 0; j < 16; j++) { q[j] = b.qs[j] & 0xF; q[j + 16] = b.qs[j] >> 4; }
}
static void codes_q5_0(const block_q5_0& b, int* q) {
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < QK; j++) q[j] = q5_code(b.qs, qh, j) - 16;
}
static void codes_q5_1(const block_q5_1& b, int* q) {
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < QK; j++) q[j] = q5_code(b.qs, qh, j);
}
static void codes_q8_0(const block_q8_0& b, int* q) {
  for (int j = 0; j < QK; j++) q[j] = b.qs[j];
}

void legacy_block_codes(GGMLType t, const void* block, int q[QK], uint16_t* d) {
  switch (t) {
    case GGMLType::Q4_0: codes_q4_0(*(const block_q4_0*)block, q); break;
    case GGMLType::Q5_0: codes_q5_0(*(const block_q5_0*)block, q); break;
    case GGMLType::Q8_0: codes_q8_0(*(const block_q8_0*)block, q); break;
    default: throw std::invalid_argument("legacy_block_codes: not Q4_0, Q5_0 or Q8_0");
  }
  std::memcpy(d, block, 2);  // d leads all three layouts
}

template <class B> static inline float min_term(const B&, const block_q8_32&) { return 0.0f; }
template <> inline float min_term(const block_q4_1& b, const block_q8_32& a) { return h2f(b.m) * (a.d * (float)a.sum); }
template <> inline float min_term(const block_q5_1& b, const block_q8_32& a) { return h2f(b.m) * (a.d * (float)a.sum); }

template <class B, void (*Codes)(const B&, int*), bool HasMin>
static float ref_legacy(int64_t n, const void* vw, const void* va) {
  const B* w = (const B*)vw;
  const block_q8_32* a = (const block_q8_32*)va;
  float sum = 0.0f;
  int q[QK];
  for (int64_t i = 0; i < n / QK; i++) {
    Codes(w[i], q);
    int sumi = 0;
    for (int j = 0; j < QK; j++) sumi += q[j] * a[i].qs[j];
    // One fma per block in block order: the packed kernels (packed.h) compute exactly this chain.
    sum = std::fma(h2f(w[i].d) * a[i].d, (float)sumi, sum);
    if constexpr (HasMin) sum += min_term(w[i], a[i]);
  }
  return sum;
}

template <class B, void (*Codes)(const B&, int8_t*)>
static float ref_k_min(int64_t n, const void* vw, const void* va) {
  const B* w = (const B*)vw;
  const block_q8_K* a = (const block_q8_K*)va;
  float sum = 0.0f;
  int8_t q[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++) {
    uint8_t sc[8], m[8];
    k4_scales(w[i].scales, sc, m);
    Codes(w[i], q);
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
      int s = 0;
      for (int l = 0; l < 32; l++) s += q[32 * j + l] * a[i].qs[32 * j + l];
      sumi += sc[j] * s;
      summ += m[j] * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    // Two fmas per super-block in this order: the packed kernels (packed.h) compute exactly this chain.
    sum = std::fma(h2f(w[i].d) * a[i].d, (float)sumi, sum);
    sum = std::fma(-(h2f(w[i].dmin) * a[i].d), (float)summ, sum);
  }
  return sum;
}

static float ref_q6_K(int64_t n, const void* vw, const void* va) {
  const block_q6_K* w = (const block_q6_K*)vw;
  const block_q8_K* a = (const block_q8_K*)va;
  float sum = 0.0f;
  int8_t q[QK_K];
  for (int64_t i = 0; i < n / QK_K; i++) {
    codes_q6_K(w[i], q);
    int sumi = 0;
    for (int g = 0; g < 16; g++) {
      int s = 0;
      for (int l = 0; l < 16; l++) s += q[16 * g + l] * a[i].qs[16 * g + l];
      sumi += w[i].scales[g] * s;
    }
    sum = std::fma(h2f(w[i].d) * a[i].d, (float)sumi, sum);  // as the packed kernel
  }
  return sum;
}

// ================================================================ per-row SIMD kernels (AVX2, with AVX-512
// VNNI/BW shortcuts) of the types without a packed layout: Q4_1, Q5_1 and the float types. (Q4_0 … Q6_K run
// through packed.h in an AVX2 build and through the references above in a scalar one.)
// Signature: k<NC>(n, w_row, act, act_stride, out[NC]).
#if PS_AVX2

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m256i load256(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }

// 16 packed bytes → 32 values: low nibbles (elements 0..15), then high nibbles (16..31).
static inline __m256i nibbles32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128((const __m128i*)p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

// ---- Q4_1 / Q5_1: decoders to 32 unsigned codes
static inline __m256i dec_q4_1(const block_q4_1& b) { return nibbles32(b.qs); }
#if PS_AVX512BW
static inline __m256i dec_q5_1(const block_q5_1& b) {
  const __m256i nib = nibbles32(b.qs);
  return _mm256_mask_add_epi8(nib, (__mmask32)load_u32(b.qh), nib, _mm256_set1_epi8(16));
}
#else
static inline __m256i dec_q5_1(const block_q5_1& b) {
  return _mm256_or_si256(nibbles32(b.qs), _mm256_and_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(0x10)));
}
#endif

static inline const block_q8_32* act32(const uint8_t* act, size_t stride, int c) {
  return (const block_q8_32*)(act + c * stride);
}

// Unsigned codes with a min: d_w·d_a·Σq·a + m_w·s_a.
template <class B, __m256i (*Dec)(const B&), int NC>
static void k_asym(int64_t n, const void* vw, const uint8_t* act, size_t stride, float* out) {
  const B* w = (const B*)vw;
  __m256 acc[NC];
  float summ[NC];
  for (int c = 0; c < NC; c++) { acc[c] = _mm256_setzero_ps(); summ[c] = 0.0f; }
  for (int64_t i = 0; i < n / QK; i++) {
    const __m256i qx = Dec(w[i]);
    const __m256 dw = _mm256_set1_ps(h2f(w[i].d));
    const float m = h2f(w[i].m);
    for (int c = 0; c < NC; c++) {
      const block_q8_32& a = act32(act, stride, c)[i];
      const __m256 p = _mm256_cvtepi32_ps(dp4(_mm256_setzero_si256(), qx, load256(a.qs)));
      acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.d)), p, acc[c]);
      summ[c] = std::fma(m, a.d * (float)a.sum, summ[c]);
    }
  }
  for (int c = 0; c < NC; c++) out[c] = hsum8(acc[c]) + summ[c];
}

// ---- float weights against float activations: 32 elements per step in 4 fma chains, scalar fma tail.
static inline __m256 ld8_f32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 ld8_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
static inline __m256 ld8_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

template <class T, __m256 (*Ld)(const T*), float (*Cvt)(T), int NC>
static void k_float(int64_t n, const void* vw, const uint8_t* act, size_t stride, float* out) {
  if constexpr (NC > 4) {  // 4 chains per column: more than 4 columns at once would spill
    k_float<T, Ld, Cvt, 4>(n, vw, act, stride, out);
    k_float<T, Ld, Cvt, NC - 4>(n, vw, act + 4 * stride, stride, out + 4);
    return;
  }
  const T* w = (const T*)vw;
  __m256 acc[NC][4];
  for (int c = 0; c < NC; c++)
    for (int r = 0; r < 4; r++) acc[c][r] = _mm256_setzero_ps();
  const int64_t nv = n & ~(int64_t)31;
  for (int64_t i = 0; i < nv; i += 32) {
    const __m256 wv[4] = {Ld(w + i), Ld(w + i + 8), Ld(w + i + 16), Ld(w + i + 24)};
    for (int c = 0; c < NC; c++) {
      const float* x = (const float*)(act + c * stride) + i;
      for (int r = 0; r < 4; r++) acc[c][r] = _mm256_fmadd_ps(wv[r], _mm256_loadu_ps(x + 8 * r), acc[c][r]);
    }
  }
  for (int c = 0; c < NC; c++) {
    const float* x = (const float*)(act + c * stride);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][1]), _mm256_add_ps(acc[c][2], acc[c][3])));
    for (int64_t i = nv; i < n; i++) s = std::fma(Cvt(w[i]), x[i], s);
    out[c] = s;
  }
}

#endif  // PS_AVX2

// ================================================================ dispatch

using DeqFn = void (*)(const void*, float*, int64_t);
using RefFn = float (*)(int64_t, const void*, const void*);
// A tile: nrows weight rows (row_bytes apart) × nc ≤ 8 activation rows, out[c · os + r]; the column
// count is dispatched once per tile rather than once per row.
using TileFn = void (*)(int64_t, const uint8_t*, size_t, int64_t, const uint8_t*, size_t, int, float*, size_t);

struct Kernels {
  TypeTraits tt;
  DeqFn deq;
  RefFn ref;
  TileFn tile;  // nullptr: no per-row SIMD kernel, the reference is used
};

#define PS_TILE_CASE(K, NC)                                                                     \
  case NC:                                                                                     \
    for (int64_t r = 0; r < nrows; r++) {                                                      \
      float t_[NC];                                                                            \
      K<NC>(n, w + r * rb, a, s, t_);                                                          \
      for (int c = 0; c < NC; c++) o[c * os + r] = t_[c];                                      \
    }                                                                                          \
    break;
#define PS_TILE(K)                                                                              \
  [](int64_t n, const uint8_t* w, size_t rb, int64_t nrows, const uint8_t* a, size_t s, int nc, float* o, size_t os) { \
    switch (nc) {                                                                              \
      PS_TILE_CASE(K, 1) PS_TILE_CASE(K, 2) PS_TILE_CASE(K, 3) PS_TILE_CASE(K, 4)              \
      PS_TILE_CASE(K, 5) PS_TILE_CASE(K, 6) PS_TILE_CASE(K, 7) default: PS_TILE_CASE(K, 8)     \
    }                                                                                          \
  }

#if PS_AVX2
template <int NC> static void k_f32(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) { k_float<float, ld8_f32, cvt_f32, NC>(n, w, a, s, o); }
template <int NC> static void k_f16(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) { k_float<uint16_t, ld8_f16, h2f, NC>(n, w, a, s, o); }
template <int NC> static void k_bf16(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) { k_float<uint16_t, ld8_bf16, bf16_to_fp32, NC>(n, w, a, s, o); }
template <int NC> static void k_q4_1(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) { k_asym<block_q4_1, dec_q4_1, NC>(n, w, a, s, o); }
template <int NC> static void k_q5_1(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) { k_asym<block_q5_1, dec_q5_1, NC>(n, w, a, s, o); }
#define PS_SIMD(k) PS_TILE(k)
#else
#define PS_SIMD(k) nullptr
#endif

// Constant-initialized: no static-init guard on the hot path.
static constexpr Kernels kt_f32{{"F32", 1, 4, ActFormat::F32}, deq_f32, ref_float<float, cvt_f32>, PS_SIMD(k_f32)};
static constexpr Kernels kt_f16{{"F16", 1, 2, ActFormat::F32}, deq_f16, ref_float<uint16_t, h2f>, PS_SIMD(k_f16)};
static constexpr Kernels kt_bf16{{"BF16", 1, 2, ActFormat::F32}, deq_bf16, ref_float<uint16_t, bf16_to_fp32>, PS_SIMD(k_bf16)};
static constexpr Kernels kt_q4_0{{"Q4_0", QK, sizeof(block_q4_0), ActFormat::Q8_32}, deq_q4_0, ref_legacy<block_q4_0, codes_q4_0, false>, nullptr};
static constexpr Kernels kt_q4_1{{"Q4_1", QK, sizeof(block_q4_1), ActFormat::Q8_32}, deq_q4_1, ref_legacy<block_q4_1, codes_q4_1, true>, PS_SIMD(k_q4_1)};
static constexpr Kernels kt_q5_0{{"Q5_0", QK, sizeof(block_q5_0), ActFormat::Q8_32}, deq_q5_0, ref_legacy<block_q5_0, codes_q5_0, false>, nullptr};
static constexpr Kernels kt_q5_1{{"Q5_1", QK, sizeof(block_q5_1), ActFormat::Q8_32}, deq_q5_1, ref_legacy<block_q5_1, codes_q5_1, true>, PS_SIMD(k_q5_1)};
static constexpr Kernels kt_q8_0{{"Q8_0", QK, sizeof(block_q8_0), ActFormat::Q8_32}, deq_q8_0, ref_legacy<block_q8_0, codes_q8_0, false>, nullptr};
static constexpr Kernels kt_q4_K{{"Q4_K", QK_K, sizeof(block_q4_K), ActFormat::Q8_K}, deq_k_min<block_q4_K, codes_q4_K>, ref_k_min<block_q4_K, codes_q4_K>, nullptr};
static constexpr Kernels kt_q5_K{{"Q5_K", QK_K, sizeof(block_q5_K), ActFormat::Q8_K}, deq_k_min<block_q5_K, codes_q5_K>, ref_k_min<block_q5_K, codes_q5_K>, nullptr};
static constexpr Kernels kt_q6_K{{"Q6_K", QK_K, sizeof(block_q6_K), ActFormat::Q8_K}, deq_q6_K, ref_q6_K, nullptr};

static const Kernels* kernels(uint32_t type) {
  switch ((GGMLType)type) {
    case GGMLType::F32: return &kt_f32;
    case GGMLType::F16: return &kt_f16;
    case GGMLType::BF16: return &kt_bf16;
    case GGMLType::Q4_0: return &kt_q4_0;
    case GGMLType::Q4_1: return &kt_q4_1;
    case GGMLType::Q5_0: return &kt_q5_0;
    case GGMLType::Q5_1: return &kt_q5_1;
    case GGMLType::Q8_0: return &kt_q8_0;
    case GGMLType::Q4_K: return &kt_q4_K;
    case GGMLType::Q5_K: return &kt_q5_K;
    case GGMLType::Q6_K: return &kt_q6_K;
    default: return nullptr;
  }
}

static const Kernels& kernels_or_throw(GGMLType t) {
  const Kernels* k = kernels((uint32_t)t);
  if (!k) throw std::invalid_argument("unsupported GGML type id " + std::to_string((uint32_t)t));
  return *k;
}

const TypeTraits* type_traits(uint32_t type) {
  const Kernels* k = kernels(type);
  return k ? &k->tt : nullptr;
}

size_t row_size(GGMLType t, int64_t n) {
  const TypeTraits& tt = kernels_or_throw(t).tt;
  if (n < 0 || n % tt.block_size)
    throw std::invalid_argument(std::string("row of ") + std::to_string(n) + " elements is not a multiple of the " +
                                tt.name + " block size " + std::to_string(tt.block_size));
  return (size_t)(n / tt.block_size) * tt.type_size;
}

size_t act_row_size(ActFormat f, int64_t n) {
  const int64_t bs = f == ActFormat::F32 ? 1 : f == ActFormat::Q8_32 ? QK : QK_K;
  if (n < 0 || n % bs)
    throw std::invalid_argument("activation row of " + std::to_string(n) + " elements is not a multiple of " +
                                std::to_string(bs));
  switch (f) {
    case ActFormat::F32: return (size_t)n * sizeof(float);
    case ActFormat::Q8_32: return (size_t)(n / QK) * sizeof(block_q8_32);
    default: return (size_t)(n / QK_K) * sizeof(block_q8_K);
  }
}

void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n) { kernels_or_throw(t).deq(src, dst, n); }

void quantize_act_row(ActFormat f, const float* x, void* dst, int64_t n) {
  act_row_size(f, n);  // validates n
  switch (f) {
    case ActFormat::F32: std::memcpy(dst, x, (size_t)n * sizeof(float)); break;
    case ActFormat::Q8_32: quant_q8_32(x, (block_q8_32*)dst, n); break;
    case ActFormat::Q8_K: quant_q8_K(x, (block_q8_K*)dst, n); break;
  }
}

float vec_dot_ref(GGMLType t, int64_t n, const void* w_row, const void* act_row) {
  return kernels_or_throw(t).ref(n, w_row, act_row);
}

void vec_dot_tile(GGMLType t, int64_t n, const void* w, size_t row_bytes, int64_t nrows, const void* act,
                  size_t act_stride, int ncols, float* out, size_t out_stride) {
  const Kernels& k = kernels_or_throw(t);
  const uint8_t* wb = (const uint8_t*)w;
  const uint8_t* a = (const uint8_t*)act;
  for (int c0 = 0; c0 < ncols; c0 += 8) {
    const int nc = std::min(8, ncols - c0);
    if (k.tile) {
      k.tile(n, wb, row_bytes, nrows, a + c0 * act_stride, act_stride, nc, out + c0 * out_stride, out_stride);
      continue;
    }
    for (int64_t r = 0; r < nrows; r++)
      for (int c = 0; c < nc; c++)
        out[(c0 + c) * out_stride + r] = k.ref(n, wb + r * row_bytes, a + (c0 + c) * act_stride);
  }
}

}  // namespace pyserve
