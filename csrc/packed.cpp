// packed: see packed.h for the layout and the arithmetic contract.
#include "packed.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "simd.h"

namespace pyserve {
namespace {

// One 32-element block of a group. q byte 32k + 4r + j: element 4k + j of row r (Q8_0: the signed value;
// Q4_0 / Q5_0: the unsigned code in the low nibble for k < 4 and, in the high nibble, element 4(k+4) + j).
struct pblock_q8_0 { uint16_t d[8]; int8_t q[256]; };                   // 272 B = 8 × block_q8_0
struct pblock_q4_0 { uint16_t d[8]; uint8_t q[128]; };                  // 144 B = 8 × block_q4_0
struct pblock_q5_0 { uint16_t d[8]; uint32_t qh[8]; uint8_t q[128]; };  // 176 B = 8 × block_q5_0;
                                                                       // qh[k] bit 4r + j: bit 4 of element 4k + j of row r
static_assert(sizeof(pblock_q8_0) == 272 && sizeof(pblock_q4_0) == 144 && sizeof(pblock_q5_0) == 176, "layout");

// ---- packing (scalar, once at load)

// The 32 codes of one original block: Q8_0 signed values, Q4_0 / Q5_0 unsigned codes (value + 8 / + 16).
void block_codes(GGMLType t, const uint8_t* b, uint8_t c[32], uint16_t* d) {
  std::memcpy(d, b, 2);
  if (t == GGMLType::Q8_0) {
    std::memcpy(c, b + 2, 32);
    return;
  }
  const uint8_t* qs = b + (t == GGMLType::Q5_0 ? 6 : 2);
  uint32_t qh = 0;
  if (t == GGMLType::Q5_0) std::memcpy(&qh, b + 2, 4);
  for (int j = 0; j < 16; j++) {
    c[j] = (uint8_t)((qs[j] & 0x0F) | ((qh >> j) & 1) << 4);
    c[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}

// codes[r][e] of the 8 rows → one packed block.
void put_block(GGMLType t, const uint8_t codes[8][32], const uint16_t d[8], uint8_t* out) {
  std::memcpy(out, d, 16);
  if (t == GGMLType::Q8_0) {
    for (int k = 0; k < 8; k++)
      for (int r = 0; r < 8; r++) std::memcpy(out + 16 + 32 * k + 4 * r, codes[r] + 4 * k, 4);
    return;
  }
  uint8_t* q = out + (t == GGMLType::Q5_0 ? 48 : 16);
  uint32_t qh[8] = {};
  for (int k = 0; k < 4; k++)
    for (int r = 0; r < 8; r++)
      for (int j = 0; j < 4; j++) {
        const uint8_t lo = codes[r][4 * k + j], hi = codes[r][4 * (k + 4) + j];
        q[32 * k + 4 * r + j] = (uint8_t)((lo & 0x0F) | (hi & 0x0F) << 4);
        qh[k] |= (uint32_t)(lo >> 4) << (4 * r + j);
        qh[k + 4] |= (uint32_t)(hi >> 4) << (4 * r + j);
      }
  if (t == GGMLType::Q5_0) std::memcpy(out + 16, qh, 32);
}

size_t pblock_size(GGMLType t) {
  return t == GGMLType::Q8_0 ? sizeof(pblock_q8_0) : t == GGMLType::Q5_0 ? sizeof(pblock_q5_0) : sizeof(pblock_q4_0);
}

// ---- kernels

#if PS_AVX2
inline int32_t load_i32(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return v; }

// acc + Σ of 4 consecutive u8·s8 products per int32 lane, exact. Without VNNI, maddubs's int16 pairs
// cannot saturate because every u operand here is ≤ 128.
inline __m256i dp4(__m256i acc, __m256i u, __m256i s) {
#if PS_VNNI == 1
  return _mm256_dpbusd_epi32(acc, u, s);
#elif PS_VNNI == 2
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }

// Decoders: the 8 u8 operand vectors of a block (vector k holds elements 4k..4k+3 of every row).
// Q8_0 with VNNI: value + 128 (offset 128). Without VNNI the signed values are returned and the kernel
// moves the sign onto the activation instead (offset 0).
inline void dec_q8_0(const pblock_q8_0& b, __m256i* w) {
  for (int k = 0; k < 8; k++) w[k] = PS_VNNI ? _mm256_xor_si256(load256(b.q + 32 * k), _mm256_set1_epi8((char)0x80))
                                             : load256(b.q + 32 * k);
}

inline void split_nibbles(const uint8_t* q, __m256i* w) {
  const __m256i m = _mm256_set1_epi8(0x0F);
  for (int k = 0; k < 4; k++) {
    const __m256i v = load256(q + 32 * k);
    w[k] = _mm256_and_si256(v, m);
    w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
  }
}

inline void dec_q4_0(const pblock_q4_0& b, __m256i* w) { split_nibbles(b.q, w); }

inline void dec_q5_0(const pblock_q5_0& b, __m256i* w) {
  split_nibbles(b.q, w);
  const __m256i h = _mm256_set1_epi8(0x10);
  for (int k = 0; k < 8; k++)
#if PS_AVX512BW
    w[k] = _mm256_mask_add_epi8(w[k], (__mmask32)b.qh[k], w[k], h);
#else
    w[k] = _mm256_or_si256(w[k], _mm256_and_si256(bits_to_bytes(b.qh[k]), h));
#endif
}

// One group × NC columns over all nb blocks. OFF: the code offset; SIGNED: w holds signed values (Q8_0
// without VNNI), multiplied as |w| · sign(a, w).
template <class PB, void (*Dec)(const PB&, __m256i*), int OFF, bool SIGNED, int NC>
void group_cols(const uint8_t* blocks, int64_t nb, const uint8_t* act, size_t stride, float* out, size_t os) {
  const PB* b = (const PB*)blocks;
  __m256 acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; i++) {
    // The next group's block i, one group ahead: the hardware prefetcher alone falls behind a stream
    // this compute-dense (measured: 74 vs 115 GMAC/s from DRAM vs from cache at 8 columns).
    if (NC >= 4)
      for (size_t l = 0; l < sizeof(PB); l += 64) _mm_prefetch((const char*)(b + nb + i) + l, _MM_HINT_T0);
    __m256i w[8];
    Dec(b[i], w);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)b[i].d));
    for (int c = 0; c < NC; c++) {
      const block_q8_32& a = ((const block_q8_32*)(act + c * stride))[i];
      // Two dependency chains of 4 (integer sums: the split changes no result).
      __m256i s[2] = {_mm256_set1_epi32(-OFF * a.sum), _mm256_setzero_si256()};
      for (int k = 0; k < 8; k++) {
        const __m256i x = _mm256_set1_epi32(load_i32(a.qs + 4 * k));
        s[k & 1] = SIGNED ? dp4(s[k & 1], _mm256_abs_epi8(w[k]), _mm256_sign_epi8(x, w[k])) : dp4(s[k & 1], w[k], x);
      }
      acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a.d)), _mm256_cvtepi32_ps(_mm256_add_epi32(s[0], s[1])), acc[c]);
    }
  }
  for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * os, acc[c]);
}

// Columns per pass: the 8 weight vectors and NC accumulators stay in registers (32 with AVX-512 VL).
constexpr int MAX_COLS = PS_AVX512BW ? 8 : 4;

using GroupFn = void (*)(const uint8_t*, int64_t, const uint8_t*, size_t, float*, size_t);

template <class PB, void (*Dec)(const PB&, __m256i*), int OFF, bool SIGNED, size_t... I>
constexpr auto make_table(std::index_sequence<I...>) {
  return std::array<GroupFn, sizeof...(I)>{&group_cols<PB, Dec, OFF, SIGNED, (int)I + 1>...};
}
constexpr auto kQ8_0 = make_table<pblock_q8_0, dec_q8_0, PS_VNNI ? 128 : 0, !PS_VNNI>(std::make_index_sequence<MAX_COLS>{});
constexpr auto kQ5_0 = make_table<pblock_q5_0, dec_q5_0, 16, false>(std::make_index_sequence<MAX_COLS>{});
constexpr auto kQ4_0 = make_table<pblock_q4_0, dec_q4_0, 8, false>(std::make_index_sequence<MAX_COLS>{});

const GroupFn* group_fns(GGMLType t) {
  return t == GGMLType::Q8_0 ? kQ8_0.data() : t == GGMLType::Q5_0 ? kQ5_0.data() : kQ4_0.data();
}
#endif  // PS_AVX2

}  // namespace

bool packable(GGMLType t) {
  return PS_AVX2 && (t == GGMLType::Q8_0 || t == GGMLType::Q5_0 || t == GGMLType::Q4_0);
}

std::unique_ptr<PackedWeight> pack_weight(GGMLType t, const uint8_t* rows, size_t row_bytes, int64_t n_rows,
                                          int64_t n_in) {
  if (!packable(t)) throw std::invalid_argument(std::string("cannot pack weights of type ") + type_traits((uint32_t)t)->name);
  if (n_in <= 0 || n_in % QK) throw std::invalid_argument("cannot pack rows of " + std::to_string(n_in) + " elements");
  auto p = std::make_unique<PackedWeight>();
  p->type = t;
  p->n_in = n_in;
  p->n_groups = n_rows / PACK_ROWS;
  const int64_t nb = n_in / QK;
  const size_t src_block = type_traits((uint32_t)t)->type_size, dst_block = pblock_size(t);
  p->group_bytes = (size_t)nb * dst_block;
  const size_t total = std::max<size_t>(64, (p->n_groups * p->group_bytes + 63) / 64 * 64);
  p->data = {(uint8_t*)std::aligned_alloc(64, total), std::free};
  if (!p->data) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p->data.get(), total, MADV_HUGEPAGE);  // fewer TLB misses while streaming large matrices
#endif
  uint8_t codes[8][32];
  uint16_t d[8];
  for (int64_t g = 0; g < p->n_groups; g++)
    for (int64_t i = 0; i < nb; i++) {
      for (int r = 0; r < 8; r++)
        block_codes(t, rows + (g * 8 + r) * row_bytes + i * src_block, codes[r], d + r);
      put_block(t, codes, d, p->data.get() + g * p->group_bytes + i * dst_block);
    }
  return p;
}

void packed_tile(const PackedWeight& p, int64_t g0, int64_t g1, const uint8_t* act, size_t act_stride, int ncols,
                 float* out, size_t out_stride) {
#if PS_AVX2
  const GroupFn* fns = group_fns(p.type);
  const int64_t nb = p.n_in / QK;
  for (int64_t g = g0; g < g1; g++)
    for (int c0 = 0; c0 < ncols; c0 += MAX_COLS) {
      const int nc = std::min(MAX_COLS, ncols - c0);
      fns[nc - 1](p.group(g), nb, act + c0 * act_stride, act_stride, out + c0 * out_stride + (g - g0) * PACK_ROWS,
                  out_stride);
    }
#else
  throw std::logic_error("packed_tile: no packed kernels in this build");
#endif
}

}  // namespace pyserve
