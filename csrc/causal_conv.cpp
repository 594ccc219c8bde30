#include "causal_conv.h"

#include <cmath>

namespace pyserve {

void SeqRuns::split(const std::vector<int32_t>& slots, int64_t T) {
  first.clear();
  slot.clear();
  for (int64_t t = 0; t < T; t++)
    if (t == 0 || slots[t] != slots[t - 1]) first.push_back(t), slot.push_back(slots[t]);
  first.push_back(T);
}

// Per (run, channel): acc = Σ_k state[k]·w[k] + x·w[K-1]; the state shifted one place and x appended.
void causal_conv(ThreadPool& pool, float* x, int64_t C, int64_t K, const float* w, const SeqRuns& runs,
                 RecurrentStatePool& states, int layer, bool silu, const std::vector<int32_t>& snaps) {
  pool.parallel_for(runs.size() * C, [&](int64_t item) {
    const int64_t r = item / C, c = item % C;
    float* st = states.conv(runs.slot[r], layer);  // [K - 1][C]
    const float* wc = &w[c * K];
    for (int64_t t = runs.first[r]; t < runs.first[r + 1]; t++) {
      float* xi = &x[t * C + c];
      float acc = *xi * wc[K - 1];
      for (int64_t k = 0; k < K - 1; k++) acc += st[k * C + c] * wc[k];
      for (int64_t k = 0; k + 1 < K - 1; k++) st[k * C + c] = st[(k + 1) * C + c];
      if (K > 1) st[(K - 2) * C + c] = *xi;
      *xi = silu ? acc / (1.0f + std::exp(-acc)) : acc;
      if (!snaps.empty() && snaps[t] >= 0) {
        float* snap = states.conv(snaps[t], layer);
        for (int64_t k = 0; k < K - 1; k++) snap[k * C + c] = st[k * C + c];
      }
    }
  }, INLINE_ROWS);
}

}  // namespace pyserve
