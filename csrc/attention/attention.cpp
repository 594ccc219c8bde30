#include "attention/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/ops.h"

namespace pyserve {

namespace {

// s[0, n) × scale, then soft-capped.
void scale_scores(const AttnHead& a, float* s, size_t n) {
  for (size_t i = 0; i < n; i++) s[i] *= a.scale;
  if (a.softcap > 0.f)
    for (size_t i = 0; i < n; i++) s[i] = a.softcap * std::tanh(s[i] / a.softcap);
}

// A query's first n keys of the tile t into its running state st (s: the scores' buffer): each head's max
// moves to cover them, the old denominator and sum are rescaled by exp(old max − new max), the keys'
// exp-weights added.
void online_tile(const AttnHead& a, const float* q, const KVTile& t, int n, std::vector<float>& s, OnlineState& st) {
  const int G = a.group;
  grow(s, (size_t)G * t.ntp);
  tile_scores(q, G, t, s.data());
  for (int h = 0; h < G; h++) {
    float* sh = &s[(size_t)h * t.ntp];
    scale_scores(a, sh, n);
    const float mx = std::max(st.m[h], max_of(sh, n));
    st.corr[h] = std::exp(st.m[h] - mx);  // 0 on the first tile without a sink (m = −inf)
    st.l[h] = st.l[h] * st.corr[h] + tile_exp_sum(sh, n, t.ntp, mx);
    st.m[h] = mx;
  }
  tile_accumulate(s.data(), G, n, t, st.corr.data(), st.acc.data());
}

// The running state of part p of a query before its first tile: max −inf, denominator 0, sum 0; part 0
// with the sinks, where the head has them.
void online_begin(const AttnHead& a, int p, OnlineState& st) {
  const int G = a.group;
  st.m.assign(G, -std::numeric_limits<float>::infinity());
  st.l.assign(G, 0.f);
  st.corr.resize(G);
  if (a.sinks && p == 0)  // a sink joins the max and the denominator (exp(sink − sink) = 1) and adds no value
    for (int h = 0; h < G; h++) st.m[h] = a.sinks[h], st.l[h] = 1.f;
  st.acc.assign((size_t)G * a.hd, 0.f);
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

int attn_split(int len, int lead, int tile) {
  const int first = std::min(lead, len), rest = (len - first + tile - 1) / tile;  // 1 + rest tiles
  return (int)std::min<int64_t>(len, first + (int64_t)(rest / 2) * tile);  // part 0: the first (rest + 2) / 2
}

void attend_part(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                 int lead, int tile, int p, AttnScratch& sc) {
  const int split = attn_split(len, lead, tile), end = p == 0 ? split : len;
  online_begin(a, p, sc.part[p]);
  for_tiles(len, lead, tile, [&](int j0, int n) {
    if ((j0 < split) != (p == 0)) return;
    load_tile(a, k, v, j0, n, end, tile, false, sc.tile);  // the rows asked for ahead: this part's
    online_tile(a, q, sc.tile, n, sc.s, sc.part[p]);
  });
}

void online_combine(const AttnHead& a, const OnlineState& s0, const OnlineState& s1, float* out) {
  const int hd = a.hd;
  for (int h = 0; h < a.group; h++) {
    const float mx = std::max(s0.m[h], s1.m[h]);
    const float c0 = std::exp(s0.m[h] - mx), c1 = std::exp(s1.m[h] - mx);  // c1 = 0 where s1 took no key
    const float inv = 1.0f / (s0.l[h] * c0 + s1.l[h] * c1);
    for (int i = 0; i < hd; i++) {
      const size_t at = (size_t)h * hd + i;
      out[at] = (s0.acc[at] * c0 + s1.acc[at] * c1) * inv;
    }
  }
}

void attend_online(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                   int lead, int tile, AttnScratch& sc, float* out) {
  attend_part(a, q, k, v, len, lead, tile, 0, sc);
  attend_part(a, q, k, v, len, lead, tile, 1, sc);
  online_combine(a, sc.part[0], sc.part[1], out);
}

// The online queries step through the tiles of the longest one, gathered once into sc[0].tile (widened to
// f32 where more than one query reads it); each takes a tile's keys up to its own length, so its tiles are
// attend_online's: [0, min(lead, len)), then `tile` keys at a time.
void attend_run(const AttnHead& a, const QueryRun& r, const uint8_t* const* k, const uint8_t* const* v, int lead,
                int tile, AttnScratch* sc) {
  int longest = 0, online = 0, split[kAttnQueryRun];
  for (int i = 0; i < r.n; i++) {
    if (r.len[i] <= kAttnFullRows) {
      attend_ref(a, r.q + i * r.q_stride, k, v, r.len[i], sc[i].s, r.out + i * r.out_stride);
      continue;
    }
    online_begin(a, 0, sc[i].part[0]);
    online_begin(a, 1, sc[i].part[1]);
    split[i] = attn_split(r.len[i], lead, tile);
    longest = std::max(longest, r.len[i]), online++;
  }
  KVTile& t = sc[0].tile;
  for_tiles(longest, lead, tile, [&](int j0, int n) {
    load_tile(a, k, v, j0, n, longest, tile, online > 1, t);
    for (int i = 0; i < r.n; i++)
      if (r.len[i] > kAttnFullRows && r.len[i] > j0) {
        online_tile(a, r.q + i * r.q_stride, t, std::min(n, r.len[i] - j0), sc[i].s, sc[i].part[j0 >= split[i]]);
        t.next_n = 0;  // the next tile's rows: asked for once, during the first query's scores
      }
  });
  for (int i = 0; i < r.n; i++)
    if (r.len[i] > kAttnFullRows) online_combine(a, sc[i].part[0], sc[i].part[1], r.out + i * r.out_stride);
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
