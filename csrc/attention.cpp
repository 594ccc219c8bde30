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

// One tile of n rows into the running state: each head's max moves to cover the tile, the old denominator
// and sum are rescaled by exp(old max − new max), the tile's exp-weights added.
void online_tile(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int n,
                 AttnScratch& sc) {
  const int G = a.group, hd = a.hd;
  grow(sc.s, (size_t)G * n);
  kv_scores(a.dtype, q, G, hd, k, n, sc.s.data(), v);
  scale_scores(a, sc.s.data(), (size_t)G * n);
  for (int h = 0; h < G; h++) {
    float* s = &sc.s[(size_t)h * n];
    const float mx = std::max(sc.m[h], max_of(s, n));
    sc.corr[h] = std::exp(sc.m[h] - mx);  // 0 on the first tile without a sink (m = −inf)
    sc.l[h] = sc.l[h] * sc.corr[h] + exp_shift_sum(s, n, mx);
    sc.m[h] = mx;
  }
  kv_weighted_sum(a.dtype, sc.s.data(), G, n, v, hd, sc.tile_out.data());
  for (int h = 0; h < G; h++)
    for (int i = 0; i < hd; i++) {
      float& acc = sc.acc[(size_t)h * hd + i];
      acc = acc * sc.corr[h] + sc.tile_out[(size_t)h * hd + i];
    }
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
  grow(sc.tile_out, (size_t)G * a.hd);
}

void online_end(const AttnHead& a, const AttnScratch& sc, float* out) {
  const int hd = a.hd;
  for (int h = 0; h < a.group; h++) {
    const float inv = 1.0f / sc.l[h];
    for (int i = 0; i < hd; i++) out[(size_t)h * hd + i] = sc.acc[(size_t)h * hd + i] * inv;
  }
}

}  // namespace

void attend_online(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                   int lead, int tile, AttnScratch& sc, float* out) {
  online_begin(a, sc);
  for (int j0 = 0, n = std::min(lead, len); j0 < len; j0 += n, n = std::min(tile, len - j0))
    online_tile(a, q, k + j0, v + j0, n, sc);
  online_end(a, sc, out);
}

// The online queries step through the tiles of the longest one; each takes a tile's rows up to its own
// length, so its tiles are attend_online's: [0, min(lead, len)), then `tile` rows at a time.
void attend_run(const AttnHead& a, const QueryRun& r, const uint8_t* const* k, const uint8_t* const* v, int lead,
                int tile, AttnScratch* sc) {
  int longest = 0;
  for (int i = 0; i < r.n; i++) {
    if (r.len[i] <= kAttnFullRows) attend_ref(a, r.q + i * r.q_stride, k, v, r.len[i], sc[i].s, r.out + i * r.out_stride);
    else online_begin(a, sc[i]), longest = std::max(longest, r.len[i]);
  }
  for (int j0 = 0, n = std::min(lead, longest); j0 < longest; j0 += n, n = std::min(tile, longest - j0))
    for (int i = 0; i < r.n; i++)
      if (r.len[i] > kAttnFullRows && r.len[i] > j0)
        online_tile(a, r.q + i * r.q_stride, k + j0, v + j0, std::min(n, r.len[i] - j0), sc[i]);
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
