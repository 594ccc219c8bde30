// packed: see packed.h for the layout and the arithmetic contract.
#include "kernels/packed.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/packed_amx.h"
#include "kernels/packed_blocks.h"
#include "base/simd.h"

namespace pyserve {
namespace {
using namespace packed_detail;

// ---- packing (scalar, once at load). c: codes of row r at c + r · cs.

void interleave_bytes(const uint8_t* c, size_t cs, uint8_t* out) {  // 32 codes per row
  for (int k = 0; k < 8; k++)
    for (int r = 0; r < 8; r++) std::memcpy(out + 32 * k + 4 * r, c + r * cs + 4 * k, 4);
}

// qh4 (zeroed by the caller, or null): bit 4 of the codes.
void interleave_nibbles(const uint8_t* c, size_t cs, uint8_t* q, uint32_t* qh4) {
  for (int k = 0; k < 4; k++)
    for (int r = 0; r < 8; r++)
      for (int j = 0; j < 4; j++) {
        const uint8_t lo = c[r * cs + 4 * k + j], hi = c[r * cs + 4 * (k + 4) + j];
        const int bit = 4 * r + j;
        q[32 * k + bit] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
        if (qh4) {
          qh4[k] |= (uint32_t)(lo >> 4 & 1) << bit;
          qh4[k + 4] |= (uint32_t)(hi >> 4 & 1) << bit;
        }
      }
}

// hi (64 bytes, zeroed by the caller): bits 4-5 of the codes that interleave_nibbles' vector k holds at
// byte b, in bits 2 (k % 4) + 0..1 of hi[32 (k / 4) + b] (vectors 0-3: elements 0..15, 4-7: 16..31).
void interleave_high2(const uint8_t* c, size_t cs, uint8_t* hi) {
  for (int k = 0; k < 4; k++)
    for (int r = 0; r < 8; r++)
      for (int j = 0; j < 4; j++) {
        const int b = 4 * r + j;
        hi[b] |= (uint8_t)((c[r * cs + 4 * k + j] >> 4 & 3) << 2 * k);
        hi[32 + b] |= (uint8_t)((c[r * cs + 4 * (k + 4) + j] >> 4 & 3) << 2 * k);
      }
}

// The 32 codes of one legacy block as stored packed (Q8_0: the signed values; Q4_0 / Q5_0: value + 8 / + 16)
// and its scale bits.
void legacy_codes(GGMLType t, const uint8_t* b, uint8_t c[32], uint16_t* d) {
  int q[QK];
  legacy_block_codes(t, b, q, d);
  const int offset = t == GGMLType::Q4_0 ? 8 : t == GGMLType::Q5_0 ? 16 : 0;
  for (int j = 0; j < QK; j++) c[j] = (uint8_t)(q[j] + offset);
}

// One packed block from the 8 source blocks src[r] (row r's block i).
void pack_legacy(GGMLType t, const uint8_t* const src[8], uint8_t* out) {
  uint8_t codes[8][32];
  uint16_t d[8];
  for (int r = 0; r < 8; r++) legacy_codes(t, src[r], codes[r], d + r);
  if (t == GGMLType::Q8_0) {
    auto& p = *(pblock_q8_0*)out;
    std::memcpy(p.d, d, 16);
    interleave_bytes(&codes[0][0], 32, (uint8_t*)p.q);
  } else if (t == GGMLType::Q5_0) {
    auto& p = *(pblock_q5_0*)out;
    std::memcpy(p.d, d, 16);
    std::memset(p.qh, 0, sizeof(p.qh));
    interleave_nibbles(&codes[0][0], 32, p.q, p.qh);
  } else {
    auto& p = *(pblock_q4_0*)out;
    std::memcpy(p.d, d, 16);
    interleave_nibbles(&codes[0][0], 32, p.q, nullptr);
  }
}

void pack_k(GGMLType t, const uint8_t* const src[8], uint8_t* out) {
  KBlockCodes kc[8];
  for (int r = 0; r < 8; r++) k_block_codes(t, src[r], kc[r]);
  const size_t cs = sizeof(KBlockCodes);
  if (t == GGMLType::Q6_K) {
    auto& p = *(pblock_q6_K*)out;
    for (int r = 0; r < 8; r++) {
      p.d[r] = kc[r].d;
      for (int g = 0; g < 16; g++) p.sc[g][r] = kc[r].sc[g];
    }
    std::memset(p.pair, 0, sizeof(p.pair));
    for (int j = 0; j < 8; j++) {
      interleave_nibbles(kc[0].q + 32 * j, cs, p.pair[j].q, nullptr);
      interleave_high2(kc[0].q + 32 * j, cs, p.pair[j].hi);
    }
    return;
  }
  auto& h = *(kmin_head*)out;
  for (int r = 0; r < 8; r++) {
    h.d[r] = kc[r].d;
    h.dmin[r] = kc[r].dmin;
    for (int j = 0; j < 8; j++) {
      h.sc[j][r] = (uint8_t)kc[r].sc[j];
      h.m[j / 2][r][j % 2] = kc[r].m[j];
    }
  }
  if (t == GGMLType::Q4_K) {
    auto& p = *(pblock_q4_K*)out;
    for (int j = 0; j < 8; j++) interleave_nibbles(kc[0].q + 32 * j, cs, p.q[j], nullptr);
    return;
  }
  auto& p = *(pblock_q5_K*)out;
  std::memset(p.sub, 0, sizeof(p.sub));
  for (int j = 0; j < 8; j++) interleave_nibbles(kc[0].q + 32 * j, cs, p.sub[j].q, p.sub[j].qh);
}

size_t pblock_size(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return sizeof(pblock_q8_0);
    case GGMLType::Q5_0: return sizeof(pblock_q5_0);
    case GGMLType::Q4_0: return sizeof(pblock_q4_0);
    case GGMLType::Q4_K: return sizeof(pblock_q4_K);
    case GGMLType::Q5_K: return sizeof(pblock_q5_K);
    default: return sizeof(pblock_q6_K);
  }
}

bool is_k(GGMLType t) { return t == GGMLType::Q4_K || t == GGMLType::Q5_K || t == GGMLType::Q6_K; }

// ---- kernels

#if PS_AVX2
inline int32_t load_i32(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return v; }
inline __m256i bcast4(const int8_t* p) { return _mm256_set1_epi32(load_i32(p)); }

// dp4 against 4 activation bytes broadcast from memory. With AVX-512 VL the broadcast is folded into
// the instruction's memory operand ({1to8}), which compilers do not do on their own: one instruction
// instead of two per 32 multiply-adds.
inline __m256i dp4_bcast(__m256i acc, __m256i u, const int8_t* x) {
#if PS_VNNI == 1
  __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t*)x));
  return acc;
#else
  return dp4(acc, u, bcast4(x));
#endif
}

inline __m256i dot32(const __m256i* w, const int8_t* x, __m256i s0) {
  __m256i s1 = _mm256_setzero_si256();
  for (int k = 0; k < 8; k += 2) {
    s0 = dp4_bcast(s0, w[k], x + 4 * k);
    s1 = dp4_bcast(s1, w[k + 1], x + 4 * k + 4);
  }
  return _mm256_add_epi32(s0, s1);
}

// Software prefetch of the weight stream. Few columns (decode): PREFETCH_AHEAD bytes ahead, each line
// of a block once: the hardware prefetcher alone leaves a one-column product at 15-20 GB/s from DRAM with
// 2 threads; 1.3-1.8 KB ahead gives 25-27 (Q4_K and Q6_K, scripts/bench_quant.py's stream figures), and
// in cache it also saves L2 round trips. Many columns (compute-dense): the same block of the next group,
// one group ahead (measured: 74 vs 115 GMAC/s from DRAM vs from cache at 8 columns).
constexpr size_t PREFETCH_AHEAD = 1536;
// The 512-bit one-column kernels (group_pair_z, q8_0_pair_z) spend fewer instructions per byte and run
// further ahead of their loads: into L1 4 KB ahead (Q6_K 4-5 %, Q4_K ~2 % faster than 1.5 KB; 1-12 KB
// tried), and into L2 16 KB ahead (8 KB: 5-9 % more, 16 KB 3-5 % more again; then the L1 prefetch finds its
// line in L2 and holds a fill buffer for a short while), alternated passes of 2 threads from memory,
// docs/BENCHMARKS.md 2026-12-06 (night).
constexpr size_t PREFETCH_AHEAD_Z = 4096, PREFETCH_FAR_Z = 16384;
// Each line of one block's bytes from p on, into L1 (or with HINT _MM_HINT_T1, into L2).
template <class PB, auto HINT = _MM_HINT_T0>  // auto: the hint keeps its type (an enum in GCC, an int in Clang)
inline void prefetch_block(const char* p) {
  for (size_t l = 0; l < sizeof(PB); l += 64) _mm_prefetch(p + l, HINT);
}
template <int NC, class PB>
inline void prefetch_weights(const PB* b, int64_t nb, int64_t i) {
  prefetch_block<PB>(NC >= 4 ? (const char*)(b + nb + i) : (const char*)(b + i) + PREFETCH_AHEAD);
}

// ---- legacy: Σ_blocks fma(d_w·d_a, Σ codes·a − OFF·Σa, acc)

// Q8_0 with VNNI: value + 128 (offset 128). Without VNNI the signed values are kept and the kernel moves
// the sign onto the activation instead (offset 0).
inline void dec_q8_0(const pblock_q8_0& b, __m256i* w) {
  for (int k = 0; k < 8; k++) w[k] = PS_VNNI ? _mm256_xor_si256(load256(b.q + 32 * k), _mm256_set1_epi8((char)0x80))
                                             : load256(b.q + 32 * k);
}

// One group × NC columns over all nb blocks. SIGNED: w holds signed values (Q8_0 without VNNI),
// multiplied as |w| · sign(a, w).
template <class PB, void (*Dec)(const PB&, __m256i*), int OFF, bool SIGNED, int NC>
void group_legacy(const uint8_t* blocks, int64_t nb, const uint8_t* act, size_t stride, float* out, size_t os) {
  const PB* b = (const PB*)blocks;
  __m256 acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    prefetch_weights<NC>(b, nb, i);
    __m256i w[8], aw[8];
    Dec(b[i], w);
    if (SIGNED)
      for (int k = 0; k < 8; k++) aw[k] = _mm256_abs_epi8(w[k]);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b[i].d));
    for (int c = 0; c < NC; c++) {
      const block_q8_32& a = ((const block_q8_32*)(act + c * stride))[i];
      __m256i s;
      if (SIGNED) {
        s = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) s = dp4(s, aw[k], _mm256_sign_epi8(bcast4(a.qs + 4 * k), w[k]));
      } else {
        s = dot32(w, a.qs, _mm256_set1_epi32(-OFF * a.sum));
      }
      acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.d)), _mm256_cvtepi32_ps(s), acc[c]);
    }
  }
  for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * os, acc[c]);
}

// ---- Q4_K / Q5_K: per super-block fma(d·d_a, Σ_j sc_j·Σ q·a, acc) then fma(−dmin·d_a, Σ_j m_j·Σa_j, acc)

// Q4_K with VNNI keeps each high nibble in place (16 · code: one AND, no shift), its sum shifted back
// once per sub-block (exact: every term is a multiple of 16); maddubs' int16 pairs would saturate on it.
constexpr bool HIGH_IN_PLACE = PS_VNNI != 0;

// Sub-block j's codes in w and its 8 rows' scales (zero-extended: the int16 pairs (sc, 0) of dp2).
template <class PB>
inline __m256i kmin_codes(const PB& b, int j, __m256i* w) {
  if constexpr (std::is_same_v<PB, pblock_q4_K> && HIGH_IN_PLACE) {
    const __m256i lo = _mm256_set1_epi8(0x0F), hi = _mm256_set1_epi8((char)0xF0);
    for (int k = 0; k < 4; k++) {
      const __m256i v = load256(b.q[j] + 32 * k);
      w[k] = _mm256_and_si256(v, lo);
      w[k + 4] = _mm256_and_si256(v, hi);
    }
  } else {
    dec_sub_k(b, j, w);
  }
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)b.sc[j]));
}
// tot + sub-block j's sums times the rows' scales. Q4_K's halves (16 codes of 0..15 against |a| <= 128:
// |sum| <= 30,720) fit the int16 that dp2 multiplies, one instruction each; Q5_K's (codes to 31) do not.
template <class PB>
inline __m256i kmin_sub(const __m256i* w, __m256i sc, const block_q8_K& a, int j, __m256i tot) {
  const int8_t* x = a.qs + 32 * j;
  if constexpr (std::is_same_v<PB, pblock_q4_K>) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
      lo = dp4_bcast(lo, w[k], x + 4 * k);
      hi = dp4_bcast(hi, w[k + 4], x + 16 + 4 * k);
    }
    return dp2(dp2(tot, lo, sc), HIGH_IN_PLACE ? _mm256_srai_epi32(hi, 4) : hi, sc);
  } else {
    return _mm256_add_epi32(tot, _mm256_mullo_epi32(dot32(w, x, _mm256_setzero_si256()), sc));
  }
}
// acc + the super-block's scaled sums (tot) less its mins.
template <class PB>
inline __m256 kmin_scale(const PB& b, const block_q8_K& a, __m256i tot, __m256 acc) {
  const __m256 da = _mm256_set1_ps(a.d);
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b.d));
  const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b.dmin));
  acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(tot), acc);
  return _mm256_fnmadd_ps(_mm256_mul_ps(dm, da), _mm256_cvtepi32_ps(mins_term(b, a)), acc);
}

template <class PB, int NC>
void group_kmin(const uint8_t* blocks, int64_t nb, const uint8_t* act, size_t stride, float* out, size_t os) {
  const PB* b = (const PB*)blocks;
  __m256 acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    prefetch_weights<NC>(b, nb, i);
    __m256i tot[NC];
    for (int c = 0; c < NC; c++) tot[c] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
      __m256i w[8];
      const __m256i sc = kmin_codes(b[i], j, w);
      for (int c = 0; c < NC; c++)
        tot[c] = kmin_sub<PB>(w, sc, ((const block_q8_K*)(act + c * stride))[i], j, tot[c]);
    }
    for (int c = 0; c < NC; c++) acc[c] = kmin_scale(b[i], ((const block_q8_K*)(act + c * stride))[i], tot[c], acc[c]);
  }
  for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * os, acc[c]);
}

// Where decode prefetches: a distance further along the order in which the pair kernels read a thread's
// groups (the two groups of a pair side by side, block by block, then the next pair), so that past a pair's
// end it lands in the next pair at the same offset. Both groups' targets move one block per step.
class PairStream {
 public:
  PairStream(size_t group_bytes, size_t dist) : group_(group_bytes), pairs_(dist / group_bytes), off_(dist % group_bytes) {}
  // The target for group g (0 or 1) of the pair whose group 0 starts at b0.
  const char* at(const void* b0, int g) const { return (const char*)b0 + (2 * pairs_ + g) * group_ + off_; }
  void advance(size_t block_bytes) {  // block_bytes <= group_bytes
    off_ += block_bytes;
    if (off_ >= group_) off_ -= group_, pairs_++;
  }

 private:
  size_t group_, pairs_, off_;
};

// Decode's prefetch of a block PREFETCH_AHEAD bytes ahead, issued an eighth at a time through the chain of
// the block before it rather than all at once: a burst of 20-27 prefetches fills the core's line-fill
// buffers and stalls the arithmetic behind it (the stalls showed in `perf` on the prefetch instructions).
struct SpreadPrefetch {
  static constexpr size_t PARTS = 8;  // the steps of a block's chain: 8 sub-blocks (Q4_K, Q5_K), 8 group pairs (Q6_K)
  const char* p;
  size_t lines;
  void part(size_t j) const {
    for (size_t l = lines * j / PARTS; l < lines * (j + 1) / PARTS; l++) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
  }
};

// One super-block of one column: group_kmin<PB, 1>'s chain (group_pair's step).
template <class PB>
inline __m256 kmin_block(const PB& b, const block_q8_K& a, __m256 acc, const SpreadPrefetch& pf) {
  __m256i tot = _mm256_setzero_si256();
  for (int j = 0; j < 8; j++) {
    pf.part(j);
    __m256i w[8];
    const __m256i sc = kmin_codes(b, j, w);
    tot = kmin_sub<PB>(w, sc, a, j, tot);
  }
  return kmin_scale(b, a, tot, acc);
}

// Decode's one column takes two groups at once (group_pair): each group's chain is its one-column kernel's,
// operation for operation (bit-identical), but the two interleave, so that one group's codes are computed on
// while the other's lines come in — a lone group's kernel alternates the two (docs/BENCHMARKS.md, 2026-12-05:
// from memory, 2 threads, Q4_K +4-21 %, Q6_K about +10 %, by sitting).
// Two groups × one column over all nb blocks, Step(block, activation block, acc) each block's chain.
template <class PB, class AB, __m256 (*Step)(const PB&, const AB&, __m256, const SpreadPrefetch&)>
void group_pair(const uint8_t* blocks0, const uint8_t* blocks1, int64_t nb, const uint8_t* act, float* out0,
                float* out1) {
  const PB* b0 = (const PB*)blocks0;
  const PB* b1 = (const PB*)blocks1;
  const AB* a = (const AB*)act;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  PairStream ahead(nb * sizeof(PB), PREFETCH_AHEAD);
  for (int64_t i = 0; i < nb; i++, ahead.advance(sizeof(PB))) {
    constexpr size_t lines = (sizeof(PB) + 63) / 64;
    acc0 = Step(b0[i], a[i], acc0, {ahead.at(b0, 0), lines});
    acc1 = Step(b1[i], a[i], acc1, {ahead.at(b0, 1), lines});
  }
  _mm256_storeu_ps(out0, acc0);
  _mm256_storeu_ps(out1, acc1);
}

// ---- Q6_K: per super-block fma(d·d_a, Σ_g sc_g·(Σ q·a − 32·Σa_g), acc)

// Group pair p's codes in w (groups 2p: w[0..3], 2p + 1: w[4..7]) and their scales.
inline void q6_K_codes(const pblock_q6_K& b, int p, __m256i* w, __m256i* sc) {
  split_nibbles(b.pair[p].q, w);
  add_high2(b.pair[p].hi, w);
  sc[0] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)b.sc[2 * p]));
  sc[1] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)b.sc[2 * p + 1]));
}
// Group pair p's scaled sums against one column, 32 subtracted from each code through the block sums.
inline __m256i q6_K_sub(const __m256i* w, const __m256i* sc, const block_q8_K& a, int p) {
  const int8_t* x = a.qs + 32 * p;
  __m256i s0 = dp4_bcast(_mm256_set1_epi32(-32 * a.bsums[2 * p]), w[0], x);
  __m256i s1 = dp4_bcast(_mm256_set1_epi32(-32 * a.bsums[2 * p + 1]), w[4], x + 16);
  for (int k = 1; k < 4; k++) {
    s0 = dp4_bcast(s0, w[k], x + 4 * k);
    s1 = dp4_bcast(s1, w[k + 4], x + 16 + 4 * k);
  }
  return _mm256_add_epi32(_mm256_mullo_epi32(s0, sc[0]), _mm256_mullo_epi32(s1, sc[1]));
}
inline __m256 q6_K_scale(const pblock_q6_K& b, const block_q8_K& a, __m256i tot, __m256 acc) {
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b.d));
  return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.d)), _mm256_cvtepi32_ps(tot), acc);
}

// One super-block of one column: group_q6_K<1>'s chain (group_pair's step).
inline __m256 q6_K_block(const pblock_q6_K& b, const block_q8_K& a, __m256 acc, const SpreadPrefetch& pf) {
  __m256i tot = _mm256_setzero_si256();
  for (int p = 0; p < 8; p++) {
    pf.part(p);
    __m256i w[8], sc[2];
    q6_K_codes(b, p, w, sc);
    tot = _mm256_add_epi32(tot, q6_K_sub(w, sc, a, p));
  }
  return q6_K_scale(b, a, tot, acc);
}

template <int NC>
void group_q6_K(const uint8_t* blocks, int64_t nb, const uint8_t* act, size_t stride, float* out, size_t os) {
  const pblock_q6_K* b = (const pblock_q6_K*)blocks;
  __m256 acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    prefetch_weights<NC>(b, nb, i);
    __m256i tot[NC];
    for (int c = 0; c < NC; c++) tot[c] = _mm256_setzero_si256();
    for (int p = 0; p < 8; p++) {
      __m256i w[8], sc[2];
      q6_K_codes(b[i], p, w, sc);
      for (int c = 0; c < NC; c++)
        tot[c] = _mm256_add_epi32(tot[c], q6_K_sub(w, sc, ((const block_q8_K*)(act + c * stride))[i], p));
    }
    for (int c = 0; c < NC; c++) acc[c] = q6_K_scale(b[i], ((const block_q8_K*)(act + c * stride))[i], tot[c], acc[c]);
  }
  for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * os, acc[c]);
}

#if PS_VNNI == 1 && PS_AVX512BW
// ---- Decode on 512-bit vectors (Q4_K, Q6_K, Q8_0). A step's 4 vectors of nibbles are read as 2 of 512 bits:
// lane r < 8 of half h holds row r's elements of vector 2h, lane 8 + r those of vector 2h + 1, and each
// activation vector carries the two matching 4-byte groups. A lane then sums 8 codes of a row where the
// 256-bit kernels sum 4; a row's two lanes are added when its block ends. Every sum is an exact integer, so
// each block's isum, and the outputs' bits, are group_pair's. Half the vpdpbusd instructions and ~30 %
// fewer vector µops per byte: decode streams the weights with more of the core's time left to wait on memory.

// A step's 32 activation bytes as the 4 vectors its nibbles meet: [0] the low nibbles of vectors 0, 1
// (elements 0-3 | 4-7), [1] of vectors 2, 3, [2] and [3] the high nibbles' (elements 16-23, 24-31).
struct ActQuads {
  __m512i v[4];
};
inline ActQuads act_quads(const int8_t* x) {
  const __m512i all = _mm512_zextsi256_si512(load256(x));
  ActQuads q;
  for (int h = 0; h < 4; h++)
    q.v[h] = _mm512_permutexvar_epi32(_mm512_inserti64x4(_mm512_set1_epi32(2 * h), _mm256_set1_epi32(2 * h + 1), 1), all);
  return q;
}
// A row's two lanes added: 16 lanes to 8.
inline __m256i fold_halves(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
// The 8 rows' bytes at p widened to 32 bits, in both halves.
template <class T>
inline __m512i rows16(const T* p) {
  int64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::is_signed_v<T>) return _mm512_cvtepi8_epi32(_mm_set1_epi64x(v));
  else return _mm512_cvtepu8_epi32(_mm_set1_epi64x(v));
}
// rows16 of unsigned bytes in one instruction where VBMI has a byte permute that reads its table from memory
// (a 64-byte read from p: Q4_K's scales lie 72+ bytes before its block's end). Q4_K's stream 2-3 % faster;
// Q6_K's signed scales (a permute and a shift, over split lines) measured slower, so they keep rows16.
inline __m512i rows16_u(const uint8_t* p) {
#ifdef __AVX512VBMI__
  alignas(64) static constexpr struct Idx { int8_t b[64]; } idx = [] {
    Idx x{};
    for (int l = 0; l < 16; l++) x.b[4 * l] = (int8_t)(l % 8);  // lane l's low byte: row l % 8's
    return x;
  }();
  return _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, _mm512_load_si512(idx.b), _mm512_loadu_si512(p));
#else
  return rows16(p);
#endif
}
// Two halves of 16-bit counts.
inline __m512i counts16(short lo, short hi) {
  return _mm512_inserti64x4(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi), 1);
}

// Q4_K: step j is sub-block j (kmin_sub's sums). A lane's sum of 8 codes of 0..15 against |a| <= 128
// (|sum| <= 15,360; the high nibbles' after the shift back) fits the int16 that vpdpwssd multiplies.
struct Q4KZ {
  using PB = pblock_q4_K;
  static __m512i step(const PB& b, const block_q8_K&, int j, const ActQuads& x, __m512i tot) {
    const __m512i lo = _mm512_set1_epi8(0x0F), hi = _mm512_set1_epi8((char)0xF0);
    const __m512i v0 = _mm512_loadu_si512(b.q[j]), v1 = _mm512_loadu_si512(b.q[j] + 64);
    __m512i l = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v0, lo), x.v[0]);
    l = _mm512_dpbusd_epi32(l, _mm512_and_si512(v1, lo), x.v[1]);
    __m512i h = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(v0, hi), x.v[2]);
    h = _mm512_dpbusd_epi32(h, _mm512_and_si512(v1, hi), x.v[3]);
    const __m512i s = rows16_u(b.sc[j]);
    return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(tot, l, s), _mm512_srai_epi32(h, 4), s);
  }
  static __m256 finish(const PB& b, const block_q8_K& a, __m512i tot, __m256 acc) {
    return kmin_scale(b, a, fold_halves(tot), acc);
  }
};

// Q6_K: step p is group pair p (q6_K_sub's sums; each group's 32 · Σa subtracted in its low half).
struct Q6KZ {
  using PB = pblock_q6_K;
  // nibbles | bits 4-5 from the 2-bit fields f, already shifted into bits 4-5 (add_high2's).
  static __m512i with_high2(__m512i nibbles, __m512i f) {
    return _mm512_ternarylogic_epi32(nibbles, f, _mm512_set1_epi8(0x30), 0xF8);  // a | (b & c)
  }
  static __m512i step(const PB& b, const block_q8_K& a, int p, const ActQuads& x, __m512i tot) {
    const __m512i m = _mm512_set1_epi8(0x0F);
    const __m512i v0 = _mm512_loadu_si512(b.pair[p].q), v1 = _mm512_loadu_si512(b.pair[p].q + 64);
    const __m512i ha = _mm512_broadcast_i64x4(load256(b.pair[p].hi));       // group 2p's fields
    const __m512i hb = _mm512_broadcast_i64x4(load256(b.pair[p].hi + 32));  // group 2p + 1's
    // vectors 0 | 1: the fields << 4 | << 2; vectors 2 | 3: as they are | >> 2
    const __m512i left = counts16(4, 2), right = counts16(0, 2);
    const __m512i w0 = with_high2(_mm512_and_si512(v0, m), _mm512_sllv_epi16(ha, left));
    const __m512i w1 = with_high2(_mm512_and_si512(v1, m), _mm512_srlv_epi16(ha, right));
    const __m512i w2 = with_high2(_mm512_and_si512(_mm512_srli_epi16(v0, 4), m), _mm512_sllv_epi16(hb, left));
    const __m512i w3 = with_high2(_mm512_and_si512(_mm512_srli_epi16(v1, 4), m), _mm512_srlv_epi16(hb, right));
    __m512i s0 = _mm512_maskz_set1_epi32(0x00FF, -32 * a.bsums[2 * p]);
    __m512i s1 = _mm512_maskz_set1_epi32(0x00FF, -32 * a.bsums[2 * p + 1]);
    s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s0, w0, x.v[0]), w1, x.v[1]);
    s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s1, w2, x.v[2]), w3, x.v[3]);
    tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(s0, rows16(b.sc[2 * p])));
    return _mm512_add_epi32(tot, _mm512_mullo_epi32(s1, rows16(b.sc[2 * p + 1])));
  }
  static __m256 finish(const PB& b, const block_q8_K& a, __m512i tot, __m256 acc) {
    return q6_K_scale(b, a, fold_halves(tot), acc);
  }
};

// Q8_0's one column, two groups at once, on 512-bit vectors: group_legacy<…, 1>'s outputs, bit for bit (a
// block's sum, −128 · Σa plus the 8 vectors' products, is an exact integer in any order).
void q8_0_pair_z(const uint8_t* blocks0, const uint8_t* blocks1, int64_t nb, const uint8_t* act, float* out0,
                 float* out1) {
  const pblock_q8_0* b[2] = {(const pblock_q8_0*)blocks0, (const pblock_q8_0*)blocks1};
  const block_q8_32* a = (const block_q8_32*)act;
  float* out[2] = {out0, out1};
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  PairStream near(nb * sizeof(pblock_q8_0), PREFETCH_AHEAD_Z), far(nb * sizeof(pblock_q8_0), PREFETCH_FAR_Z);
  for (int64_t i = 0; i < nb; i++, near.advance(sizeof(pblock_q8_0)), far.advance(sizeof(pblock_q8_0))) {
    const ActQuads x = act_quads(a[i].qs);
    const __m256 da = _mm256_set1_ps(a[i].d);
    for (int g = 0; g < 2; g++) {
      prefetch_block<pblock_q8_0>(near.at(b[0], g));
      prefetch_block<pblock_q8_0, _MM_HINT_T1>(far.at(b[0], g));
      __m512i s = _mm512_maskz_set1_epi32(0x00FF, -128 * a[i].sum);
      for (int h = 0; h < 4; h++)
        s = _mm512_dpbusd_epi32(s, _mm512_xor_si512(_mm512_loadu_si512(b[g][i].q + 64 * h), flip), x.v[h]);
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b[g][i].d));
      acc[g] = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(fold_halves(s)), acc[g]);
    }
  }
  for (int g = 0; g < 2; g++) _mm256_storeu_ps(out[g], acc[g]);
}

// A prefetch (into L1, or L2 with FAR) that the compiler keeps where it stands among the arithmetic: it
// gathers _mm_prefetch calls into one burst, the stall SpreadPrefetch avoids.
template <bool FAR>
inline void prefetch_here(const char* p) {
  if constexpr (FAR) __asm__ volatile("prefetcht1 %0" : : "m"(*p));
  else __asm__ volatile("prefetcht0 %0" : : "m"(*p));
}

// Step J's share of a block's LINES lines from p on (SpreadPrefetch::part's), at constant offsets: without
// part's loop, ~12 instructions per step.
template <bool FAR, size_t L0, size_t... L>
inline void prefetch_lines(const char* p, std::index_sequence<L...>) { (prefetch_here<FAR>(p + 64 * (L0 + L)), ...); }
template <size_t LINES, size_t J, bool FAR = false>
inline void prefetch_part(const char* p) {
  constexpr size_t l0 = LINES * J / SpreadPrefetch::PARTS, l1 = LINES * (J + 1) / SpreadPrefetch::PARTS;
  prefetch_lines<FAR, l0>(p, std::make_index_sequence<l1 - l0>{});
}

// The four addresses a pair's block prefetches: each group's, into L1 and into L2.
struct PairPrefetch {
  const char *near[2], *far[2];
};

// One block of both groups of a pair, its 8 steps unrolled.
template <class K, size_t... J>
inline void pair_block(const typename K::PB& b0, const typename K::PB& b1, const block_q8_K& a,
                       const PairPrefetch& pf, __m512i& t0, __m512i& t1, std::index_sequence<J...>) {
  constexpr size_t lines = (sizeof(typename K::PB) + 63) / 64;
  auto step = [&](auto j) {
    constexpr int s = decltype(j)::value;
    for (int g = 0; g < 2; g++) {
      prefetch_part<lines, s>(pf.near[g]);
      prefetch_part<lines, s, true>(pf.far[g]);
    }
    const ActQuads x = act_quads(a.qs + 32 * s);
    t0 = K::step(b0, a, s, x, t0);
    t1 = K::step(b1, a, s, x, t1);
  };
  (step(std::integral_constant<int, (int)J>{}), ...);
}

// group_pair on 512-bit vectors: the same outputs, bit for bit. K: Q4KZ or Q6KZ.
template <class K>
void group_pair_z(const uint8_t* blocks0, const uint8_t* blocks1, int64_t nb, const uint8_t* act, float* out0,
                  float* out1) {
  using PB = typename K::PB;
  const PB* b0 = (const PB*)blocks0;
  const PB* b1 = (const PB*)blocks1;
  const block_q8_K* a = (const block_q8_K*)act;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  PairStream near(nb * sizeof(PB), PREFETCH_AHEAD_Z), far(nb * sizeof(PB), PREFETCH_FAR_Z);
  for (int64_t i = 0; i < nb; i++, near.advance(sizeof(PB)), far.advance(sizeof(PB))) {
    __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
    const PairPrefetch pf{{near.at(b0, 0), near.at(b0, 1)}, {far.at(b0, 0), far.at(b0, 1)}};
    pair_block<K>(b0[i], b1[i], a[i], pf, t0, t1, std::make_index_sequence<8>{});
    acc0 = K::finish(b0[i], a[i], t0, acc0);
    acc1 = K::finish(b1[i], a[i], t1, acc1);
  }
  _mm256_storeu_ps(out0, acc0);
  _mm256_storeu_ps(out1, acc1);
}
#endif

// Columns per pass: the weight vectors and 2 · NC accumulators stay in registers (32 with AVX-512 VL).
constexpr int MAX_COLS = PS_AVX512BW ? 8 : 4;

using GroupFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, float*, size_t);
using Table = std::array<GroupFn, MAX_COLS>;

template <template <int> class K, size_t... I>
constexpr Table table(std::index_sequence<I...>) { return Table{K<(int)I + 1>::run...}; }
template <template <int> class K>
constexpr Table table() { return table<K>(std::make_index_sequence<MAX_COLS>{}); }

template <int NC> struct KQ8_0 { static constexpr GroupFn run = &group_legacy<pblock_q8_0, dec_q8_0, PS_VNNI ? 128 : 0, !PS_VNNI, NC>; };
template <int NC> struct KQ5_0 { static constexpr GroupFn run = &group_legacy<pblock_q5_0, dec_q5_0, 16, false, NC>; };
template <int NC> struct KQ4_0 { static constexpr GroupFn run = &group_legacy<pblock_q4_0, dec_q4_0, 8, false, NC>; };
template <int NC> struct KQ4_K { static constexpr GroupFn run = &group_kmin<pblock_q4_K, NC>; };
template <int NC> struct KQ5_K { static constexpr GroupFn run = &group_kmin<pblock_q5_K, NC>; };
template <int NC> struct KQ6_K { static constexpr GroupFn run = &group_q6_K<NC>; };

constexpr Table kQ8_0 = table<KQ8_0>(), kQ5_0 = table<KQ5_0>(), kQ4_0 = table<KQ4_0>();
constexpr Table kQ4_K = table<KQ4_K>(), kQ5_K = table<KQ5_K>(), kQ6_K = table<KQ6_K>();

using PairFn = void (*)(const uint8_t*, const uint8_t*, int64_t, const uint8_t*, float*, float*);

// The one-column kernel of two groups at once, where the type has one (else null).
PairFn pair_fn(GGMLType t) {
  switch (t) {
#if PS_VNNI == 1 && PS_AVX512BW
    case GGMLType::Q8_0: return &q8_0_pair_z;
    case GGMLType::Q4_K: return &group_pair_z<Q4KZ>;
    case GGMLType::Q6_K: return &group_pair_z<Q6KZ>;
#else
    case GGMLType::Q4_K: return &group_pair<pblock_q4_K, block_q8_K, kmin_block<pblock_q4_K>>;
    case GGMLType::Q6_K: return &group_pair<pblock_q6_K, block_q8_K, q6_K_block>;
#endif
    case GGMLType::Q5_K: return &group_pair<pblock_q5_K, block_q8_K, kmin_block<pblock_q5_K>>;
    default: return nullptr;
  }
}

const GroupFn* group_fns(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return kQ8_0.data();
    case GGMLType::Q5_0: return kQ5_0.data();
    case GGMLType::Q4_0: return kQ4_0.data();
    case GGMLType::Q4_K: return kQ4_K.data();
    case GGMLType::Q5_K: return kQ5_K.data();
    default: return kQ6_K.data();
  }
}
#endif  // PS_AVX2

}  // namespace

bool packable(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: case GGMLType::Q5_0: case GGMLType::Q4_0:
    case GGMLType::Q4_K: case GGMLType::Q5_K: case GGMLType::Q6_K:
      return PS_AVX2;
    default:
      return false;
  }
}

std::string packed_layout() {
  // Bump the number with any change to a packed block (packed_blocks.h) or to how pack_k / pack_legacy fill
  // one: files of the old layout (packed_file.h) are then packed again.
  return "packed/2 vnni=" + std::to_string(PS_VNNI != 0) + " avx2=" + std::to_string(PS_AVX2);
}

PackedWeight packed_shape(GGMLType t, int64_t n_rows, int64_t n_in) {
  if (!packable(t)) throw std::invalid_argument(std::string("cannot pack weights of type ") + type_traits((uint32_t)t)->name);
  const int bs = type_traits((uint32_t)t)->block_size;
  if (n_in <= 0 || n_in % bs) throw std::invalid_argument("cannot pack rows of " + std::to_string(n_in) + " elements");
  PackedWeight p;
  p.type = t;
  p.n_in = n_in;
  p.n_groups = n_rows / PACK_ROWS;
  p.group_bytes = (size_t)(n_in / bs) * pblock_size(t);
  return p;
}

std::unique_ptr<PackedWeight> pack_weight(GGMLType t, const uint8_t* rows, size_t row_bytes, int64_t n_rows,
                                          int64_t n_in) {
  auto p = std::make_unique<PackedWeight>(packed_shape(t, n_rows, n_in));
  const int64_t nb = n_in / type_traits((uint32_t)t)->block_size;
  const size_t src_block = type_traits((uint32_t)t)->type_size, dst_block = pblock_size(t);
  // Large matrices on 2 MiB boundaries so that transparent huge pages can back them (madvise needs an
  // aligned range): streaming 178 MB per token through 4 KiB pages costs a TLB miss every 4 KiB.
  const size_t bytes = p->n_groups * p->group_bytes, align = bytes >= PACK_HUGE_FROM ? (2u << 20) : 64;
  const size_t total = std::max(align, (bytes + align - 1) / align * align);
  p->data = {(uint8_t*)std::aligned_alloc(align, total), std::free};
  if (!p->data) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align > 64) madvise(p->data.get(), total, MADV_HUGEPAGE);  // best effort: an error leaves 4 KiB pages
#endif
  const uint8_t* src[8];
  for (int64_t g = 0; g < p->n_groups; g++)
    for (int64_t i = 0; i < nb; i++) {
      for (int r = 0; r < 8; r++) src[r] = rows + (g * 8 + r) * row_bytes + i * src_block;
      uint8_t* out = p->data.get() + g * p->group_bytes + i * dst_block;
      if (is_k(t)) pack_k(t, src, out);
      else pack_legacy(t, src, out);
    }
  return p;
}

namespace {
// Groups [g0, g1) × columns [c0, c1) through the AVX kernels; out as packed_tile's for groups from `base`.
void avx_tile(const PackedWeight& p, int64_t base, int64_t g0, int64_t g1, const uint8_t* act, size_t act_stride,
              int c0, int c1, float* out, size_t out_stride) {
#if PS_AVX2
  const GroupFn* fns = group_fns(p.type);
  const int64_t nb = p.n_in / type_traits((uint32_t)p.type)->block_size;
  const PairFn pair = c1 - c0 == 1 ? pair_fn(p.type) : nullptr;
  for (; pair && g0 + 1 < g1; g0 += 2)  // decode: groups two at a time
    pair(p.group(g0), p.group(g0 + 1), nb, act + c0 * act_stride, out + c0 * out_stride + (g0 - base) * PACK_ROWS,
         out + c0 * out_stride + (g0 + 1 - base) * PACK_ROWS);
  for (int64_t g = g0; g < g1; g++)
    for (int c = c0; c < c1; c += MAX_COLS) {
      const int nc = std::min(MAX_COLS, c1 - c);
      fns[nc - 1](p.group(g), nb, act + c * act_stride, act_stride, out + c * out_stride + (g - base) * PACK_ROWS,
                  out_stride);
    }
#else
  throw std::logic_error("packed_tile: no packed kernels in this build");
#endif
}
}  // namespace

// Whole 16 × 16 tiles on AMX where it runs; the columns and the odd group left over on the AVX kernels.
void packed_tile(const PackedWeight& p, int64_t g0, int64_t g1, const uint8_t* act, size_t act_stride, int ncols,
                 float* out, size_t out_stride) {
  const int64_t pairs_end = g0 + (g1 - g0) / 2 * 2;
  const int amx_cols = ncols / AMX_COLS * AMX_COLS;
  if (amx_cols == 0 || pairs_end == g0 || !amx_packs(p.type))
    return avx_tile(p, g0, g0, g1, act, act_stride, 0, ncols, out, out_stride);
  amx_tile(p, g0, pairs_end, act, act_stride, amx_cols, out, out_stride);
  if (amx_cols < ncols) avx_tile(p, g0, g0, pairs_end, act, act_stride, amx_cols, ncols, out, out_stride);
  if (pairs_end < g1) avx_tile(p, g0, pairs_end, g1, act, act_stride, 0, ncols, out, out_stride);
}

}  // namespace pyserve
