// attention_tile: the tiled (online) attention kernel's step as small matrix products over one K/V tile.
// A tile's rows are gathered once per query run (tile_rows), then each query's heads take from it their
// scores (tile_scores), exp-weights and denominator (tile_exp_sum) and weighted sum (tile_accumulate).
// Scores go 16 keys at a time: 16 per-key vectors of partial sums reduced together into one vector of 16
// scores, so the sum across lanes costs 3 instructions a key instead of a whole reduction each.
//
// Each value has one order of operations, whatever the SIMD width, the rows beside it or the run it is in:
//   score        s[r][j]: 16 lane sums (lane l: q_r[d] · K[j][d] for d = l, l + 16, … < hd16 = hd rounded
//                down to 16, an fma chain from 0), then the tree below, then an fma chain over d ≥ hd16 —
//                kv_scores' order (kv_rows.h), so that a score is attend_ref's bits;
//   weight       p[j] = exp8_lane(s[j] − m) (simd.h) for j < n, 0 for n ≤ j < ntp;
//   denominator  16 lane sums (lane l: p[l], p[16 + l], … in order, from 0), then the tree;
//   output       o[r][i] ← fma chain over j < n of p[r][j] · V[j][i], from o[r][i] · corr[r];
//   the tree     of 16 lane values x: a[l] = x[l] + x[l + 8], b[l] = a[l] + a[l + 4], (b0 + b2) + (b1 + b3).
// The `_ref` twins compute them one value at a time (tests/kernels/test_attention_tile.py holds them bit for bit).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_rows.h"

namespace pyserve {

// Keys per group of scores: a tile's keys are padded to a multiple of it.
constexpr int kTileLanes = 16;

// One tile of nt keys of one KV head: its K and V rows, in the cache where they are (one query reads each
// value once) or widened to f32 here (a run of queries reads them again and again: widening once costs
// less than each query's conversions). Widening is exact, so the two give the same bits.
struct KVTile {
  KVDType dtype = KVDType::F32;          // of the rows below
  bool widened = false;                  // rows in kw / vw (else in the cache, read in place)
  int nt = 0, ntp = 0, hd = 0;           // keys, keys padded to kTileLanes, values per head
  size_t row_bytes = 0;                  // of a row in the cache
  std::vector<const uint8_t*> k, v;      // [ntp] K rows (the padding keys: a zero row), [nt] V rows
  std::vector<float> kw, vw;             // [nt][hd] each: the widened rows' storage
  std::vector<uint8_t> zero;             // one row of zero bytes (0 in every format)
  // The next tile's K and V rows in the cache (next_n of them; none: 0): tile_scores brings them toward L2
  // a share per group of keys, so that they arrive while this tile computes, spread out rather than in one
  // burst that fills the line-fill buffers (and, read in place, each group's next group toward L1: a paged
  // block's rows end every 16 slots, where the hardware prefetchers lose the stream).
  const uint8_t* const* next_k = nullptr;
  const uint8_t* const* next_v = nullptr;
  int next_n = 0;
};

// tile ← the nt ≥ 1 K and V rows (hd values each, stored as t), widened when `widen`; no next rows. Doesn't
// throw beyond allocation.
void tile_rows(KVDType t, const uint8_t* const* k, const uint8_t* const* v, int nt, int hd, bool widen, KVTile& tile);
// s[r·ntp + j] = score of query row r (q + r·hd) and key j, for r < rows, j < ntp (padding keys score 0).
void tile_scores(const float* q, int rows, const KVTile& tile, float* s);
void tile_scores_ref(const float* q, int rows, const KVTile& tile, float* s);
// s[0, ntp) ← its weights over the first n keys (1 ≤ n ≤ ntp, ntp a multiple of kTileLanes); returns the
// denominator.
float tile_exp_sum(float* s, int n, int ntp, float m);
float tile_exp_sum_ref(float* s, int n, int ntp, float m);
// o[r·hd + i] ← o[r·hd + i] · corr[r] + Σ_{j<n} p[r·ntp + j] · V[j][i] (the chain above), r < rows.
void tile_accumulate(const float* p, int rows, int n, const KVTile& tile, const float* corr, float* o);
void tile_accumulate_ref(const float* p, int rows, int n, const KVTile& tile, const float* corr, float* o);

}  // namespace pyserve
