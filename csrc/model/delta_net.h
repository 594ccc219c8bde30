// delta_net: the Gated DeltaNet linear-attention mixer of Qwen3.5's recurrent layers (llama.cpp:
// src/models/qwen35.cpp build_layer_attn_linear, delta-net-base.cpp).
//
//   qkv = W_qkv h [conv_dim], z = W_gate h [value_dim], beta = sigmoid(W_beta h), g = softplus(W_alpha h + dt) · a
//   qkv ← SiLU(causal depthwise conv of width d_conv over the sequence's qkv; state: its last d_conv - 1 inputs)
//   q, k [n_k_heads × head_k] L2-normed (x / sqrt(Σx² + eps)); value head h reads key head h % n_k_heads
//   per value head, M [head_v × head_k] (stored transposed): M ← M·exp(g); d = beta·(v − M k); M ← M + d kᵀ; o = M q / sqrt(head_k)
//   out = W_out (RMSnorm_head(o) · SiLU(z))
//
// Both the conv's and the matrix state live in a RecurrentStatePool slot per sequence. The projections run
// batched over the step's tokens; the recurrence is delta_rule's per-token kernel (not the chunkwise-parallel
// form: docs/BENCHMARKS.md measures why), in parallel over (sequence, value head) pairs. A token's result depends
// only on its sequence's earlier tokens: batch-invariant, and a prompt cut into chunks gives the same bits —
// and the state copied after a step's j-th token of a sequence is the bits a step ending there leaves.
#pragma once

#include <cstdint>
#include <vector>

#include "model/causal_conv.h"
#include "kernels/ops.h"
#include "kv/recurrent_state.h"
#include "base/threadpool.h"

namespace pyserve {

struct DeltaNetParams {
  int d_conv = 0;          // conv taps (ssm.conv_kernel)
  int n_k_heads = 0;       // query/key heads (ssm.group_count)
  int n_v_heads = 0;       // value heads (ssm.time_step_rank), a multiple of n_k_heads
  int head_k = 0;          // query/key width per head (ssm.state_size)
  int head_v = 0;          // value width per head (ssm.inner_size / n_v_heads)
  std::vector<int> index;  // [n_layer]: the layer's index among the recurrent ones, -1 for full attention
  bool recurrent(int il) const { return il < (int)index.size() && index[il] >= 0; }
  int n_recurrent() const;
  int64_t key_dim() const { return (int64_t)n_k_heads * head_k; }
  int64_t value_dim() const { return (int64_t)n_v_heads * head_v; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t conv_floats() const { return (int64_t)(d_conv - 1) * conv_dim(); }          // per layer and slot
  int64_t mat_floats() const { return (int64_t)n_v_heads * head_v * head_k; }       // per layer and slot
};

struct DeltaNetWeights {
  Weight qkv;                  // [conv_dim × n_embd] (attn_qkv): q, k then v rows
  Weight gate;                 // [value_dim × n_embd] (attn_gate): z
  Weight beta, alpha;          // [n_v_heads × n_embd] (ssm_beta, ssm_alpha)
  Weight out;                  // [n_embd × value_dim] (ssm_out)
  std::vector<float> conv;     // [d_conv × conv_dim] (ssm_conv1d, tap-major: conv_taps_major), tap 0 the oldest
  std::vector<float> dt, a;    // [n_v_heads] (ssm_dt.bias; ssm_a = −exp(A_log))
  std::vector<float> norm;     // [head_v] (ssm_norm)
};

class DeltaNet {
 public:
  // out[T × n_embd] = the mixer of h[T × n_embd]. Token t's sequence state is slot slots.state[t] of
  // `states`, recurrent layer rl: read and advanced (and copied into slots.snapshots[t] where given). A
  // sequence's tokens must be consecutive in the batch and in order.
  void forward(ThreadPool& pool, const DeltaNetParams& p, const DeltaNetWeights& w, float eps, const float* h,
               int64_t T, StateSlots slots, RecurrentStatePool& states, int rl, float* out, ActBuffer& act);

 private:
  void prepare(ThreadPool& pool, const DeltaNetParams& p, const DeltaNetWeights& w, float eps, int64_t T);
  void recur(ThreadPool& pool, const DeltaNetParams& p, RecurrentStatePool& states, int rl,
             const std::vector<int32_t>& snaps);
  void gated_norm(ThreadPool& pool, const DeltaNetParams& p, const DeltaNetWeights& w, float eps, int64_t T);

  SeqRuns runs_;                      // the step's tokens by sequence
  std::vector<float> qkv_, z_, beta_, g_, o_;  // [T × conv_dim], [T × value_dim], [T × n_v_heads] ×2 (beta, exp(g)), [T × value_dim]
};

}  // namespace pyserve
