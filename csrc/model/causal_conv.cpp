#include "model/causal_conv.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pyserve {

void SeqRuns::split(const std::vector<int32_t>& slots, int64_t T) {
  first.clear();
  slot.clear();
  for (int64_t t = 0; t < T; t++)
    if (t == 0 || slots[t] != slots[t - 1]) first.push_back(t), slot.push_back(slots[t]);
  first.push_back(T);
}

std::vector<float> conv_taps_major(const std::vector<float>& w, int64_t C, int64_t K) {
  std::vector<float> wt(w.size());
  for (int64_t c = 0; c < C; c++)
    for (int64_t k = 0; k < K; k++) wt[k * C + c] = w[c * K + k];
  return wt;
}

namespace {

constexpr int64_t CHANNELS = 1024;  // channels per work item: a token's slice of x is one long contiguous read

// One run's channels [c0, c0 + n): per token, acc = x·w[K-1] + Σ_k state[k]·w[k] over the channels side by
// side (each channel's sum in that order); the state shifted one place and x appended; the state copied into
// the token's snapshot slot where it has one. wt [K × C]: the taps, tap-major.
void conv_channels(float* x, int64_t C, int64_t K, const float* wt, int64_t c0, int64_t n, int64_t t0,
                   int64_t t1, float* st, RecurrentStatePool& states, int layer, bool silu,
                   const std::vector<int32_t>& snaps) {
  float acc[CHANNELS];
  for (int64_t t = t0; t < t1; t++) {
    float* xi = &x[t * C + c0];
    for (int64_t j = 0; j < n; j++) acc[j] = xi[j] * wt[(K - 1) * C + c0 + j];
    for (int64_t k = 0; k < K - 1; k++)
      for (int64_t j = 0; j < n; j++) acc[j] += st[k * C + c0 + j] * wt[k * C + c0 + j];
    for (int64_t k = 0; k + 1 < K - 1; k++) std::memcpy(&st[k * C + c0], &st[(k + 1) * C + c0], n * sizeof(float));
    if (K > 1) std::memcpy(&st[(K - 2) * C + c0], xi, n * sizeof(float));
    std::memcpy(xi, acc, n * sizeof(float));
    if (silu) silu_inplace(xi, n);
    if (!snaps.empty() && snaps[t] >= 0) {
      float* snap = states.conv(snaps[t], layer);
      for (int64_t k = 0; k < K - 1; k++) std::memcpy(&snap[k * C + c0], &st[k * C + c0], n * sizeof(float));
    }
  }
}

}  // namespace

// Per (run, block of CHANNELS channels): the block's tokens in order.
void causal_conv(ThreadPool& pool, float* x, int64_t C, int64_t K, const float* wt, const SeqRuns& runs,
                 RecurrentStatePool& states, int layer, bool silu, const std::vector<int32_t>& snaps) {
  const int64_t n_blocks = (C + CHANNELS - 1) / CHANNELS;
  pool.parallel_for(runs.size() * n_blocks, [&](int64_t item) {
    const int64_t r = item / n_blocks, c0 = item % n_blocks * CHANNELS, n = std::min(CHANNELS, C - c0);
    conv_channels(x, C, K, wt, c0, n, runs.first[r], runs.first[r + 1], states.conv(runs.slot[r], layer),
                  states, layer, silu, snaps);
  });
}

}  // namespace pyserve
