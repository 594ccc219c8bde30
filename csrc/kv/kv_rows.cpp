#include "kv/kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kv/kv_formats.h"
#include "kernels/quant.h"
#include "base/simd.h"

namespace pyserve {

namespace {

constexpr const char* kNames[] = {"f32", "f16", "bf16", "q8_0"};

void write_f16(const float* x, uint16_t* h, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; i++) h[i] = fp32_to_fp16(x[i]);
}

// Round to nearest even (NaN stays a quiet NaN), as ggml's fp32 → bf16.
uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);
  return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

void write_q8_0(const float* x, block_q8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / QK; b++, x += QK) {
    float amax = 0.f;
    for (int j = 0; j < QK; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < QK; j++) y[b].qs[j] = (int8_t)std::round(x[j] * id);
  }
}

}  // namespace

KVDType kv_dtype_from_name(const std::string& name) {
  for (int i = 0; i < 4; i++)
    if (name == kNames[i]) return (KVDType)i;
  throw std::invalid_argument("kv_cache_dtype must be one of f32, f16, bf16, q8_0, got '" + name + "'");
}

const char* kv_dtype_name(KVDType t) { return kNames[(int)t]; }

int kv_dtype_block(KVDType t) { return t == KVDType::Q8_0 ? QK : 1; }

size_t kv_row_bytes(KVDType t, int64_t n) {
  switch (t) {
    case KVDType::F32: return (size_t)n * 4;
    case KVDType::Q8_0: return (size_t)(n / QK) * sizeof(block_q8_0);
    default: return (size_t)n * 2;
  }
}

void kv_write_row(KVDType t, const float* x, uint8_t* dst, int64_t n) {
  switch (t) {
    case KVDType::F32: std::memcpy(dst, x, (size_t)n * 4); return;
    case KVDType::F16: return write_f16(x, (uint16_t*)dst, n);
    case KVDType::Q8_0: return write_q8_0(x, (block_q8_0*)dst, n);
    case KVDType::BF16:
      for (int64_t i = 0; i < n; i++) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
  }
}

void kv_read_row(KVDType t, const uint8_t* src, float* x, int64_t n) {
  with_rows(t, [&](auto rows) {
    for (int64_t i = 0; i < n; i++) x[i] = decltype(rows)::at(src, (int)i);
  });
}

namespace {

// One score in the SIMD kernels' order: 16 values a step into two 8-lane accumulators (even and odd
// chunks), added, summed across lanes as hsum8 does (simd.h), then the tail one value at a time.
template <class R>
float dot_ref(const float* q, const uint8_t* k, int hd) {
  float a0[8] = {}, a1[8] = {}, v[8];
  int i = 0;
  for (; i + 16 <= hd; i += 16)
    for (int l = 0; l < 8; l++) {
      a0[l] = std::fma(q[i + l], R::at(k, i + l), a0[l]);
      a1[l] = std::fma(q[i + 8 + l], R::at(k, i + 8 + l), a1[l]);
    }
  for (int l = 0; l < 8; l++) v[l] = a0[l] + a1[l];
  float sum = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  for (; i < hd; i++) sum = std::fma(q[i], R::at(k, i), sum);
  return sum;
}

}  // namespace

namespace {

template <class R>
void widen_rows(const uint8_t* const* x, int n, int hd, float* out) {
  for (int j = 0; j < n; j++, out += hd) {
    int i = 0;
#if PS_AVX2
    for (; i + 8 <= hd; i += 8) _mm256_storeu_ps(out + i, R::load8(x[j], i));
#endif
    for (; i < hd; i++) out[i] = R::at(x[j], i);
  }
}

}  // namespace

void kv_widen_rows(KVDType t, const uint8_t* const* x, int n, int hd, float* out) {
  with_rows(t, [&](auto rows) { widen_rows<decltype(rows)>(x, n, hd, out); });
}

void kv_scores_ref(KVDType t, const float* q, int nh, int hd, const uint8_t* const* k, int len, float* s) {
  with_rows(t, [&](auto rows) {
    for (int h = 0; h < nh; h++)
      for (int j = 0; j < len; j++) s[(size_t)h * len + j] = dot_ref<decltype(rows)>(q + (size_t)h * hd, k[j], hd);
  });
}

void kv_weighted_sum_ref(KVDType t, const float* w, int nh, int len, const uint8_t* const* v, int hd, float* out) {
  with_rows(t, [&](auto rows) {
    using R = decltype(rows);
    for (int h = 0; h < nh; h++)
      for (int i = 0; i < hd; i++) {
        float a = 0.f;
        for (int j = 0; j < len; j++) a = std::fma(w[(size_t)h * len + j], R::at(v[j], i), a);
        out[(size_t)h * hd + i] = a;
      }
  });
}

#if PS_AVX2
namespace {

// s[h·ss + p] = q_h · k_p for NH heads and NP rows: each row's K loaded once for all heads and each head's
// q once for all rows; per (h, p) dot_ref's order, whatever NH and NP.
template <class R, int NH, int NP>
void dot_heads_avx(const float* q, int hd, const uint8_t* const* k, float* s, int ss) {
  __m256 a0[NH][NP], a1[NH][NP];
  for (int h = 0; h < NH; h++)
    for (int p = 0; p < NP; p++) a0[h][p] = a1[h][p] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= hd; i += 16) {
    __m256 k0[NP], k1[NP];
    for (int p = 0; p < NP; p++) {
      k0[p] = R::load8(k[p], i);
      k1[p] = R::load8(k[p], i + 8);
    }
    for (int h = 0; h < NH; h++) {
      const __m256 q0 = _mm256_loadu_ps(q + h * hd + i), q1 = _mm256_loadu_ps(q + h * hd + i + 8);
      for (int p = 0; p < NP; p++) {
        a0[h][p] = _mm256_fmadd_ps(q0, k0[p], a0[h][p]);
        a1[h][p] = _mm256_fmadd_ps(q1, k1[p], a1[h][p]);
      }
    }
  }
  for (int h = 0; h < NH; h++)
    for (int p = 0; p < NP; p++) {
      float sum = hsum8(_mm256_add_ps(a0[h][p], a1[h][p]));
      for (int j = i; j < hd; j++) sum = std::fma(q[h * hd + j], R::at(k[p], j), sum);
      s[h * ss + p] = sum;
    }
}

template <class R, int NH>
void dot_heads_rows(const float* q, int hd, const uint8_t* const* k, int len, float* s, const uint8_t* const* next,
                    size_t rb) {
  // Two rows at a time where 32 vector registers hold the 4·NH·2 accumulators.
  constexpr int NP = PS_AVX512BW ? 2 : 1, AHEAD = 16;  // rows prefetched ahead: the cache misses them
  int j = 0;
  for (; j + NP <= len; j += NP) {
    for (int p = j + AHEAD; p < std::min(len, j + AHEAD + NP); p++)
      for (size_t b = 0; b < rb; b += 64) {
        _mm_prefetch((const char*)k[p] + b, _MM_HINT_T0);
        if (next) _mm_prefetch((const char*)next[p] + b, _MM_HINT_T1);
      }
    dot_heads_avx<R, NH, NP>(q, hd, k + j, s + j, len);
  }
  for (; j < len; j++) dot_heads_avx<R, NH, 1>(q, hd, k + j, s + j, len);
}

// 32 output dims × NH heads in registers while the rows stream past.
template <class R, int NH>
void weighted_sum_avx(const float* w, int len, const uint8_t* const* v, int hd, float* out, size_t rb) {
  int i0 = 0;
  for (; i0 + 32 <= hd; i0 += 32) {
    __m256 acc[NH][4];
    for (int h = 0; h < NH; h++)
      for (int c = 0; c < 4; c++) acc[h][c] = _mm256_setzero_ps();
    for (int j = 0; j < len; j++) {
      // The first pass brings whole rows in from memory well ahead (the rows are scattered over blocks, a
      // miss costs ~100 ns); the later passes find them in L2.
      if (i0 == 0 && j + 32 < len)
        for (size_t b = 0; b < rb; b += 64) _mm_prefetch((const char*)v[j + 32] + b, _MM_HINT_T0);
      __m256 x[4];
      for (int c = 0; c < 4; c++) x[c] = R::load8(v[j], i0 + 8 * c);
      for (int h = 0; h < NH; h++) {
        __m256 wj = _mm256_set1_ps(w[h * len + j]);
        for (int c = 0; c < 4; c++) acc[h][c] = _mm256_fmadd_ps(wj, x[c], acc[h][c]);
      }
    }
    for (int h = 0; h < NH; h++)
      for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + h * hd + i0 + 8 * c, acc[h][c]);
  }
  for (int i = i0; i < hd; i++)
    for (int h = 0; h < NH; h++) {
      float a = 0.f;
      for (int j = 0; j < len; j++) a = std::fma(w[h * len + j], R::at(v[j], i), a);
      out[h * hd + i] = a;
    }
}

template <class R>
void scores_avx(const float* q, int nh, int hd, const uint8_t* const* k, int len, float* s,
                const uint8_t* const* next, size_t rb) {
  for (int h0 = 0; h0 < nh; h0 += 4) {
    const float* qh = q + h0 * hd;
    float* sh = s + (size_t)h0 * len;
    const uint8_t* const* nx = h0 == 0 ? next : nullptr;
    switch (std::min(4, nh - h0)) {
      case 4: dot_heads_rows<R, 4>(qh, hd, k, len, sh, nx, rb); break;
      case 3: dot_heads_rows<R, 3>(qh, hd, k, len, sh, nx, rb); break;
      case 2: dot_heads_rows<R, 2>(qh, hd, k, len, sh, nx, rb); break;
      default: dot_heads_rows<R, 1>(qh, hd, k, len, sh, nx, rb); break;
    }
  }
}

template <class R>
void weighted_avx(const float* w, int nh, int len, const uint8_t* const* v, int hd, float* out, size_t rb) {
  // Four heads per pass where 32 vector registers hold their 16 accumulators: each V value converted once.
  constexpr int MAX_NH = PS_AVX512BW ? 4 : 2;
  for (int h0 = 0; h0 < nh; h0 += MAX_NH) {
    const float* wh = w + (size_t)h0 * len;
    float* oh = out + h0 * hd;
    switch (std::min(MAX_NH, nh - h0)) {
      case 4: weighted_sum_avx<R, PS_AVX512BW ? 4 : 1>(wh, len, v, hd, oh, rb); break;
      case 3: weighted_sum_avx<R, PS_AVX512BW ? 3 : 1>(wh, len, v, hd, oh, rb); break;
      case 2: weighted_sum_avx<R, 2>(wh, len, v, hd, oh, rb); break;
      default: weighted_sum_avx<R, 1>(wh, len, v, hd, oh, rb); break;
    }
  }
}

}  // namespace
#endif

void kv_scores(KVDType t, const float* q, int nh, int hd, const uint8_t* const* k, int len, float* s,
               const uint8_t* const* next) {
#if PS_AVX2
  const size_t rb = kv_row_bytes(t, hd);
  with_rows(t, [&](auto rows) { scores_avx<decltype(rows)>(q, nh, hd, k, len, s, next, rb); });
#else
  kv_scores_ref(t, q, nh, hd, k, len, s);
#endif
}

void kv_weighted_sum(KVDType t, const float* w, int nh, int len, const uint8_t* const* v, int hd, float* out) {
#if PS_AVX2
  const size_t rb = kv_row_bytes(t, hd);
  with_rows(t, [&](auto rows) { weighted_avx<decltype(rows)>(w, nh, len, v, hd, out, rb); });
#else
  kv_weighted_sum_ref(t, w, nh, len, v, hd, out);
#endif
}

}  // namespace pyserve
