#include "attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops.h"

namespace pyserve {

namespace {

// s[0, n) × scale, then soft-capped.
void scale_scores(const AttnHead& a, float* s, size_t n) {
  for (size_t i = 0; i < n; i++) s[i] *= a.scale;
  if (a.softcap > 0.f)
    for (size_t i = 0; i < n; i++) s[i] = a.softcap * std::tanh(s[i] / a.softcap);
}

// A query's first n keys of the tile t into its running state: each head's max moves to cover them, the
// old denominator and sum are rescaled by exp(old max − new max), the keys' exp-weights added.
void online_tile(const AttnHead& a, const float* q, const KVTile& t, int n, AttnScratch& sc) {
  const int G = a.group;
  grow(sc.s, (size_t)G * t.ntp);
  tile_scores(q, G, t, sc.s.data());
  for (int h = 0; h < G; h++) {
    float* s = &sc.s[(size_t)h * t.ntp];
    scale_scores(a, s, n);
    const float mx = std::max(sc.m[h], max_of(s, n));
    sc.corr[h] = std::exp(sc.m[h] - mx);  // 0 on the first tile without a sink (m = −inf)
    sc.l[h] = sc.l[h] * sc.corr[h] + tile_exp_sum(s, n, t.ntp, mx);
    sc.m[h] = mx;
  }
  tile_accumulate(sc.s.data(), G, n, t, sc.corr.data(), sc.acc.data());
}

// The running state of one query before its first tile: max −inf (or the sinks), denominator 0, sum 0.
void online_begin(const AttnHead& a, AttnScratch& sc) {
  const int G = a.group;
  sc.m.assign(G, -std::numeric_limits<float>::infinity());
  sc.l.assign(G, 0.f);
  sc.corr.resize(G);
  if (a.sinks)  // a sink joins the max and the denominator (exp(sink − sink) = 1) and adds no value
    for (int h = 0; h < G; h++) sc.m[h] = a.sinks[h], sc.l[h] = 1.f;
  sc.acc.assign((size_t)G * a.hd, 0.f);
}

void online_end(const AttnHead& a, const AttnScratch& sc, float* out) {
  const int hd = a.hd;
  for (int h = 0; h < a.group; h++) {
    const float inv = 1.0f / sc.l[h];
    for (int i = 0; i < hd; i++) out[(size_t)h * hd + i] = sc.acc[(size_t)h * hd + i] * inv;
  }
}

// f(j0, n) for the tiles of len keys: [0, min(lead, len)), then `tile` keys at a time.
template <class F>
void for_tiles(int len, int lead, int tile, F&& f) {
  for (int j0 = 0, n = std::min(lead, len); j0 < len; j0 += n, n = std::min(tile, len - j0)) f(j0, n);
}

// tile ← keys [j0, j0 + n) (widened when `widen`), with the `ahead` keys after them (up to len) to bring
// toward the cache while it computes.
void load_tile(const AttnHead& a, const uint8_t* const* k, const uint8_t* const* v, int j0, int n, int len,
               int ahead, bool widen, KVTile& t) {
  tile_rows(a.dtype, k + j0, v + j0, n, a.hd, widen, t);
  t.next_k = k + j0 + n, t.next_v = v + j0 + n;
  t.next_n = std::max(0, std::min(ahead, len - j0 - n));
}

}  // namespace

void attend_online(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                   int lead, int tile, AttnScratch& sc, float* out) {
  online_begin(a, sc);
  for_tiles(len, lead, tile, [&](int j0, int n) {
    load_tile(a, k, v, j0, n, len, tile, false, sc.tile);
    online_tile(a, q, sc.tile, n, sc);
  });
  online_end(a, sc, out);
}

// The online queries step through the tiles of the longest one, gathered once into sc[0].tile (widened to
// f32 where more than one query reads it); each takes a tile's keys up to its own length, so its tiles are
// attend_online's: [0, min(lead, len)), then `tile` keys at a time.
void attend_run(const AttnHead& a, const QueryRun& r, const uint8_t* const* k, const uint8_t* const* v, int lead,
                int tile, AttnScratch* sc) {
  int longest = 0, online = 0;
  for (int i = 0; i < r.n; i++) {
    if (r.len[i] <= kAttnFullRows) attend_ref(a, r.q + i * r.q_stride, k, v, r.len[i], sc[i].s, r.out + i * r.out_stride);
    else online_begin(a, sc[i]), longest = std::max(longest, r.len[i]), online++;
  }
  KVTile& t = sc[0].tile;
  for_tiles(longest, lead, tile, [&](int j0, int n) {
    load_tile(a, k, v, j0, n, longest, tile, online > 1, t);
    for (int i = 0; i < r.n; i++)
      if (r.len[i] > kAttnFullRows && r.len[i] > j0) {
        online_tile(a, r.q + i * r.q_stride, t, std::min(n, r.len[i] - j0), sc[i]);
        t.next_n = 0;  // the next tile's rows: asked for once, during the first query's scores
      }
  });
  for (int i = 0; i < r.n; i++)
    if (r.len[i] > kAttnFullRows) online_end(a, sc[i], r.out + i * r.out_stride);
}

void attend_ref(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                std::vector<float>& sc, float* out) {
  const int G = a.group;
  grow(sc, (size_t)len * G);
  kv_scores(a.dtype, q, G, a.hd, k, len, sc.data(), v);
  scale_scores(a, sc.data(), (size_t)len * G);
  float inv[64];  // 1 / softmax denominator per head of the group
  for (int h = 0; h < G; h++) {
    float* s = &sc[(size_t)h * len];
    float mx = max_of(s, len);
    if (a.sinks) mx = std::max(mx, a.sinks[h]);
    inv[h] = 1.0f / (exp_shift_sum(s, len, mx) + (a.sinks ? std::exp(a.sinks[h] - mx) : 0.f));
  }
  for (int h = 0; h < G; h++)
    for (int j = 0; j < len; j++) sc[(size_t)h * len + j] *= inv[h];
  kv_weighted_sum(a.dtype, sc.data(), G, len, v, a.hd, out);
}

void attend(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len, int lead,
            int tile, AttnScratch& sc, float* out) {
  if (len <= kAttnFullRows) return attend_ref(a, q, k, v, len, sc.s, out);
  attend_online(a, q, k, v, len, lead, tile, sc, out);
}

}  // namespace pyserve
