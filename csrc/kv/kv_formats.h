// kv_formats: how each KV row format (kv_rows.h) widens its values to f32, for the kernels that read rows
// in place (kv_rows.cpp, attention_tile.cpp). Every widening is exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "kv/kv_rows.h"
#include "kernels/quant.h"
#include "base/simd.h"

namespace pyserve {

// How each format widens value i of a row to f32 (at: one value; load8 / load16: values i … i + 7 / 15, i a
// multiple of 8 / 16). The quantized ones: i / 32 picks the block, and 8 values never straddle two.
struct RowsF32 {
  static float at(const uint8_t* r, int i) {
    float f;
    std::memcpy(&f, r + 4 * i, 4);
    return f;
  }
#if PS_AVX2
  static __m256 load8(const uint8_t* r, int i) { return _mm256_loadu_ps((const float*)r + i); }
#endif
#if PS_AVX512BW
  static __m512 load16(const uint8_t* r, int i) { return _mm512_loadu_ps((const float*)r + i); }
#endif
};

struct RowsF16 {
  static float at(const uint8_t* r, int i) { return fp16_to_fp32(u16(r + 2 * i)); }
  static uint16_t u16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  }
#if PS_AVX2
  static __m256 load8(const uint8_t* r, int i) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(r + 2 * i))); }
#endif
#if PS_AVX512BW
  static __m512 load16(const uint8_t* r, int i) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(r + 2 * i))); }
#endif
};

struct RowsBF16 {
  static float at(const uint8_t* r, int i) { return bf16_to_fp32(RowsF16::u16(r + 2 * i)); }
#if PS_AVX2
  static __m256 load8(const uint8_t* r, int i) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(r + 2 * i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
#endif
#if PS_AVX512BW
  static __m512 load16(const uint8_t* r, int i) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(r + 2 * i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
#endif
};

struct RowsQ8 {  // block_q8_0: d (fp16), 32 int8
  static const uint8_t* block(const uint8_t* r, int i) { return r + (size_t)(i / QK) * sizeof(block_q8_0); }
  static float at(const uint8_t* r, int i) {
    const uint8_t* b = block(r, i);
    return fp16_to_fp32(RowsF16::u16(b)) * (float)(int8_t)b[2 + i % QK];
  }
#if PS_AVX2
  static __m256 load8(const uint8_t* r, int i) {
    const uint8_t* b = block(r, i);
    const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(b + 2 + i % QK)));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(RowsF16::u16(b))), _mm256_cvtepi32_ps(q));
  }
#endif
#if PS_AVX512BW
  static __m512 load16(const uint8_t* r, int i) {  // i a multiple of 16: within one block
    const uint8_t* b = block(r, i);
    const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 2 + i % QK)));
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(RowsF16::u16(b))), _mm512_cvtepi32_ps(q));
  }
#endif
};

// Calls f.template operator()<Rows>() for t's row format (one switch for every kernel).
template <class F>
void with_rows(KVDType t, F&& f) {
  switch (t) {
    case KVDType::F32: return f(RowsF32{});
    case KVDType::F16: return f(RowsF16{});
    case KVDType::BF16: return f(RowsBF16{});
    case KVDType::Q8_0: return f(RowsQ8{});
  }
}

}  // namespace pyserve
