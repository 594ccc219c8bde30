#include "model/short_conv.h"

namespace pyserve {

int ShortConvParams::n_conv() const {
  int n = 0;
  for (int i : index) n += i >= 0;
  return n;
}

void ShortConv::forward(ThreadPool& pool, const ShortConvParams& p, const ShortConvWeights& w, const float* h,
                        int64_t T, StateSlots slots, RecurrentStatePool& states, int cl, float* out,
                        ActBuffer& act) {
  const int64_t E = p.n_embd;
  grow(bcx_, (size_t)T * 3 * E);
  grow(bx_, (size_t)T * E);
  runs_.split(slots.state, T);
  act_invalidate(act);
  matmul(pool, w.in_proj, h, T, bcx_.data(), act);
  pool.parallel_for(T, [&](int64_t t) {
    const float* b = &bcx_[t * 3 * E];
    for (int64_t i = 0; i < E; i++) bx_[t * E + i] = b[i] * b[2 * E + i];
  }, INLINE_ROWS);
  causal_conv(pool, bx_.data(), E, p.l_cache, w.conv.data(), runs_, states, cl, false, slots.snapshots);
  pool.parallel_for(T, [&](int64_t t) {
    const float* c = &bcx_[t * 3 * E + E];
    for (int64_t i = 0; i < E; i++) bx_[t * E + i] *= c[i];
  }, INLINE_ROWS);
  act_invalidate(act);
  matmul(pool, w.out_proj, bx_.data(), T, out, act);
}

}  // namespace pyserve
