// packed: weight matrices re-laid for the matrix product (Q4_0, Q5_0, Q8_0 and the K-quants Q4_K, Q5_K,
// Q6_K).
//
// A group is 8 consecutive weight rows. Within a group, each 32-element (sub-)block of the 8 rows is
// stored interleaved 4 elements at a time (row r's elements 4k..4k+3 at bytes 32k + 4r), so one 256-bit
// u8·s8 dot-product instruction (vpdpbusd) against 4 broadcast activation bytes advances all 8 rows, and 8
// of them leave each row's exact integer block sum in its own lane: no horizontal reduction per block, and
// the weight registers serve up to 8 activation columns. Codes are unsigned (value + offset); the offset
// times the activation block's Σq is subtracted exactly in integers first. 4- to 6-bit codes are kept as
// nibbles plus bit planes, so a packed matrix is about the size of the file's (Q4_K / Q5_K: +3 % for
// scales laid out for the kernels).
//
// Arithmetic contract: out = Σ_blocks fma(d_w·d_a, isum, acc) in block order, one chain per output element
// (K-quants: isum = Σ_j sc_j·Σq·a, then fma(−dmin·d_a, Σ_j m_j·Σa_j, acc)) — the chain of vec_dot_ref on the
// original type, so the result is bit-identical to it whatever the number of columns, rows or threads
// (batch invariance).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/quant.h"

namespace pyserve {

constexpr int PACK_ROWS = 8;  // weight rows per group

struct PackedWeight {
  GGMLType type = GGMLType::Q8_0;  // the original type
  int64_t n_in = 0;                // elements per row (a multiple of the type's block)
  int64_t n_groups = 0;            // groups of PACK_ROWS rows; rows from n_groups · 8 on are not packed
  size_t group_bytes = 0;          // one group: n_in / block packed blocks
  std::unique_ptr<uint8_t, void (*)(void*)> data{nullptr, nullptr};  // [n_groups][group_bytes], 64-B aligned
                                                                     // (2 MiB from 4 MiB on: huge pages)
  const uint8_t* group(int64_t g) const { return data.get() + g * group_bytes; }
};

// True for the types this build packs (the six above, when the AVX2 kernels are compiled in).
bool packable(GGMLType t);

// The packed form of n_rows rows of n_in elements of type t, without its data: type, n_in, n_groups and
// group_bytes as pack_weight gives them. Throws std::invalid_argument as pack_weight does.
PackedWeight packed_shape(GGMLType t, int64_t n_rows, int64_t n_in);

// This build's packed layout, e.g. "packed/2 vnni=1 avx2=1": packed_file.h keeps it with the weights.
std::string packed_layout();

// A packed matrix's data is on 2 MiB boundaries from this size on (transparent huge pages can back it).
constexpr size_t PACK_HUGE_FROM = 4u << 20;

// Packs the first ⌊n_rows / 8⌋ · 8 rows (row r at rows + r · row_bytes, n_in elements of type t).
// Throws std::invalid_argument when t is not packable or n_in is not a multiple of its block, std::bad_alloc
// when the copy does not fit in memory.
std::unique_ptr<PackedWeight> pack_weight(GGMLType t, const uint8_t* rows, size_t row_bytes, int64_t n_rows,
                                          int64_t n_in);

// Products of groups [g0, g1) with ncols activation rows (the type's format, act + c · act_stride):
// out[c · out_stride + 8 (g − g0) + r] for row r of group g.
void packed_tile(const PackedWeight& p, int64_t g0, int64_t g1, const uint8_t* act, size_t act_stride, int ncols,
                 float* out, size_t out_stride);

}  // namespace pyserve
