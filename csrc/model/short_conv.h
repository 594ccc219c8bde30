// short_conv: the gated short-convolution mixer of LFM2's conv layers (llama.cpp: src/models/lfm2.cpp
// build_shortconv_block; the layers whose attention.head_count_kv entry is 0).
//
//   [B | C | x] = W_in h           (shortconv.in_proj: [3·n_embd × n_embd], B's rows first, then C's, then x's)
//   y = C ⊙ causal depthwise conv of width l_cache over B ⊙ x   (shortconv.conv [n_embd × l_cache], no bias)
//   out = W_out y                  (shortconv.out_proj)
//
// The conv's state, the last l_cache - 1 values of B ⊙ x of a sequence, lives in its RecurrentStatePool slot
// (no matrix state), so prefix-cache checkpoints, n > 1 forks, aborts and preemption treat it as DeltaNet's.
#pragma once

#include <cstdint>
#include <vector>

#include "model/causal_conv.h"
#include "kernels/ops.h"
#include "kv/recurrent_state.h"
#include "base/threadpool.h"

namespace pyserve {

struct ShortConvParams {
  int l_cache = 0;         // conv taps (shortconv.l_cache), >= 2
  int n_embd = 0;          // channels: the model width
  std::vector<int> index;  // [n_layer]: the layer's index among the conv ones, -1 for attention (or empty)
  bool conv_layer(int il) const { return il < (int)index.size() && index[il] >= 0; }
  int n_conv() const;
  int64_t state_floats() const { return (int64_t)(l_cache - 1) * n_embd; }  // per layer and slot
};

struct ShortConvWeights {
  Weight in_proj;           // [3·n_embd × n_embd] (shortconv.in_proj): B, C then x rows
  Weight out_proj;          // [n_embd × n_embd] (shortconv.out_proj)
  std::vector<float> conv;  // [l_cache × n_embd] (shortconv.conv, tap-major: conv_taps_major), tap 0 the oldest
};

class ShortConv {
 public:
  // out[T × n_embd] = the mixer of h[T × n_embd]. Token t's sequence state is slot slots.state[t] of
  // `states`, conv layer cl: read and advanced (and copied into slots.snapshots[t] where given). A sequence's
  // tokens must be consecutive in the batch and in order.
  void forward(ThreadPool& pool, const ShortConvParams& p, const ShortConvWeights& w, const float* h, int64_t T,
               StateSlots slots, RecurrentStatePool& states, int cl, float* out, ActBuffer& act);

 private:
  SeqRuns runs_;
  std::vector<float> bcx_, bx_;  // [T × 3·n_embd] the projection, [T × n_embd] B ⊙ x, then C ⊙ conv
};

}  // namespace pyserve
