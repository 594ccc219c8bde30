// packed_amx: the packed matrix product (packed.h) on Intel AMX-INT8 tiles, for prefill-sized column counts.
//
// One tile product takes 16 activation columns (tokens) × 16 weight rows (two packed groups) × one block
// of 32 codes (Q6_K: one group of 16): TDPBSUD / TDPBSSD leave each (token, row) pair's exact integer
// block sum in an int32 tile, and the block's scales are then applied with the same integer and float
// operations, in the same order, as packed.cpp's kernels — so the product is bit-identical to them and to
// vec_dot_ref whatever the columns, rows or threads (batch invariance). The weights' codes are decoded
// into tile layout once per panel of row pairs and reused for every 16 columns.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/packed.h"

namespace pyserve {

constexpr int AMX_COLS = 16;  // activation columns per tile
constexpr int AMX_ROWS = 16;  // weight rows per tile: two packed groups

// True when this build has the AMX kernels, the CPU has AMX-INT8, Linux grants this process the tile
// data state (arch_prctl ARCH_REQ_XCOMP_PERM) and PYSERVE_AMX is not "0". Decided once; never throws.
bool amx_usable();

// True for the packed types with an AMX kernel (all six when amx_usable()).
bool amx_packs(GGMLType t);

// Groups [g0, g1) (an even count) × columns [0, ncols) (a multiple of AMX_COLS), as packed_tile:
// out[c · out_stride + 8 (g − g0) + r]. Precondition: amx_usable() && amx_packs(p.type); throws
// std::logic_error in a build without the kernels.
void amx_tile(const PackedWeight& p, int64_t g0, int64_t g1, const uint8_t* act, size_t act_stride, int ncols,
              float* out, size_t out_stride);

// int8 multiply-adds done by the calling thread in `reps` passes of four independent TDPBSSD products of
// 16 × 16 × 64 (operands in tiles, nothing loaded per pass): the unit's peak (machine_limits.h). 0 in a build
// without the kernels. Precondition: amx_usable().
uint64_t amx_peak_loop(int64_t reps);

}  // namespace pyserve
