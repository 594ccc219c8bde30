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
// with AVX-512 VNNI the same lanes come from vpdpbusd, so the results are identical to AVX2. Signed codebook
// values (IQ4_NL / IQ4_XS up to 127, MXFP4, IQ3_S) enter maddubs as |w| against a with w's sign: a pair is
// at most 2 · 127 · 127 < 2^15. Sub-block scales multiply the int16 pair sums in vpmaddwd (|scale| ≤ 32), so
// a super-block's integer sum stays exact in int32.
#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "base/simd.h"

namespace pyserve {

static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22, "layout");
static_assert(sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34, "layout");
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210, "layout");
static_assert(sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_iq4_nl) == 18, "layout");
static_assert(sizeof(block_iq4_xs) == 136 && sizeof(block_iq3_s) == 110 && sizeof(block_mxfp4) == 17, "layout");
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

// ================================================================ float dequantization

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

// MXFP4's E8M0 scale halved (its codes are the e2m1 values doubled): 2^(e − 128), subnormal for e < 2.
static inline float e8m0_half(uint8_t e) { return bits_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23); }

// ================================================================ codebooks

// IQ4_NL / IQ4_XS: the 16 non-linear levels of a nibble.
alignas(16) static constexpr int8_t kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};
// MXFP4: e2m1 (bit 3 the sign, then 2 exponent bits and 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6) doubled.
alignas(16) static constexpr int8_t kMXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// IQ3_S: 512 grid points of 4 odd magnitudes 1..15, byte k = element k (written out from gguf-py's
// IQ3_S.grid, the format's codebook).
static constexpr uint32_t kIQ3S_grid[512] = {
    0x01010101, 0x01010103, 0x01010105, 0x0101010b, 0x0101010f, 0x01010301, 0x01010303, 0x01010305,
    0x01010309, 0x0101030d, 0x01010501, 0x01010503, 0x0101050b, 0x01010707, 0x01010901, 0x01010905,
    0x0101090b, 0x0101090f, 0x01010b03, 0x01010b07, 0x01010d01, 0x01010d05, 0x01010f03, 0x01010f09,
    0x01010f0f, 0x01030101, 0x01030103, 0x01030105, 0x01030109, 0x01030301, 0x01030303, 0x0103030b,
    0x01030501, 0x01030507, 0x0103050f, 0x01030703, 0x0103070b, 0x01030909, 0x01030d03, 0x01030d0b,
    0x01030f05, 0x01050101, 0x01050103, 0x0105010b, 0x0105010f, 0x01050301, 0x01050307, 0x0105030d,
    0x01050503, 0x0105050b, 0x01050701, 0x01050709, 0x01050905, 0x0105090b, 0x0105090f, 0x01050b03,
    0x01050b07, 0x01050f01, 0x01050f07, 0x01070107, 0x01070303, 0x0107030b, 0x01070501, 0x01070505,
    0x01070703, 0x01070707, 0x0107070d, 0x01070909, 0x01070b01, 0x01070b05, 0x01070d0f, 0x01070f03,
    0x01070f0b, 0x01090101, 0x01090307, 0x0109030f, 0x01090503, 0x01090509, 0x01090705, 0x01090901,
    0x01090907, 0x01090b03, 0x01090f01, 0x010b0105, 0x010b0109, 0x010b0501, 0x010b0505, 0x010b050d,
    0x010b0707, 0x010b0903, 0x010b090b, 0x010b090f, 0x010b0d0d, 0x010b0f07, 0x010d010d, 0x010d0303,
    0x010d0307, 0x010d0703, 0x010d0b05, 0x010d0f03, 0x010f0101, 0x010f0105, 0x010f0109, 0x010f0501,
    0x010f0505, 0x010f050d, 0x010f0707, 0x010f0b01, 0x010f0b09, 0x03010101, 0x03010103, 0x03010105,
    0x03010109, 0x03010301, 0x03010303, 0x03010307, 0x0301030b, 0x0301030f, 0x03010501, 0x03010505,
    0x03010703, 0x03010709, 0x0301070d, 0x03010b09, 0x03010b0d, 0x03010d03, 0x03010f05, 0x03030101,
    0x03030103, 0x03030107, 0x0303010d, 0x03030301, 0x03030309, 0x03030503, 0x03030701, 0x03030707,
    0x03030903, 0x03030b01, 0x03030b05, 0x03030f01, 0x03030f0d, 0x03050101, 0x03050305, 0x0305030b,
    0x0305030f, 0x03050501, 0x03050509, 0x03050705, 0x03050901, 0x03050907, 0x03050b0b, 0x03050d01,
    0x03050f05, 0x03070103, 0x03070109, 0x0307010f, 0x03070301, 0x03070307, 0x03070503, 0x0307050f,
    0x03070701, 0x03070709, 0x03070903, 0x03070d05, 0x03070f01, 0x03090107, 0x0309010b, 0x03090305,
    0x03090309, 0x03090703, 0x03090707, 0x03090905, 0x0309090d, 0x03090b01, 0x03090b09, 0x030b0103,
    0x030b0301, 0x030b0307, 0x030b0503, 0x030b0701, 0x030b0705, 0x030b0b03, 0x030d0501, 0x030d0509,
    0x030d050f, 0x030d0909, 0x030d090d, 0x030f0103, 0x030f0107, 0x030f0301, 0x030f0305, 0x030f0503,
    0x030f070b, 0x030f0903, 0x030f0d05, 0x030f0f01, 0x05010101, 0x05010103, 0x05010107, 0x0501010b,
    0x0501010f, 0x05010301, 0x05010305, 0x05010309, 0x0501030d, 0x05010503, 0x05010507, 0x0501050f,
    0x05010701, 0x05010705, 0x05010903, 0x05010907, 0x0501090b, 0x05010b01, 0x05010b05, 0x05010d0f,
    0x05010f01, 0x05010f07, 0x05010f0b, 0x05030101, 0x05030105, 0x05030301, 0x05030307, 0x0503030f,
    0x05030505, 0x0503050b, 0x05030703, 0x05030709, 0x05030905, 0x05030b03, 0x05050103, 0x05050109,
    0x0505010f, 0x05050503, 0x05050507, 0x05050701, 0x0505070f, 0x05050903, 0x05050b07, 0x05050b0f,
    0x05050f03, 0x05050f09, 0x05070101, 0x05070105, 0x0507010b, 0x05070303, 0x05070505, 0x05070509,
    0x05070703, 0x05070707, 0x05070905, 0x05070b01, 0x05070d0d, 0x05090103, 0x0509010f, 0x05090501,
    0x05090507, 0x05090705, 0x0509070b, 0x05090903, 0x05090f05, 0x05090f0b, 0x050b0109, 0x050b0303,
    0x050b0505, 0x050b070f, 0x050b0901, 0x050b0b07, 0x050b0f01, 0x050d0101, 0x050d0105, 0x050d010f,
    0x050d0503, 0x050d0b0b, 0x050d0d03, 0x050f010b, 0x050f0303, 0x050f050d, 0x050f0701, 0x050f0907,
    0x050f0b01, 0x07010105, 0x07010303, 0x07010307, 0x0701030b, 0x0701030f, 0x07010505, 0x07010703,
    0x07010707, 0x0701070b, 0x07010905, 0x07010909, 0x0701090f, 0x07010b03, 0x07010d07, 0x07010f03,
    0x07030103, 0x07030107, 0x0703010b, 0x07030309, 0x07030503, 0x07030507, 0x07030901, 0x07030d01,
    0x07030f05, 0x07030f0d, 0x07050101, 0x07050305, 0x07050501, 0x07050705, 0x07050709, 0x07050b01,
    0x07070103, 0x07070301, 0x07070309, 0x07070503, 0x07070507, 0x0707050f, 0x07070701, 0x07070903,
    0x07070907, 0x0707090f, 0x07070b0b, 0x07070f07, 0x07090107, 0x07090303, 0x0709030d, 0x07090505,
    0x07090703, 0x07090b05, 0x07090d01, 0x07090d09, 0x070b0103, 0x070b0301, 0x070b0305, 0x070b050b,
    0x070b0705, 0x070b0909, 0x070b0b0d, 0x070b0f07, 0x070d030d, 0x070d0903, 0x070f0103, 0x070f0107,
    0x070f0501, 0x070f0505, 0x070f070b, 0x09010101, 0x09010109, 0x09010305, 0x09010501, 0x09010509,
    0x0901050f, 0x09010705, 0x09010903, 0x09010b01, 0x09010f01, 0x09030105, 0x0903010f, 0x09030303,
    0x09030307, 0x09030505, 0x09030701, 0x0903070b, 0x09030907, 0x09030b03, 0x09030b0b, 0x09050103,
    0x09050107, 0x09050301, 0x0905030b, 0x09050503, 0x09050707, 0x09050901, 0x09050b0f, 0x09050d05,
    0x09050f01, 0x09070109, 0x09070303, 0x09070307, 0x09070501, 0x09070505, 0x09070703, 0x0907070b,
    0x09090101, 0x09090105, 0x09090509, 0x0909070f, 0x09090901, 0x09090f03, 0x090b010b, 0x090b010f,
    0x090b0503, 0x090b0d05, 0x090d0307, 0x090d0709, 0x090d0d01, 0x090f0301, 0x090f030b, 0x090f0701,
    0x090f0907, 0x090f0b03, 0x0b010105, 0x0b010301, 0x0b010309, 0x0b010505, 0x0b010901, 0x0b010909,
    0x0b01090f, 0x0b010b05, 0x0b010d0d, 0x0b010f09, 0x0b030103, 0x0b030107, 0x0b03010b, 0x0b030305,
    0x0b030503, 0x0b030705, 0x0b030f05, 0x0b050101, 0x0b050303, 0x0b050507, 0x0b050701, 0x0b05070d,
    0x0b050b07, 0x0b070105, 0x0b07010f, 0x0b070301, 0x0b07050f, 0x0b070909, 0x0b070b03, 0x0b070d0b,
    0x0b070f07, 0x0b090103, 0x0b090109, 0x0b090501, 0x0b090705, 0x0b09090d, 0x0b0b0305, 0x0b0b050d,
    0x0b0b0b03, 0x0b0b0b07, 0x0b0d0905, 0x0b0f0105, 0x0b0f0109, 0x0b0f0505, 0x0d010303, 0x0d010307,
    0x0d01030b, 0x0d010703, 0x0d010707, 0x0d010d01, 0x0d030101, 0x0d030501, 0x0d03050f, 0x0d030d09,
    0x0d050305, 0x0d050709, 0x0d050905, 0x0d050b0b, 0x0d050d05, 0x0d050f01, 0x0d070101, 0x0d070309,
    0x0d070503, 0x0d070901, 0x0d09050b, 0x0d090907, 0x0d090d05, 0x0d0b0101, 0x0d0b0107, 0x0d0b0709,
    0x0d0b0d01, 0x0d0d010b, 0x0d0d0901, 0x0d0f0303, 0x0d0f0307, 0x0f010101, 0x0f010109, 0x0f01010f,
    0x0f010501, 0x0f010505, 0x0f01070d, 0x0f010901, 0x0f010b09, 0x0f010d05, 0x0f030105, 0x0f030303,
    0x0f030509, 0x0f030907, 0x0f03090b, 0x0f050103, 0x0f050109, 0x0f050301, 0x0f05030d, 0x0f050503,
    0x0f050701, 0x0f050b03, 0x0f070105, 0x0f070705, 0x0f07070b, 0x0f070b07, 0x0f090103, 0x0f09010b,
    0x0f090307, 0x0f090501, 0x0f090b01, 0x0f0b0505, 0x0f0b0905, 0x0f0d0105, 0x0f0d0703, 0x0f0f0101,
};

// ================================================================ 32-element blocks: codes and dequantization
// (exact: every product of a scale with the small integer codes fits a float mantissa, so only the final
// add / sub of a min rounds, as in gguf; the same holds for the super-blocks below)

// 5-bit code of element j of a Q5 block: nibble from qs, bit 4 from qh.
static inline int q5_code(const uint8_t* qs, uint32_t qh, int j) {
  const int nib = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
  return nib | (int)(((qh >> j) & 1) << 4);
}

// Codes of a block (the offset removed for the symmetric types): value = scale · code (+ m).
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
// IQ4_NL, MXFP4: nibbles (elements 0..15 low, 16..31 high) through a codebook.
template <class B, const int8_t* Book> static void codes_book(const B& b, int* q) {
  for (int j = 0; j < 16; j++) { q[j] = Book[b.qs[j] & 0xF]; q[j + 16] = Book[b.qs[j] >> 4]; }
}

template <class B> static inline float scale_d(const B& b) { return h2f(b.d); }
static inline float scale_mxfp4(const block_mxfp4& b) { return e8m0_half(b.e); }

template <class B, void (*Codes)(const B&, int*), bool HasMin, float (*Scale)(const B&) = scale_d<B>>
static void deq32(const void* s, float* y, int64_t n) {
  const B* b = (const B*)s;
  int q[QK];
  for (int64_t i = 0; i < n / QK; i++, y += QK) {
    const float d = Scale(b[i]);
    Codes(b[i], q);
    if constexpr (HasMin) {
      const float m = h2f(b[i].m);
      for (int j = 0; j < QK; j++) y[j] = d * (float)q[j] + m;
    } else {
      for (int j = 0; j < QK; j++) y[j] = d * (float)q[j];
    }
  }
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

// ================================================================ super-blocks of 256: codes and dequantization

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

// The 16 six-bit Q3_K scales − 32: bits 0-3 of sub-block j in byte j (j < 8) or the high nibble of byte j − 8,
// bits 4-5 at bits 2 (j / 4) of byte 8 + j % 4.
static inline void q3_scales(const uint8_t* p, int8_t sc[16]) {
  uint64_t lo;
  std::memcpy(&lo, p, 8);
  const uint32_t h = load_u32(p + 8);
  const uint64_t nib[2] = {lo & 0x0f0f0f0f0f0f0f0fULL, (lo >> 4) & 0x0f0f0f0f0f0f0f0fULL};
  const uint32_t hi[4] = {h & 0x03030303, (h >> 2) & 0x03030303, (h >> 4) & 0x03030303, (h >> 6) & 0x03030303};
  uint8_t l4[16], h2[16];
  std::memcpy(l4, nib, 16);
  std::memcpy(h2, hi, 16);
  for (int j = 0; j < 16; j++) sc[j] = (int8_t)((l4[j] | h2[j] << 4) - 32);
}

// The 6-bit scale − 32 of IQ4_XS sub-block j: nibble j of scales_l, 2 bits at 2j of scales_h.
static inline int iq4xs_scale(const block_iq4_xs& b, int j) {
  return (int)(((load_u32(b.scales_l) >> (4 * j)) & 0xF) | (((uint32_t)b.scales_h >> (2 * j)) & 3) << 4) - 32;
}

// The 4 magnitudes of IQ3_S values 4i..4i+3 (grid index: qs[i], bit 8 from bit i % 8 of qh[i / 8]).
static inline uint32_t iq3s_grid(const block_iq3_s& b, int i) {
  return kIQ3S_grid[b.qs[i] | (((b.qh[i / 8] >> (i % 8)) & 1) << 8)];
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

// 2-bit codes of 128 elements from 32 bytes (Q2_K, Q3_K): element 32s + l at bits 2s of byte l.
static void crumbs128(const uint8_t* qs, int8_t* q) {
  for (int s = 0; s < 4; s++)
    for (int l = 0; l < 32; l++) q[32 * s + l] = (int8_t)((qs[l] >> (2 * s)) & 3);
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

// One super-block as integers: element l of sub-block j (S = 16 or 32 elements) is d · sc[j] · q[l], minus
// dmin · m[j] for the types with a min (Q2_K, Q4_K, Q5_K).
struct KInts {
  int8_t q[QK_K];
  int8_t sc[16];
  uint8_t m[16];
};

template <class B, void (*Codes)(const B&, int8_t*)>
static void ints_k4(const B& b, KInts& k) {  // Q4_K, Q5_K
  Codes(b, k.q);
  uint8_t sc[8];
  k4_scales(b.scales, sc, k.m);
  for (int j = 0; j < 8; j++) k.sc[j] = (int8_t)sc[j];
}

static void ints_q6_K(const block_q6_K& b, KInts& k) {
  codes_q6_K(b, k.q);
  std::memcpy(k.sc, b.scales, 16);
}

static void ints_q2_K(const block_q2_K& b, KInts& k) {
  crumbs128(b.qs, k.q);
  crumbs128(b.qs + 32, k.q + 128);
  for (int j = 0; j < 16; j++) {
    k.sc[j] = (int8_t)(b.scales[j] & 0xF);
    k.m[j] = (uint8_t)(b.scales[j] >> 4);
  }
}

static void ints_q3_K(const block_q3_K& b, KInts& k) {
  crumbs128(b.qs, k.q);
  crumbs128(b.qs + 32, k.q + 128);
  for (int l = 0; l < QK_K; l++) k.q[l] = (int8_t)(k.q[l] - (((b.hmask[l % 32] >> (l / 32)) & 1) ? 0 : 4));
  q3_scales(b.scales, k.sc);
}

static void ints_iq4_xs(const block_iq4_xs& b, KInts& k) {
  for (int j = 0; j < 8; j++) {
    k.sc[j] = (int8_t)iq4xs_scale(b, j);
    for (int l = 0; l < 16; l++) {
      k.q[32 * j + l] = kIQ4[b.qs[16 * j + l] & 0xF];
      k.q[32 * j + 16 + l] = kIQ4[b.qs[16 * j + l] >> 4];
    }
  }
}

static void ints_iq3_s(const block_iq3_s& b, KInts& k) {
  for (int i = 0; i < QK_K / 4; i++) {
    const uint32_t g = iq3s_grid(b, i);
    for (int c = 0; c < 4; c++) {
      const int l = 4 * i + c, mag = (int)((g >> (8 * c)) & 0xFF);
      k.q[l] = (int8_t)((b.signs[l / 8] >> (l % 8)) & 1 ? -mag : mag);
    }
  }
  for (int j = 0; j < 8; j++) k.sc[j] = (int8_t)(1 + 2 * ((b.scales[j / 2] >> (4 * (j % 2))) & 0xF));
}

template <class B, void (*Ints)(const B&, KInts&), int S, bool HasMin>
static void deq_super(const void* s, float* y, int64_t n) {
  const B* b = (const B*)s;
  KInts k;
  for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
    Ints(b[i], k);
    const float d = h2f(b[i].d);
    for (int j = 0; j < QK_K / S; j++) {
      const float dl = d * (float)k.sc[j];
      const int8_t* q = k.q + S * j;
      if constexpr (HasMin) {
        const float ml = h2f(b[i].dmin) * (float)k.m[j];
        for (int l = 0; l < S; l++) y[S * j + l] = dl * (float)q[l] - ml;
      } else {
        for (int l = 0; l < S; l++) y[S * j + l] = dl * (float)q[l];
      }
    }
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
// 32-element blocks: Σ_blocks (d_w·d_a)·Σ(q_w·q_a) [+ m_w·s_a]; super-blocks:
// (d_w·d_a)·Σ_j sc_j·Σ(q·a) [− (dmin·d_a)·Σ_j m_j·bsum_j]. Float weights: double accumulation against the
// float activations.

template <class T, float (*Cvt)(T)>
static float ref_float(int64_t n, const void* vw, const void* va) {
  const T* w = (const T*)vw;
  const float* x = (const float*)va;
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)Cvt(w[i]) * (double)x[i];
  return (float)s;
}
static inline float cvt_f32(float f) { return f; }

template <class B> static inline float min_term(const B&, const block_q8_32&) { return 0.0f; }
template <> inline float min_term(const block_q4_1& b, const block_q8_32& a) { return h2f(b.m) * (a.d * (float)a.sum); }
template <> inline float min_term(const block_q5_1& b, const block_q8_32& a) { return h2f(b.m) * (a.d * (float)a.sum); }

template <class B, void (*Codes)(const B&, int*), bool HasMin, float (*Scale)(const B&) = scale_d<B>>
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
    sum = std::fma(Scale(w[i]) * a[i].d, (float)sumi, sum);
    if constexpr (HasMin) sum += min_term(w[i], a[i]);
  }
  return sum;
}

template <class B, void (*Ints)(const B&, KInts&), int S, bool HasMin>
static float ref_super(int64_t n, const void* vw, const void* va) {
  const B* w = (const B*)vw;
  const block_q8_K* a = (const block_q8_K*)va;
  float sum = 0.0f;
  KInts k;
  for (int64_t i = 0; i < n / QK_K; i++) {
    Ints(w[i], k);
    int sumi = 0, summ = 0;
    for (int j = 0; j < QK_K / S; j++) {
      int s = 0;
      for (int l = S * j; l < S * (j + 1); l++) s += k.q[l] * a[i].qs[l];
      sumi += k.sc[j] * s;
      if constexpr (HasMin)
        for (int g = j * S / 16; g < (j + 1) * S / 16; g++) summ += k.m[j] * a[i].bsums[g];
    }
    // One fma per super-block in this order (two with a min): the packed kernels (packed.h) compute exactly
    // this chain for Q4_K, Q5_K and Q6_K.
    sum = std::fma(h2f(w[i].d) * a[i].d, (float)sumi, sum);
    if constexpr (HasMin) sum = std::fma(-(h2f(w[i].dmin) * a[i].d), (float)summ, sum);
  }
  return sum;
}

// ================================================================ per-row SIMD kernels (AVX2, with AVX-512
// VNNI/BW shortcuts) of the types without a packed layout: Q4_1, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, IQ4_XS,
// IQ3_S and the float types. (Q4_0 … Q6_K run through packed.h in an AVX2 build and through the references
// above in a scalar one.)
// Signature: k<NC>(n, w_row, act, act_stride, out[NC]).
#if PS_AVX2

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


// ---- IQ4_NL / MXFP4: nibbles through a 16-entry codebook (vpshufb), signed × signed products taken as
// |w| · (a with w's sign) so that maddubs sees an unsigned operand (|w| ≤ 127: pair sums never saturate).
static inline __m256i book16(const int8_t* book) {
  return _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)book));
}

template <class B, const int8_t* Book, float (*Scale)(const B&), int NC>
static void k_book32(int64_t n, const void* vw, const uint8_t* act, size_t stride, float* out) {
  const B* w = (const B*)vw;
  const __m256i book = book16(Book);
  __m256 acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK; i++) {
    const __m256i q = _mm256_shuffle_epi8(book, nibbles32(w[i].qs)), u = _mm256_abs_epi8(q);
    const float dw = Scale(w[i]);
    for (int c = 0; c < NC; c++) {
      const block_q8_32& a = act32(act, stride, c)[i];
      const __m256i s = _mm256_sign_epi8(load256(a.qs), q);
      const __m256 p = _mm256_cvtepi32_ps(dp4(_mm256_setzero_si256(), u, s));
      acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p, acc[c]);
    }
  }
  for (int c = 0; c < NC; c++) out[c] = hsum8(acc[c]);
}

// ---- super-blocks of 256 against Q8_K (Q2_K, Q3_K, IQ4_XS, IQ3_S; the others are packed).
// A super-block decoded once for all columns: chunk k (elements 32k..32k+31) in q[k], as unsigned codes or
// (Signed) as signed values; int16 scales of the sub-blocks; for Q2_K / Q3_K an int16 factor per 16-element
// group, applied to the activation's bsums (Q3_K: the −4 of the codes is taken out of q that way, inside the
// integer sum; Q2_K: the mins, scaled by dbias = −dmin).
enum class Extra { None, Offset, Min };

struct SuperDec {
  __m256i q[8];
  __m256i bias;                // Extra::Offset / Min: 16 int16
  alignas(32) int16_t sc[16];  // 16 sub-blocks of 16 elements, or 8 of 32
  float d, dbias;
};

// The int16 scale of each pair sum of chunk k: with 16-element sub-blocks the chunk holds two, and maddubs
// leaves the pair sums of elements 0..15 in the low 128-bit lane.
template <int S> static inline __m256i chunk_scales(const int16_t* sc, int k) {
  if constexpr (S == 32) {
    return _mm256_set1_epi16(sc[k]);
  } else {
    int32_t two;
    std::memcpy(&two, sc + 2 * k, 4);
    const __m256i lo_hi = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                           2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(_mm256_set1_epi32(two), lo_hi);
  }
}

template <class B, void (*Dec)(const B&, SuperDec&), int S, bool Signed, Extra X, int NC>
static void k_super(int64_t n, const void* vw, const uint8_t* act, size_t stride, float* out) {
  const B* w = (const B*)vw;
  __m256 acc[NC];
  for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
  SuperDec k;
  __m256i u[8], sv[8];
  for (int64_t i = 0; i < n / QK_K; i++) {
    Dec(w[i], k);
    for (int j = 0; j < 8; j++) {
      u[j] = Signed ? _mm256_abs_epi8(k.q[j]) : k.q[j];
      sv[j] = chunk_scales<S>(k.sc, j);
    }
    for (int c = 0; c < NC; c++) {
      const block_q8_K& a = ((const block_q8_K*)(act + c * stride))[i];
      __m256i isum = _mm256_setzero_si256();
      for (int j = 0; j < 8; j++) {
        __m256i s = load256(a.qs + 32 * j);
        if constexpr (Signed) s = _mm256_sign_epi8(s, k.q[j]);
        isum = dp2(isum, _mm256_maddubs_epi16(u[j], s), sv[j]);
      }
      if constexpr (X == Extra::Offset) isum = dp2(isum, load256(a.bsums), k.bias);
      acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(k.d * a.d), _mm256_cvtepi32_ps(isum), acc[c]);
      if constexpr (X == Extra::Min) {
        const __m256 m = _mm256_cvtepi32_ps(dp2(_mm256_setzero_si256(), load256(a.bsums), k.bias));
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(k.dbias * a.d), m, acc[c]);
      }
    }
  }
  for (int c = 0; c < NC; c++) out[c] = hsum8(acc[c]);
}

// 2-bit codes of 128 elements (see crumbs128) into 4 chunks.
static inline void crumbs128_x4(const uint8_t* p, __m256i* q) {
  const __m256i v = load256(p);
  for (int s = 0; s < 4; s++)
    q[s] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * s)), _mm256_set1_epi8(3));
}

static inline void sdec_q2_K(const block_q2_K& b, SuperDec& k) {
  crumbs128_x4(b.qs, k.q);
  crumbs128_x4(b.qs + 32, k.q + 4);
  const __m128i s = _mm_loadu_si128((const __m128i*)b.scales), lo4 = _mm_set1_epi8(0x0F);
  _mm256_store_si256((__m256i*)k.sc, _mm256_cvtepu8_epi16(_mm_and_si128(s, lo4)));
  k.bias = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), lo4));
  k.d = h2f(b.d);
  k.dbias = -h2f(b.dmin);
}

static inline void sdec_q3_K(const block_q3_K& b, SuperDec& k) {
  crumbs128_x4(b.qs, k.q);
  crumbs128_x4(b.qs + 32, k.q + 4);
  const __m256i hm = load256(b.hmask), one = _mm256_set1_epi8(1);
  for (int j = 0; j < 8; j++) {  // code + 4 = low 2 bits + 4 · hmask bit (0..7)
    const __m256i h = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(j)), one);
    k.q[j] = _mm256_or_si256(k.q[j], _mm256_slli_epi16(h, 2));
  }
  // q3_scales: low nibbles of bytes 0-7, then their high nibbles; 2 bits from byte 8 + j % 4 at 2 (j / 4)
  const __m128i lo8 = _mm_loadl_epi64((const __m128i*)b.scales), m4 = _mm_set1_epi8(0x0F);
  const __m128i nib = _mm_unpacklo_epi64(_mm_and_si128(lo8, m4), _mm_and_si128(_mm_srli_epi16(lo8, 4), m4));
  const __m128i h4 = _mm_set1_epi32((int)load_u32(b.scales + 8));
  const __m128i h2 = _mm_and_si128(_mm_srlv_epi32(h4, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  const __m128i sc = _mm_sub_epi8(_mm_or_si128(nib, _mm_slli_epi16(h2, 4)), _mm_set1_epi8(32));
  const __m256i s16 = _mm256_cvtepi8_epi16(sc);
  _mm256_store_si256((__m256i*)k.sc, s16);
  k.bias = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 2));  // −4 · sc per 16 elements
  k.d = h2f(b.d);
}

// Nibble j of x in int32 lane j.
static inline __m256i nibbles8(uint32_t x) {
  const __m256i at = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)x), at), _mm256_set1_epi32(0xF));
}

// 8 int32 lanes → int16 sc[0..7].
static inline void store_sc8(__m256i v, int16_t* sc) {
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(v, v), 0x08);  // lanes 0-3 | 4-7
  _mm_store_si128((__m128i*)sc, _mm256_castsi256_si128(p));
}

static inline void sdec_iq4_xs(const block_iq4_xs& b, SuperDec& k) {
  const __m256i book = book16(kIQ4);
  for (int j = 0; j < 8; j++) k.q[j] = _mm256_shuffle_epi8(book, nibbles32(b.qs + 16 * j));
  // iq4xs_scale for the 8 sub-blocks at once
  const __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32(b.scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
  const __m256i ls = _mm256_or_si256(nibbles8(load_u32(b.scales_l)),
                                     _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
  store_sc8(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)), k.sc);
  k.d = h2f(b.d);
}

// 0xFF in byte i where bit i of m is set.
static inline __m256i bit_bytes(uint32_t m) {
#if PS_AVX512BW
  return _mm256_movm_epi8((__mmask32)m);
#else
  return bits_to_bytes(m);
#endif
}

static inline void sdec_iq3_s(const block_iq3_s& b, SuperDec& k) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), one = _mm256_set1_epi32(1);
  for (int j = 0; j < 8; j++) {  // iq3s_grid for the 8 groups of chunk j at once
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(b.qs + 8 * j)));
    const __m256i bit8 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b.qh[j]), lane), one);
    const __m256i idx = _mm256_or_si256(lo, _mm256_slli_epi32(bit8, 8));
    const __m256i mag = _mm256_i32gather_epi32((const int*)kIQ3S_grid, idx, 4);
    const __m256i neg = bit_bytes(load_u32(b.signs + 4 * j));
    k.q[j] = _mm256_sub_epi8(_mm256_xor_si256(mag, neg), neg);  // −mag where the sign bit is set
  }
  store_sc8(_mm256_add_epi32(_mm256_slli_epi32(nibbles8(load_u32(b.scales)), 1), one), k.sc);  // 1 + 2 s
  k.d = h2f(b.d);
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
template <int NC> static void k_iq4_nl(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) {
  k_book32<block_iq4_nl, kIQ4, scale_d<block_iq4_nl>, NC>(n, w, a, s, o);
}
template <int NC> static void k_mxfp4(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) {
  k_book32<block_mxfp4, kMXFP4, scale_mxfp4, NC>(n, w, a, s, o);
}
template <int NC> static void k_q2_K(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) {
  k_super<block_q2_K, sdec_q2_K, 16, false, Extra::Min, NC>(n, w, a, s, o);
}
template <int NC> static void k_q3_K(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) {
  k_super<block_q3_K, sdec_q3_K, 16, false, Extra::Offset, NC>(n, w, a, s, o);
}
template <int NC> static void k_iq4_xs(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) {
  k_super<block_iq4_xs, sdec_iq4_xs, 32, true, Extra::None, NC>(n, w, a, s, o);
}
template <int NC> static void k_iq3_s(int64_t n, const void* w, const uint8_t* a, size_t s, float* o) {
  k_super<block_iq3_s, sdec_iq3_s, 32, true, Extra::None, NC>(n, w, a, s, o);
}
#define PS_SIMD(k) PS_TILE(k)
#else
#define PS_SIMD(k) nullptr
#endif

// Constant-initialized: no static-init guard on the hot path.
static constexpr Kernels kt_f32{{"F32", 1, 4, ActFormat::F32}, deq_f32, ref_float<float, cvt_f32>, PS_SIMD(k_f32)};
static constexpr Kernels kt_f16{{"F16", 1, 2, ActFormat::F32}, deq_f16, ref_float<uint16_t, h2f>, PS_SIMD(k_f16)};
static constexpr Kernels kt_bf16{{"BF16", 1, 2, ActFormat::F32}, deq_bf16, ref_float<uint16_t, bf16_to_fp32>, PS_SIMD(k_bf16)};
// A quantized type's row: its dequantizer and reference from the same block decoding.
template <class B, void (*Codes)(const B&, int*), bool HasMin, float (*Scale)(const B&) = scale_d<B>>
static constexpr Kernels kernels32(const char* name, TileFn tile) {
  return {{name, QK, sizeof(B), ActFormat::Q8_32}, deq32<B, Codes, HasMin, Scale>, ref_legacy<B, Codes, HasMin, Scale>,
          tile};
}
template <class B, void (*Ints)(const B&, KInts&), int S, bool HasMin>
static constexpr Kernels kernels256(const char* name, TileFn tile) {
  return {{name, QK_K, sizeof(B), ActFormat::Q8_K}, deq_super<B, Ints, S, HasMin>, ref_super<B, Ints, S, HasMin>, tile};
}

static constexpr Kernels kt_q4_0 = kernels32<block_q4_0, codes_q4_0, false>("Q4_0", nullptr);
static constexpr Kernels kt_q4_1 = kernels32<block_q4_1, codes_q4_1, true>("Q4_1", PS_SIMD(k_q4_1));
static constexpr Kernels kt_q5_0 = kernels32<block_q5_0, codes_q5_0, false>("Q5_0", nullptr);
static constexpr Kernels kt_q5_1 = kernels32<block_q5_1, codes_q5_1, true>("Q5_1", PS_SIMD(k_q5_1));
static constexpr Kernels kt_q8_0 = kernels32<block_q8_0, codes_q8_0, false>("Q8_0", nullptr);
static constexpr Kernels kt_iq4_nl =
    kernels32<block_iq4_nl, codes_book<block_iq4_nl, kIQ4>, false>("IQ4_NL", PS_SIMD(k_iq4_nl));
static constexpr Kernels kt_mxfp4 =
    kernels32<block_mxfp4, codes_book<block_mxfp4, kMXFP4>, false, scale_mxfp4>("MXFP4", PS_SIMD(k_mxfp4));
static constexpr Kernels kt_q2_K = kernels256<block_q2_K, ints_q2_K, 16, true>("Q2_K", PS_SIMD(k_q2_K));
static constexpr Kernels kt_q3_K = kernels256<block_q3_K, ints_q3_K, 16, false>("Q3_K", PS_SIMD(k_q3_K));
static constexpr Kernels kt_q4_K = kernels256<block_q4_K, ints_k4<block_q4_K, codes_q4_K>, 32, true>("Q4_K", nullptr);
static constexpr Kernels kt_q5_K = kernels256<block_q5_K, ints_k4<block_q5_K, codes_q5_K>, 32, true>("Q5_K", nullptr);
static constexpr Kernels kt_q6_K = kernels256<block_q6_K, ints_q6_K, 16, false>("Q6_K", nullptr);
static constexpr Kernels kt_iq4_xs = kernels256<block_iq4_xs, ints_iq4_xs, 32, false>("IQ4_XS", PS_SIMD(k_iq4_xs));
static constexpr Kernels kt_iq3_s = kernels256<block_iq3_s, ints_iq3_s, 32, false>("IQ3_S", PS_SIMD(k_iq3_s));

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
    case GGMLType::Q2_K: return &kt_q2_K;
    case GGMLType::Q3_K: return &kt_q3_K;
    case GGMLType::IQ4_NL: return &kt_iq4_nl;
    case GGMLType::IQ4_XS: return &kt_iq4_xs;
    case GGMLType::IQ3_S: return &kt_iq3_s;
    case GGMLType::MXFP4: return &kt_mxfp4;
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

const char* ggml_type_name(uint32_t type) {
  if (const TypeTraits* tt = type_traits(type)) return tt->name;
  switch (type) {  // the rest of gguf-py's GGMLQuantizationType
    case 9: return "Q8_1";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 22: return "IQ2_S";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 40: return "NVFP4";
    case 41: return "Q1_0";
    default: return nullptr;
  }
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
