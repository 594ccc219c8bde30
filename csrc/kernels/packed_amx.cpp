// packed_amx: see packed_amx.h. Compiled with -mamx-tile -mamx-int8 where the compiler has them
// (CMakeLists.txt); the kernels run only where amx_usable() says the CPU and the OS allow them.
#include "kernels/packed_amx.h"

// GCC 12's AVX-512 conversion intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports at every call site (a known false positive of those headers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/packed_blocks.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && PS_AVX512BW && defined(__linux__)
#define PS_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define PS_AMX 0
#endif

namespace pyserve {
namespace {
using namespace packed_detail;

#if PS_AMX
// Tiles: C 0-3 (16 columns × 16 rows, int32), A 4-5 (16 columns × K activation bytes), B 6-7 (K / 4 rows
// of 16 weight rows × 4 codes: the packed interleave of two groups side by side). Four products in flight
// with their own C tiles: one at a time, each waits out the previous one's latency and its store (measured
// ~75 int8 MAC per cycle, against the unit's 1,024).
constexpr size_t CHUNK_B = 16 * 32;        // one 32-code chunk of a row pair in tile layout (bytes)
constexpr size_t PANEL_BYTES = 512 << 10;  // decoded codes per panel of row pairs: in L2 beside the columns
constexpr int FLIGHT = 4;                  // products per batch

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row
  uint8_t rows[16] = {};
};

void load_config(int k_bytes) {
  TileConfig c;
  for (int t = 0; t < 4; t++) c.rows[t] = AMX_COLS, c.colsb[t] = AMX_ROWS * 4;
  for (int t = 4; t < 6; t++) c.rows[t] = AMX_COLS, c.colsb[t] = (uint16_t)k_bytes;
  for (int t = 6; t < 8; t++) c.rows[t] = (uint8_t)(k_bytes / 4), c.colsb[t] = AMX_ROWS * 4;
  _tile_loadconfig(&c);
}

using CTile = int32_t[AMX_COLS][AMX_ROWS];  // [column][row]

// Tile numbers are pasted into the instruction's text: macros, not function arguments.
#define PS_TDP(S, c, a, b) \
  if constexpr (S) _tile_dpbssd(c, a, b); \
  else _tile_dpbsud(c, a, b)
#define PS_PRODUCT(S, c, a, b, u)       \
  _tile_zero(c);                        \
  _tile_loadd(a, ap[u], act_stride);    \
  _tile_loadd(b, bp[u], AMX_ROWS * 4);  \
  PS_TDP(S, c, a, b)

// C = A · B for FLIGHT blocks (A's rows act_stride apart from ap[u], B from the decoded chunk bp[u]) into c[u].
// c is read a batch later: the stores are still landing when products() returns.
template <bool SIGNED>
inline void products(const uint8_t* const* ap, size_t act_stride, const uint8_t* const* bp, CTile* c) {
  PS_PRODUCT(SIGNED, 0, 4, 6, 0);
  PS_PRODUCT(SIGNED, 1, 5, 7, 1);
  PS_PRODUCT(SIGNED, 2, 4, 6, 2);
  PS_PRODUCT(SIGNED, 3, 5, 7, 3);
  _tile_stored(0, c[0], AMX_ROWS * 4);
  _tile_stored(1, c[1], AMX_ROWS * 4);
  _tile_stored(2, c[2], AMX_ROWS * 4);
  _tile_stored(3, c[3], AMX_ROWS * 4);
}

// One block alone (a row's last blocks past a whole batch).
template <bool SIGNED>
inline void product(const uint8_t* const* ap, size_t act_stride, const uint8_t* const* bp, CTile* c) {
  PS_PRODUCT(SIGNED, 0, 4, 6, 0);
  _tile_stored(0, c[0], AMX_ROWS * 4);
}

// 16 lanes from two groups' 8: fp16 scales to float, 8-bit scales to int32.
inline __m512 halves16(const uint16_t* lo, const uint16_t* hi) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)lo)),
                                            _mm_loadu_si128((const __m128i*)hi), 1);
  return _mm512_cvtph_ps(h);
}
inline __m128i bytes16(const void* lo, const void* hi) {
  return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i*)lo), _mm_loadl_epi64((const __m128i*)hi));
}
inline __m512i cat(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// ---- decoding: the 8 vectors of 32-code chunk q of one group (packed.cpp's interleave), as the kernels
// see them (Q8_0: its signed values).
template <class PB> void dec_chunk(const PB* b, int64_t q, __m256i* w);
template <> void dec_chunk(const pblock_q8_0* b, int64_t q, __m256i* w) {
  for (int k = 0; k < 8; k++) w[k] = load256(b[q].q + 32 * k);
}
template <> void dec_chunk(const pblock_q4_0* b, int64_t q, __m256i* w) { dec_q4_0(b[q], w); }
template <> void dec_chunk(const pblock_q5_0* b, int64_t q, __m256i* w) { dec_q5_0(b[q], w); }
template <> void dec_chunk(const pblock_q4_K* b, int64_t q, __m256i* w) { dec_sub_k(b[q / 8], (int)(q % 8), w); }
template <> void dec_chunk(const pblock_q5_K* b, int64_t q, __m256i* w) { dec_sub_k(b[q / 8], (int)(q % 8), w); }
template <> void dec_chunk(const pblock_q6_K* b, int64_t q, __m256i* w) {
  split_nibbles(b[q / 8].pair[q % 8].q, w);
  add_high2(b[q / 8].pair[q % 8].hi, w);
}

// Row pair (groups b0, b1) → out: n_chunks chunks, B row k of chunk q = [group 0's vector k | group 1's].
template <class PB>
void decode_pair(const PB* b0, const PB* b1, int64_t n_chunks, uint8_t* out) {
  for (int64_t q = 0; q < n_chunks; q++) {
    __m256i w0[8], w1[8];
    dec_chunk(b0, q, w0);
    dec_chunk(b1, q, w1);
    for (int k = 0; k < 8; k++) {
      _mm256_store_si256((__m256i*)(out + q * CHUNK_B + 64 * k), w0[k]);
      _mm256_store_si256((__m256i*)(out + q * CHUNK_B + 64 * k + 32), w1[k]);
    }
  }
}

// ---- kernels: one tile of 16 columns × one row pair over the whole row. act: column 0's row;
// out: column 0's 16 outputs. Each output's chain is packed.cpp's for its type.

// Legacy blocks: fma(d_w·d_a, Σ codes·a − OFF·Σa, acc) per block, in block order.
template <class PB, int OFF>
inline void legacy_block(const PB& p0, const PB& p1, const uint8_t* act, size_t stride, int64_t i, const CTile& c,
                         __m512* acc) {
  const __m512 dw = halves16(p0.d, p1.d);
  for (int t = 0; t < AMX_COLS; t++) {
    const block_q8_32& a = ((const block_q8_32*)(act + t * stride))[i];
    __m512i s = _mm512_load_si512(c[t]);
    if (OFF) s = _mm512_sub_epi32(s, _mm512_set1_epi32(OFF * a.sum));
    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(a.d)), _mm512_cvtepi32_ps(s), acc[t]);
  }
}

// Legacy rows: batch n = blocks [4n, 4n + 4); the products of batch n + 1 are issued before batch n's
// results are read, so the tile stores have landed by then. A row's last blocks past whole batches go
// one at a time.
template <class PB, bool SIGNED, int OFF>
void tile_legacy(const PB* b0, const PB* b1, int64_t nb, const uint8_t* dec, const uint8_t* act, size_t stride,
                 float* out, size_t os) {
  __m512 acc[AMX_COLS];
  for (auto& a : acc) a = _mm512_setzero_ps();
  alignas(64) CTile c[2][FLIGHT];
  const int64_t n_batches = nb / FLIGHT;
  auto issue = [&](int64_t n) {
    const uint8_t *ap[FLIGHT], *bp[FLIGHT];
    for (int u = 0; u < FLIGHT; u++) {
      ap[u] = act + (n * FLIGHT + u) * sizeof(block_q8_32) + offsetof(block_q8_32, qs);
      bp[u] = dec + (n * FLIGHT + u) * CHUNK_B;
    }
    products<SIGNED>(ap, stride, bp, c[n & 1]);
  };
  if (n_batches > 0) issue(0);
  for (int64_t n = 0; n < n_batches; n++) {
    if (n + 1 < n_batches) issue(n + 1);
    for (int u = 0; u < FLIGHT; u++) {
      const int64_t i = n * FLIGHT + u;
      legacy_block<PB, OFF>(b0[i], b1[i], act, stride, i, c[n & 1][u], acc);
    }
  }
  for (int64_t i = n_batches * FLIGHT; i < nb; i++) {
    const uint8_t* ap = act + i * sizeof(block_q8_32) + offsetof(block_q8_32, qs);
    const uint8_t* bp = dec + i * CHUNK_B;
    product<SIGNED>(&ap, stride, &bp, c[0]);
    legacy_block<PB, OFF>(b0[i], b1[i], act, stride, i, c[0][0], acc);
  }
  for (int t = 0; t < AMX_COLS; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

// Lane-broadcast p of v (int32 lanes).
inline __m512i lane(__m128i v, int p) { return _mm512_permutexvar_epi32(_mm512_set1_epi32(p), _mm512_castsi128_si512(v)); }

// Σ_j m_j · (bsums[2j] + bsums[2j+1]) per row (packed.cpp's mins_term, 16 rows): m[p] holds the rows'
// int16 pairs (m_2p, m_2p+1); the activation's pair sums go in as int16 pairs (|sum| ≤ 4,064: exact).
inline __m512i mins16(const __m512i* m, const block_q8_K& a) {
  const __m256i bs = _mm256_loadu_si256((const __m256i*)a.bsums);
  const __m256i sums = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));  // 8 × int32
  const __m128i pairs = _mm_packs_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  __m512i r = _mm512_setzero_si512();
  for (int p = 0; p < 4; p++) r = _mm512_dpwssd_epi32(r, m[p], lane(pairs, p));
  return r;
}

// Q6_K's offset term Σ_g sc_g · 32·Σa_g per row, by int16 pairs (sc_2p, sc_2p+1) · (bsums[2p], bsums[2p+1]).
inline __m512i offsets16(const __m512i* scp, const block_q8_K& a) {
  __m512i r = _mm512_setzero_si512();
  for (int p = 0; p < 8; p++) {
    int32_t w;
    std::memcpy(&w, a.bsums + 2 * p, 4);
    r = _mm512_dpwssd_epi32(r, scp[p], _mm512_set1_epi32(w));
  }
  return _mm512_slli_epi32(r, 5);
}

// Q6_K's signed scales as the 16 rows' int16 pairs (sc_2p, sc_2p+1): sc0 group 0's 8 rows, sc1 group 1's.
inline void scale_pairs(const int8_t (*sc0)[8], const int8_t (*sc1)[8], __m512i* out) {
  for (int p = 0; p < 8; p++) {
    const __m128i lo = bytes16(sc0[2 * p], sc1[2 * p]), hi = bytes16(sc0[2 * p + 1], sc1[2 * p + 1]);
    const __m256i inter = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    out[p] = _mm512_cvtepi8_epi16(inter);
  }
}

// The float steps of a super-block: fma(d·d_a, tot, acc), then for Q4_K / Q5_K fma(−dmin·d_a, mins, acc).
// Q6_K's tot first loses its offset term (integers: exact in any order).
template <class PB>
void kquant_finish(const PB& p0, const PB& p1, const uint8_t* act, size_t stride, int64_t i, __m512i* tot,
                   __m512* acc) {
  constexpr bool Q6 = std::is_same_v<PB, pblock_q6_K>;
  const __m512 dw = halves16(p0.d, p1.d);
  __m512 dm = _mm512_setzero_ps();
  __m512i pairs[8];
  if constexpr (Q6) {
    scale_pairs(p0.sc, p1.sc, pairs);
  } else {
    dm = halves16(p0.dmin, p1.dmin);
    for (int p = 0; p < 4; p++) pairs[p] = cat(min_pairs(p0, p), min_pairs(p1, p));
  }
  for (int t = 0; t < AMX_COLS; t++) {
    const block_q8_K& a = ((const block_q8_K*)(act + t * stride))[i];
    const __m512 da = _mm512_set1_ps(a.d);
    if constexpr (Q6) tot[t] = _mm512_sub_epi32(tot[t], offsets16(pairs, a));
    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(tot[t]), acc[t]);
    if constexpr (!Q6)
      acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, da), _mm512_cvtepi32_ps(mins16(pairs, a)), acc[t]);
  }
}

// tot += sc_j · C for sub-block j of super-block i, per column.
template <bool Q6, class PB>
inline void sub_block(const PB& p0, const PB& p1, int j, const CTile& c, __m512i* tot) {
  __m512i sc;
  if constexpr (Q6) sc = _mm512_cvtepi8_epi32(bytes16(p0.sc[j], p1.sc[j]));
  else sc = _mm512_cvtepu8_epi32(bytes16(p0.sc[j], p1.sc[j]));
  for (int t = 0; t < AMX_COLS; t++) tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(_mm512_load_si512(c[t]), sc));
}

// Q4_K / Q5_K: tot = Σ_j sc_j · Σ codes·a over 8 sub-blocks of 32. Q6_K: tot = Σ_g sc_g · Σ codes·a over 16
// groups of 16, less Σ_g sc_g · 32·Σa_g (a chunk's first 4 B rows are group 2p, the next 4 group 2p + 1).
template <class PB>
void tile_kquant(const PB* b0, const PB* b1, int64_t nb, const uint8_t* dec, const uint8_t* act, size_t stride,
                 float* out, size_t os) {
  constexpr bool Q6 = std::is_same_v<PB, pblock_q6_K>;
  constexpr int SUBS = Q6 ? 16 : 8, K = 256 / SUBS, PER = SUBS / FLIGHT;  // PER: batches per super-block
  __m512 acc[AMX_COLS];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512i tot[AMX_COLS];
  alignas(64) CTile c[2][FLIGHT];
  auto issue = [&](int64_t n) {  // batch n: sub-blocks [4 (n % PER), + 4) of super-block n / PER
    const int64_t i = n / PER;
    const int j0 = (int)(n % PER) * FLIGHT;
    const uint8_t *ap[FLIGHT], *bp[FLIGHT];
    for (int u = 0; u < FLIGHT; u++) {
      ap[u] = act + i * sizeof(block_q8_K) + offsetof(block_q8_K, qs) + K * (j0 + u);
      bp[u] = dec + i * 8 * CHUNK_B + (j0 + u) * (CHUNK_B * K / 32);
    }
    products<false>(ap, stride, bp, c[n & 1]);
  };
  issue(0);  // products of batch n + 1 in flight while batch n's are read (see tile_legacy)
  for (int64_t n = 0; n < nb * PER; n++) {
    if (n + 1 < nb * PER) issue(n + 1);
    const int64_t i = n / PER;
    if (n % PER == 0)
      for (auto& t : tot) t = _mm512_setzero_si512();
    for (int u = 0; u < FLIGHT; u++) sub_block<Q6>(b0[i], b1[i], (int)(n % PER) * FLIGHT + u, c[n & 1][u], tot);
    if (n % PER == PER - 1) kquant_finish(b0[i], b1[i], act, stride, i, tot, acc);
  }
  for (int t = 0; t < AMX_COLS; t++) _mm512_storeu_ps(out + t * os, acc[t]);
}

template <class PB>
void amx_typed(const PackedWeight& p, int64_t g0, int64_t g1, const uint8_t* act, size_t stride, int ncols,
               float* out, size_t os, void (*kernel)(const PB*, const PB*, int64_t, const uint8_t*, const uint8_t*,
                                                     size_t, float*, size_t)) {
  const int64_t n_chunks = p.n_in / 32, nb = (int64_t)(p.group_bytes / sizeof(PB));
  const size_t pair_bytes = (size_t)n_chunks * CHUNK_B;
  const int64_t panel = std::max<int64_t>(1, (int64_t)(PANEL_BYTES / pair_bytes));  // row pairs per panel
  thread_local std::unique_ptr<uint8_t, void (*)(void*)> buf{nullptr, std::free};
  thread_local size_t buf_bytes = 0;
  if (buf_bytes < panel * pair_bytes) {
    buf_bytes = panel * pair_bytes;
    buf.reset((uint8_t*)std::aligned_alloc(64, buf_bytes));
    if (!buf) throw std::bad_alloc();
  }
  for (int64_t q0 = g0; q0 < g1; q0 += 2 * panel) {
    const int64_t q1 = std::min(g1, q0 + 2 * panel);
    for (int64_t g = q0; g < q1; g += 2)
      decode_pair((const PB*)p.group(g), (const PB*)p.group(g + 1), n_chunks, buf.get() + (g - q0) / 2 * pair_bytes);
    for (int c0 = 0; c0 < ncols; c0 += AMX_COLS)
      for (int64_t g = q0; g < q1; g += 2)
        kernel((const PB*)p.group(g), (const PB*)p.group(g + 1), nb, buf.get() + (g - q0) / 2 * pair_bytes,
               act + c0 * stride, stride, out + c0 * os + 8 * (g - g0), os);
  }
}

bool os_grants_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif  // PS_AMX

}  // namespace

bool amx_usable() {
#if PS_AMX
  static const bool usable = [] {
    const char* v = std::getenv("PYSERVE_AMX");
    return !(v && std::string(v) == "0") && os_grants_amx();
  }();
  return usable;
#else
  return false;
#endif
}

bool amx_packs(GGMLType t) { return amx_usable() && packable(t); }

void amx_tile(const PackedWeight& p, int64_t g0, int64_t g1, const uint8_t* act, size_t act_stride, int ncols,
              float* out, size_t out_stride) {
#if PS_AMX
  load_config(p.type == GGMLType::Q6_K ? 16 : 32);
  switch (p.type) {
    case GGMLType::Q8_0: amx_typed<pblock_q8_0>(p, g0, g1, act, act_stride, ncols, out, out_stride, &tile_legacy<pblock_q8_0, true, 0>); break;
    case GGMLType::Q5_0: amx_typed<pblock_q5_0>(p, g0, g1, act, act_stride, ncols, out, out_stride, &tile_legacy<pblock_q5_0, false, 16>); break;
    case GGMLType::Q4_0: amx_typed<pblock_q4_0>(p, g0, g1, act, act_stride, ncols, out, out_stride, &tile_legacy<pblock_q4_0, false, 8>); break;
    case GGMLType::Q4_K: amx_typed<pblock_q4_K>(p, g0, g1, act, act_stride, ncols, out, out_stride, &tile_kquant<pblock_q4_K>); break;
    case GGMLType::Q5_K: amx_typed<pblock_q5_K>(p, g0, g1, act, act_stride, ncols, out, out_stride, &tile_kquant<pblock_q5_K>); break;
    case GGMLType::Q6_K: amx_typed<pblock_q6_K>(p, g0, g1, act, act_stride, ncols, out, out_stride, &tile_kquant<pblock_q6_K>); break;
    default: throw std::logic_error("amx_tile: no AMX kernel for this type");
  }
  _tile_release();
#else
  (void)p, (void)g0, (void)g1, (void)act, (void)act_stride, (void)ncols, (void)out, (void)out_stride;
  throw std::logic_error("amx_tile: no AMX kernels in this build");
#endif
}

uint64_t amx_peak_loop(int64_t reps) {
#if PS_AMX
  load_config(64);  // A tiles 16 × 64 bytes, B tiles 16 rows of 16 × 4 codes
  alignas(64) static thread_local int8_t a[AMX_COLS * 64], b[16 * AMX_ROWS * 4];
  alignas(64) static thread_local int32_t c[AMX_COLS * AMX_ROWS];
  std::memset(a, 1, sizeof(a)), std::memset(b, 1, sizeof(b));
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b, AMX_ROWS * 4);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < reps; i++) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 6);
    _tile_dpbssd(2, 4, 6);
    _tile_dpbssd(3, 4, 6);
  }
  _tile_stored(0, c, AMX_ROWS * 4);  // the products are kept
  _tile_release();
  return (uint64_t)reps * 4 * AMX_COLS * AMX_ROWS * 64;
#else
  (void)reps;
  return 0;
#endif
}

}  // namespace pyserve
