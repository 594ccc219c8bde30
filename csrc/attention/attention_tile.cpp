#include "attention/attention_tile.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kv/kv_formats.h"
#include "kernels/ops.h"

namespace pyserve {

namespace {

// The tree of 16 lane values (attention_tile.h).
float lane_tree(const float* lane) {
  float a[8], b[4];
  for (int l = 0; l < 8; l++) a[l] = lane[l] + lane[l + 8];
  for (int l = 0; l < 4; l++) b[l] = a[l] + a[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// a, then the fma chain over d in [d0, hd) of q[d] · k[d]: a score's values past its 16-lane part.
template <class R>
float score_tail(float a, const float* q, const uint8_t* k, int d0, int hd) {
  for (int d = d0; d < hd; d++) a = std::fma(q[d], R::at(k, d), a);
  return a;
}

// a, then the fma chain over j < n of p[j] · V[j][i]: one output value's sum (a: its old value · corr).
template <class R>
float value_chain(float a, const float* p, const uint8_t* const* v, int n, int i) {
  for (int j = 0; j < n; j++) a = std::fma(p[j], R::at(v[j], i), a);
  return a;
}

// Pointers to n rows of hd f32 values at x.
void point_rows(const float* x, int n, int hd, const uint8_t** rows) {
  for (int j = 0; j < n; j++) rows[j] = (const uint8_t*)(x + (size_t)j * hd);
}

}  // namespace

void tile_rows(KVDType t, const uint8_t* const* k, const uint8_t* const* v, int nt, int hd, bool widen, KVTile& tile) {
  tile.nt = nt, tile.hd = hd, tile.ntp = (nt + kTileLanes - 1) / kTileLanes * kTileLanes;
  tile.dtype = widen ? KVDType::F32 : t, tile.widened = widen, tile.row_bytes = kv_row_bytes(t, hd);
  tile.k.resize(tile.ntp);
  tile.v.resize(nt);
  if (tile.zero.size() < (size_t)hd * 4) tile.zero.assign((size_t)hd * 4, 0);
  if (widen) {
    grow(tile.kw, (size_t)nt * hd);
    grow(tile.vw, (size_t)nt * hd);
    kv_widen_rows(t, k, nt, hd, tile.kw.data());
    kv_widen_rows(t, v, nt, hd, tile.vw.data());
    point_rows(tile.kw.data(), nt, hd, tile.k.data());
    point_rows(tile.vw.data(), nt, hd, tile.v.data());
  } else {
    std::copy_n(k, nt, tile.k.begin());
    std::copy_n(v, nt, tile.v.begin());
  }
  std::fill(tile.k.begin() + nt, tile.k.end(), tile.zero.data());
  tile.next_k = tile.next_v = nullptr, tile.next_n = 0;
}

void tile_scores_ref(const float* q, int rows, const KVTile& tile, float* s) {
  const int hd = tile.hd, hd16 = hd / kTileLanes * kTileLanes;
  with_rows(tile.dtype, [&](auto fmt) {
    using R = decltype(fmt);
    for (int r = 0; r < rows; r++)
      for (int j = 0; j < tile.ntp; j++) {
        const float* qr = q + (size_t)r * hd;
        float lane[kTileLanes] = {};
        for (int d = 0; d < hd16; d++) lane[d % kTileLanes] = std::fma(qr[d], R::at(tile.k[j], d), lane[d % kTileLanes]);
        s[(size_t)r * tile.ntp + j] = score_tail<R>(lane_tree(lane), qr, tile.k[j], hd16, hd);
      }
  });
}

float tile_exp_sum_ref(float* s, int n, int ntp, float m) {
  float lane[kTileLanes] = {};
  for (int j = 0; j < ntp; j++) {
    s[j] = j < n ? exp8_lane(s[j] - m) : 0.f;
    lane[j % kTileLanes] += s[j];
  }
  return lane_tree(lane);
}

void tile_accumulate_ref(const float* p, int rows, int n, const KVTile& tile, const float* corr, float* o) {
  const int hd = tile.hd;
  with_rows(tile.dtype, [&](auto fmt) {
    using R = decltype(fmt);
    for (int r = 0; r < rows; r++)
      for (int i = 0; i < hd; i++)
        o[r * hd + i] = value_chain<R>(o[r * hd + i] * corr[r], p + (size_t)r * tile.ntp, tile.v.data(), n, i);
  });
}

#if PS_AVX2
namespace {

#if PS_AVX512BW
using Vec = F32x16;
constexpr int kRowBlock = 4;  // query rows per weighted-sum register block: 4 × 4 accumulators of 32 registers
template <class R>
__m512 load_vec(const uint8_t* row, int i) { return R::load16(row, i); }
#else
using Vec = F32x8;
constexpr int kRowBlock = 2;  // 2 × 4 of the 16
template <class R>
__m256 load_vec(const uint8_t* row, int i) { return R::load8(row, i); }
#endif
using VT = Vec::T;
constexpr int W = Vec::W;
constexpr int kVecBlock = 4;  // vectors of output values per register block

#if PS_AVX512BW
// reduce16 leaves the tree of vector m in lane σ(m) = 4 (m mod 4) + m / 4 (its last levels transpose 4 × 4;
// σ is its own inverse), so vector σ(L) accumulates the score wanted in lane L.
constexpr int sigma(int m) { return 4 * (m % 4) + m / 4; }

// Lane σ(m) ← the tree of a[m]'s 16 lanes, for 16 vectors at once (attention_tile.h's tree, each level adding
// halves of two vectors side by side: 15 adds and 30 shuffles for 16 scores).
__m512 reduce16(const __m512 a[16]) {
  __m512 b[8], c[4], d[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++)  // 256-bit halves: lanes l + (l + 8); vectors 2i | 2i + 1
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44), _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; i++)  // 128-bit quarters: l + (l + 4); one vector a quarter
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; i++)  // pairs in each quarter: l + (l + 2)
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),  // 0 + 1
                       _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The scores of RB query rows (q, q + hd, …) and KB = 16 / RB keys k[0, KB) over their first hd16 values, in
// lane ri · KB + ki; each key's 16-value chunk loaded once for the RB rows.
template <class R, int RB>
__m512 scores_block(const float* q, int hd, const uint8_t* const* k, int hd16) {
  constexpr int KB = 16 / RB;
  __m512 a[16];
  for (__m512& x : a) x = _mm512_setzero_ps();
  for (int d = 0; d < hd16; d += 16) {
    __m512 qv[RB], kv[KB];
    for (int ri = 0; ri < RB; ri++) qv[ri] = _mm512_loadu_ps(q + (size_t)ri * hd + d);
    if constexpr (KB < 16)
      for (int ki = 0; ki < KB; ki++) kv[ki] = R::load16(k[ki], d);
#pragma GCC unroll 16  // the 16 accumulators must stay in registers
    for (int m = 0; m < 16; m++) {
      const int L = sigma(m);
      a[m] = _mm512_fmadd_ps(qv[L / KB], KB < 16 ? kv[L % KB] : R::load16(k[L % KB], d), a[m]);
    }
  }
  return reduce16(a);
}

// s[r·ntp + ki] ← rows r < RB, keys ki < 16 / RB: the block's vector part, then the chain past hd16.
template <class R, int RB>
void scores_rows(const float* q, int hd, const uint8_t* const* k, float* s, int ntp) {
  constexpr int KB = 16 / RB;
  const int hd16 = hd / 16 * 16;
  alignas(64) float out[16];
  _mm512_store_ps(out, scores_block<R, RB>(q, hd, k, hd16));
  for (int ri = 0; ri < RB; ri++)
    for (int ki = 0; ki < KB; ki++) s[(size_t)ri * ntp + ki] = score_tail<R>(out[ri * KB + ki], q + (size_t)ri * hd, k[ki], hd16, hd);
}

// One 16-key group of `rows` rows: blocks of 4 rows × 4 keys, then 2 × 8, then 1 × 16.
template <class R>
void scores_group(const float* q, int rows, int hd, const uint8_t* const* k, float* s, int ntp) {
  int r = 0;
  for (; r + 4 <= rows; r += 4)
    for (int k0 = 0; k0 < 16; k0 += 4) scores_rows<R, 4>(q + (size_t)r * hd, hd, k + k0, s + (size_t)r * ntp + k0, ntp);
  for (; r + 2 <= rows; r += 2)
    for (int k0 = 0; k0 < 16; k0 += 8) scores_rows<R, 2>(q + (size_t)r * hd, hd, k + k0, s + (size_t)r * ntp + k0, ntp);
  if (r < rows) scores_rows<R, 1>(q + (size_t)r * hd, hd, k, s + (size_t)r * ntp, ntp);
}
#else
// The score of one query row and key over its first hd16 values: the 16 lane sums as two 8-lane halves,
// added, then hsum8's tree.
template <class R>
float score1(const float* q, const uint8_t* k, int hd16) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int d = 0; d < hd16; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), R::load8(k, d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), R::load8(k, d + 8), a1);
  }
  return hsum8(_mm256_add_ps(a0, a1));
}

// One 16-key group of `rows` rows, a score at a time.
template <class R>
void scores_group(const float* q, int rows, int hd, const uint8_t* const* k, float* s, int ntp) {
  const int hd16 = hd / 16 * 16;
  for (int r = 0; r < rows; r++, q += hd)
    for (int m = 0; m < 16; m++) s[(size_t)r * ntp + m] = score_tail<R>(score1<R>(q, k[m], hd16), q, k[m], hd16, hd);
}
#endif

// RB rows × DB vectors of output values (from value i0): rescaled by corr, then each key adds p_r[j] · V[j].
template <class R, int RB, int DB>
void accumulate_block(const float* p, int ntp, int n, const uint8_t* const* v, int i0, int hd, const float* corr,
                      float* o) {
  VT acc[RB][DB];
  for (int r = 0; r < RB; r++)
    for (int c = 0; c < DB; c++) acc[r][c] = Vec::mul(Vec::load(o + r * hd + i0 + c * W), Vec::set1(corr[r]));
  for (int j = 0; j < n; j++) {
    VT x[DB];
    for (int c = 0; c < DB; c++) x[c] = load_vec<R>(v[j], i0 + c * W);
    for (int r = 0; r < RB; r++) {
      const VT pr = Vec::set1(p[(size_t)r * ntp + j]);
      for (int c = 0; c < DB; c++) acc[r][c] = Vec::fma(pr, x[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RB; r++)
    for (int c = 0; c < DB; c++) Vec::store(o + r * hd + i0 + c * W, acc[r][c]);
}

template <class R, int RB>
void accumulate_rows(const float* p, int n, const KVTile& t, const float* corr, float* o) {
  const int hd = t.hd, vecs = hd / W;
  const uint8_t* const* v = t.v.data();
  int c = 0;
  for (; c + kVecBlock <= vecs; c += kVecBlock) accumulate_block<R, RB, kVecBlock>(p, t.ntp, n, v, c * W, hd, corr, o);
  switch (vecs - c) {
    case 3: accumulate_block<R, RB, 3>(p, t.ntp, n, v, c * W, hd, corr, o); break;
    case 2: accumulate_block<R, RB, 2>(p, t.ntp, n, v, c * W, hd, corr, o); break;
    case 1: accumulate_block<R, RB, 1>(p, t.ntp, n, v, c * W, hd, corr, o); break;
  }
  for (int r = 0; r < RB; r++)  // values past the last whole vector: the reference's chain
    for (int i = vecs * W; i < hd; i++)
      o[r * hd + i] = value_chain<R>(o[r * hd + i] * corr[r], p + (size_t)r * t.ntp, v, n, i);
}

// f(rb, r) for every block of rb = kRowBlock rows from row r, then the rest (rb an integral_constant).
template <class F>
void by_row_blocks(int rows, F&& f) {
  int r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock) f(std::integral_constant<int, kRowBlock>{}, r);
  switch (rows - r) {
    case 3:
      if constexpr (kRowBlock > 3) f(std::integral_constant<int, 3>{}, r);
      return;
    case 2: return f(std::integral_constant<int, 2>{}, r);
    case 1: return f(std::integral_constant<int, 1>{}, r);
  }
}

}  // namespace

namespace {

// Group g's share of the next tile's rows, toward L2.
void prefetch_share(const KVTile& t, int g) {
  const int groups = t.ntp / kTileLanes, share = (t.next_n + groups - 1) / groups;
  for (int j = g * share; j < std::min(t.next_n, (g + 1) * share); j++)
    for (size_t b = 0; b < t.row_bytes; b += 64) {
      __builtin_prefetch(t.next_k[j] + b, 0, 2);
      __builtin_prefetch(t.next_v[j] + b, 0, 2);
    }
}

}  // namespace

void tile_scores(const float* q, int rows, const KVTile& t, float* s) {
  with_rows(t.dtype, [&](auto fmt) {
    for (int j = 0; j < t.ntp; j += kTileLanes) {  // a group's 16 keys stay in L1 for all the rows
      prefetch_share(t, j / kTileLanes);
      for (int p = j + kTileLanes; p < std::min(t.nt, j + 2 * kTileLanes) && !t.widened; p++)
        for (size_t b = 0; b < t.row_bytes; b += 64) __builtin_prefetch(t.k[p] + b, 0, 3);  // the next group's, to L1
      scores_group<decltype(fmt)>(q, rows, t.hd, t.k.data() + j, s + j, t.ntp);
    }
  });
}

float tile_exp_sum(float* s, int n, int ntp, float m) {
  const VT mv = Vec::set1(m);
  VT acc[kTileLanes / W];
  for (VT& a : acc) a = Vec::zero();
  for (int j = 0; j < ntp; j += kTileLanes)
    for (int h = 0; h < kTileLanes / W; h++) {
      const int at = j + h * W;
      const VT e = Vec::first(exp_lanes<Vec>(Vec::sub(Vec::load(s + at), mv)), n - at);
      Vec::store(s + at, e);
      acc[h] = Vec::add(acc[h], e);
    }
  float lane[kTileLanes];
  for (int h = 0; h < kTileLanes / W; h++) Vec::store(lane + h * W, acc[h]);
  return lane_tree(lane);
}

void tile_accumulate(const float* p, int rows, int n, const KVTile& t, const float* corr, float* o) {
  with_rows(t.dtype, [&](auto fmt) {
    by_row_blocks(rows, [&](auto rb, int r) {
      accumulate_rows<decltype(fmt), decltype(rb)::value>(p + (size_t)r * t.ntp, n, t, corr + r, o + (size_t)r * t.hd);
    });
  });
}

#else

void tile_scores(const float* q, int rows, const KVTile& t, float* s) { tile_scores_ref(q, rows, t, s); }
float tile_exp_sum(float* s, int n, int ntp, float m) { return tile_exp_sum_ref(s, n, ntp, m); }
void tile_accumulate(const float* p, int rows, int n, const KVTile& t, const float* corr, float* o) {
  tile_accumulate_ref(p, rows, n, t, corr, o);
}

#endif

}  // namespace pyserve
