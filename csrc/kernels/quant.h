// quant: GGML tensor types, their block layouts, dequantization, activation quantization and the
// dot products that the matrix multiplications are built from.
//
// Types: F32, F16, BF16; the 32-element Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (16-entry non-linear
// codebook) and MXFP4 (e2m1 values under a power-of-two E8M0 scale); the 256-element super-blocks Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (IQ4_NL's codebook, 6-bit sub-block scales) and IQ3_S (a 512-entry grid of
// 4-value magnitudes with sign bits).
//
// Every type has a scalar reference dot product (`vec_dot_ref`). Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K get
// their SIMD path from packed.h (bit-identical to the reference); the other types have per-row AVX2 /
// AVX-512 kernels here (vec_dot_tile), chosen at compile time from the compiler's macros, which agree with
// the reference within the tolerance tests/kernels/test_quant.py states. Integer sums inside a block are exact; the
// float accumulation across blocks is done in one fixed order per kernel, so a result never depends on how
// many columns are computed together (batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyserve {

// GGML type ids as they appear in GGUF tensor infos.
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ4_NL = 20, IQ3_S = 21, IQ4_XS = 23,
  BF16 = 30, MXFP4 = 39,
};

constexpr int QK = 32;    // elements per block of the legacy types (Q4_0 … Q8_0), IQ4_NL and MXFP4
constexpr int QK_K = 256; // elements per super-block of the K-quants, IQ4_XS and IQ3_S

// ---- weight blocks (layouts exactly as in GGUF files; `d`, `dmin`, `m` are IEEE fp16 bits) ----
struct block_q4_0 { uint16_t d; uint8_t qs[QK / 2]; };                  // 18 B / 32 values
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };               // 20 B
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; };   // 22 B
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };// 24 B
struct block_q8_0 { uint16_t d; int8_t qs[QK]; };                       // 34 B
struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };               // 144 B
struct block_q5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; }; // 176 B
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; }; // 210 B
// Q2_K: scales[j] = scale (low nibble) and min (high nibble) of 16-element sub-block j; 2-bit codes.
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };             // 84 B
// Q3_K: 2-bit low codes in qs, bit 2 in hmask (set: code − 0, clear: code − 4), 16 six-bit scales − 32.
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; }; // 110 B
// IQ4_NL: nibbles index a fixed 16-entry int8 codebook.
struct block_iq4_nl { uint16_t d; uint8_t qs[QK / 2]; };                                            // 18 B
// IQ4_XS: IQ4_NL's codebook; 6-bit scale − 32 of 32-element sub-block j: low 4 bits in nibble j of
// scales_l, high 2 bits at bit 2j of scales_h.
struct block_iq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; }; // 136 B
// IQ3_S: 9-bit grid index of each 4 values (8 bits in qs, bit 8 in qh), a sign bit per value, and a 4-bit
// scale s (factor 1 + 2s) per 32-element sub-block.
struct block_iq3_s { uint16_t d; uint8_t qs[QK_K / 4]; uint8_t qh[QK_K / 32]; uint8_t signs[QK_K / 8];
                     uint8_t scales[QK_K / 64]; };                                                  // 110 B
// MXFP4: e is an E8M0 exponent (scale 2^(e − 127)); nibbles are e2m1 values (sign, 2-bit exponent, 1-bit
// mantissa), stored here doubled as integers with the scale halved.
struct block_mxfp4 { uint8_t e; uint8_t qs[QK / 2]; };                                              // 17 B

// ---- activation blocks (pyserve's own, in memory only) ----
// For the legacy types: 32 int8 values with a float scale; sum = Σ qs serves the min term of Q4_1/Q5_1 and
// the code offset of the packed kernels (packed.h).
struct block_q8_32 { float d; int32_t sum; int8_t qs[QK]; };             // 40 B
// For the K-quants (as llama.cpp's Q8_K): bsums[i] = sum of qs[16*i .. 16*i+15].
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; }; // 292 B

// What a weight type's dot product wants its activation row in.
enum class ActFormat { F32, Q8_32, Q8_K };

struct TypeTraits {
  const char* name;      // "Q4_K", …
  int block_size;        // elements per block
  size_t type_size;      // bytes per block
  ActFormat act;         // activation format of its dot product
};

// Traits of a supported type, or nullptr for an unknown / unsupported id (callers raise with context).
const TypeTraits* type_traits(uint32_t type);
// The name of any GGML type id gguf-py knows, supported here or not (for the errors about the others), or
// nullptr.
const char* ggml_type_name(uint32_t type);
// Bytes of a row of n elements. Throws std::invalid_argument if n is not a multiple of the block size.
size_t row_size(GGMLType t, int64_t n);
// Bytes of an activation row of n elements in format f (n a multiple of that format's block).
size_t act_row_size(ActFormat f, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);

// Dequantize n elements (n a multiple of the block size) of type t from src into dst. Scalar; exact to the
// format (tests compare it to the gguf package's dequantizer).
void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n);

// Quantize an activation row of n floats into format f (F32 copies). Round to nearest, d = amax / 127.
void quantize_act_row(ActFormat f, const float* x, void* dst, int64_t n);

// The signed values of one Q4_0 / Q5_0 / Q8_0 block (−8..7, −16..15, −128..127) and its fp16 scale bits,
// for re-laying it (packed.h). Throws std::invalid_argument for another type.
void legacy_block_codes(GGMLType t, const void* block, int q[QK], uint16_t* d);

// The integer content of one K-quant super-block, for re-laying it (packed.h): codes in element order
// (Q4_K: 0..15, Q5_K: 0..31, Q6_K: 0..63 = value + 32), sub-block scales (Q4_K / Q5_K: 8 of 0..63; Q6_K: 16
// signed) and mins (Q4_K / Q5_K: 8 of 0..63), fp16 d and dmin bits. Throws std::invalid_argument for
// another type.
struct KBlockCodes {
  uint8_t q[QK_K];
  int8_t sc[16];
  uint8_t m[8];
  uint16_t d, dmin;
};
void k_block_codes(GGMLType t, const void* block, KBlockCodes& out);

// Dot product of one weight row (type t, n elements) with one activation row already in
// type_traits(t)->act format; scalar.
float vec_dot_ref(GGMLType t, int64_t n, const void* w_row, const void* act_row);

// A tile of products for the matmul: nrows weight rows (w + r · row_bytes) × ncols activation rows (act +
// c · act_stride) into out[c · out_stride + r], through the type's per-row SIMD kernel where this build has
// one, else through vec_dot_ref. A product's bits do not depend on nrows, ncols or where it sits in the tile.
void vec_dot_tile(GGMLType t, int64_t n, const void* w, size_t row_bytes, int64_t nrows, const void* act,
                  size_t act_stride, int ncols, float* out, size_t out_stride);

}  // namespace pyserve
