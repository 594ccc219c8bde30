// packed_blocks: the packed blocks' layout (packed.h) and the vector helpers that decode them, shared by
// the AVX kernels (packed.cpp) and the AMX kernels (packed_amx.cpp). Internal to those two files.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/quant.h"
#include "base/simd.h"

namespace pyserve::packed_detail {

// ---- packed blocks: one block (32 elements) or super-block (256) of 8 rows.
// "Interleaved" bytes: vector k (32 B) holds elements 4k..4k+3 of row r at bytes 4r..4r+3.
// "Nibbles": 4 vectors; low nibbles hold the interleave of elements 0..15, high nibbles of 16..31;
// qh[k] (5-bit codes) bit 4r + j is bit 4 of element 4k + j of row r.
struct pblock_q8_0 { uint16_t d[8]; int8_t q[256]; };                   // interleaved signed values
struct pblock_q4_0 { uint16_t d[8]; uint8_t q[128]; };                  // nibbles, codes = value + 8
struct pblock_q5_0 { uint16_t d[8]; uint32_t qh[8]; uint8_t q[128]; };  // nibbles + qh, codes = value + 16
// The K-quants keep each sub-block's high bits next to its nibbles: one forward stream per block (split
// streams measured 2-5x slower from DRAM at one column).
struct kmin_head {
  uint16_t d[8], dmin[8];
  uint8_t sc[8][8];       // [sub-block j][row]: 6-bit scales
  uint8_t m[4][8][2];     // [pair p][row]: the 6-bit mins of sub-blocks 2p, 2p + 1 (widened to the int16
};                        // pairs of vpdpwssd by min_pairs). 160 B: what follows stays 32-byte aligned
struct pblock_q4_K : kmin_head {
  uint8_t q[8][128];      // sub-block j (32 elements): nibbles, codes 0..15
};
struct pblock_q5_K : kmin_head {
  struct { uint8_t q[128]; uint32_t qh[8]; } sub[8];  // sub-block j: nibbles and bit 4, codes 0..31
};
struct pblock_q6_K {
  uint16_t d[8];
  int8_t sc[16][8];       // [group g of 16][row]: signed scales
  uint8_t pad[16];        // 32-byte alignment of the vectors (a load split over two cache lines costs twice)
  // Groups 2p, 2p + 1: nibbles, and bits 4-5 of the codes as 2-bit fields (hi[32 (k / 4) + b] bits
  // 2 (k % 4) + 0..1 belong to byte b of vector k), codes 0..63. Two shifts and masks restore four vectors:
  // a third of the work of one mask per bit (measured 26 → 31 GB/s at one column, in cache).
  struct { uint8_t q[128]; uint8_t hi[64]; } pair[8];
};
static_assert(sizeof(kmin_head) == 160 && sizeof(pblock_q5_K) == 8 * 176 + 32 && sizeof(pblock_q6_K) == 8 * 210 + 16,
              "layout");
static_assert(sizeof(pblock_q8_0) == 272 && sizeof(pblock_q4_0) == 144 && sizeof(pblock_q5_0) == 176, "8 × the block");

#if PS_AVX2
inline __m256i load256(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }

inline void split_nibbles(const uint8_t* q, __m256i* w) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 4; k++) {
    const __m256i v = load256(q + 32 * k);
    w[k] = _mm256_and_si256(v, m);
    w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
  }
}

// w[k] += 16 in the bytes whose bit is set in qh[k] (restores bit 4 of the codes).
inline void add_bit(const uint32_t* qh, __m256i* w) {
  const __m256i h = _mm256_set1_epi8(0x10);
  for (int k = 0; k < 8; k++)
#if PS_AVX512BW
    w[k] = _mm256_mask_add_epi8(w[k], (__mmask32)qh[k], w[k], h);
#else
    w[k] = _mm256_or_si256(w[k], _mm256_and_si256(bits_to_bytes(qh[k]), h));
#endif
}

// w[k] |= bits 4-5 from their 2-bit fields (interleave_high2). 16-bit shifts: what crosses into a
// neighbouring byte lands outside 0x30 and is masked away.
inline void add_high2(const uint8_t* hi, __m256i* w) {
  const __m256i m = _mm256_set1_epi8(0x30);
  for (int half = 0; half < 2; half++) {
    const __m256i h = load256(hi + 32 * half);
    const __m256i f[4] = {_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2), h, _mm256_srli_epi16(h, 2)};
    for (int k = 0; k < 4; k++)
#if PS_AVX512BW
      w[4 * half + k] = _mm256_ternarylogic_epi32(w[4 * half + k], f[k], m, 0xF8);  // a | (b & c)
#else
      w[4 * half + k] = _mm256_or_si256(w[4 * half + k], _mm256_and_si256(f[k], m));
#endif
  }
}

inline void dec_q4_0(const pblock_q4_0& b, __m256i* w) { split_nibbles(b.q, w); }
inline void dec_q5_0(const pblock_q5_0& b, __m256i* w) {
  split_nibbles(b.q, w);
  add_bit(b.qh, w);
}

template <class PB>
inline void dec_sub_k(const PB& b, int j, __m256i* w) {
  if constexpr (std::is_same_v<PB, pblock_q5_K>) {
    split_nibbles(b.sub[j].q, w);
    add_bit(b.sub[j].qh, w);
  } else {
    split_nibbles(b.q[j], w);
  }
}

// Pair p's mins as the 8 rows' int16 pairs (m_2p, m_2p+1).
inline __m256i min_pairs(const kmin_head& b, int p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)b.m[p]));
}

// Σ_j m_j · (bsums[2j] + bsums[2j+1]) per row, with the mins as int16 pairs.
inline __m256i mins_term(const kmin_head& b, const block_q8_K& a) {
  int16_t s[8];
  for (int j = 0; j < 8; j++) s[j] = (int16_t)(a.bsums[2 * j] + a.bsums[2 * j + 1]);
  __m256i m = _mm256_setzero_si256();
  for (int p = 0; p < 4; p++) {
    int32_t pair;
    std::memcpy(&pair, s + 2 * p, 4);
    m = dp2(m, min_pairs(b, p), _mm256_set1_epi32(pair));
  }
  return m;
}
#endif  // PS_AVX2

}  // namespace pyserve::packed_detail
