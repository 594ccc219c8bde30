// moe: the mixture-of-experts feed-forward block. A router scores every expert for each token, the token
// runs its n_used best experts (SiLU-gated FFNs) and sums their outputs with the router's weights; shared
// experts, where the file has them, run for every token and add in.
//
// One step's tokens are grouped by expert, so each chosen expert's weights are read once per step
// whatever the batch (a prefill reads each expert at most once; a decode step reads only the experts its
// tokens chose: its memory traffic is the active parameters, not the total). Every product goes through
// the same row-tile kernels as the dense matmul, and a token's expert outputs are summed in the order of
// its selection, so a token's result does not depend on the batch it is in (batch invariance).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "base/threadpool.h"

namespace pyserve {

// How router logits become the chosen experts' weights (values: llama.cpp's expert_gating_func ids).
enum class Gating {
  Softmax = 1,        // softmax over all experts; the weights are the chosen ones' probabilities
  Sigmoid = 2,        // sigmoid per expert (GLM-4 MoE, DeepSeek-V3)
  SoftmaxWeight = 3,  // chosen by raw logit; the weights are a softmax over the chosen logits (gpt-oss)
};

struct MoeParams {
  int n_expert = 0;           // experts per MoE layer; 0 = a dense model
  int n_used = 0;             // experts each token runs
  int n_ff = 0;               // inner width of one expert
  int n_ff_shared = 0;        // inner width of the shared experts together; 0 = none
  int n_dense_lead = 0;       // leading layers that have a dense FFN instead
  Gating gating = Gating::Softmax;
  bool norm_weights = false;  // the chosen weights renormalised to sum to 1
  float weights_scale = 1.f;  // then multiplied by this
  bool oai_glu = false;       // the experts' activation: gpt-oss's clamped SwiGLU rather than SiLU(gate) · up
  bool gelu = false;          // ... GELU-tanh(gate) · up (gemma4)
  bool moe_layer(int il) const { return n_expert > 0 && il >= n_dense_lead; }
};

struct MoeWeights {
  Weight router;                       // [n_expert × n_embd]
  std::vector<float> router_bias;      // [n_expert] added to the router's logits (gpt-oss), or empty
  std::vector<float> select_bias;      // [n_expert] added to the scores for choosing only, or empty
  std::vector<float> gate_b, up_b, down_b;  // [n_expert × n_ff] ×2, [n_expert × n_embd] expert biases, or empty
  std::vector<Weight> gate, up, down;  // [n_expert] each: [n_ff × n_embd], [n_ff × n_embd], [n_embd × n_ff]
  Weight sh_gate, sh_up, sh_down;      // shared experts (n_ff_shared > 0): as one dense SiLU FFN
  std::vector<float> down_scale;       // [n_expert] expert e's output × down_scale[e] (gemma4), or empty
  // gemma4, whose experts run beside the layer's dense FFN: [n_embd] each, or empty
  std::vector<float> in_norm;          // pre_ffw_norm_2: the experts' input norm
  std::vector<float> router_scale;     // ffn_gate_inp.scale: the router reads rmsnorm(x) / sqrt(n_embd) × it
  std::vector<float> out_norm, dense_out_norm;  // post_ffw_norm_2, post_ffw_norm_1: the two outputs' norms
  std::vector<float> sh_gate_inp;      // [n_embd] the shared experts' output × sigmoid(this · h) (qwen35moe), or empty
};

// gpt-oss's expert activation: g = min(g, 7) · sigmoid(1.702 · min(g, 7)) · (clamp(u, −7, 7) + 1), n values in g.
void swiglu_oai(float* g, const float* u, int64_t n);

// One token's routing: from logits[n_expert] (and select_bias[n_expert] or null) the chosen experts
// ids[n_used] in order of their score (best first; ties to the lower id) and their weights w[n_used].
void route(const MoeParams& p, const float* logits, const float* select_bias, int32_t* ids, float* w);

class MoeFfn {
 public:
  // out[T × n_embd] = the MoE block of h[T × n_embd] (the FFN-normed residual); the router reads router_in
  // [T × n_embd] where given (gemma4), else h. Scratch is kept across calls.
  void forward(ThreadPool& pool, const MoeParams& p, const MoeWeights& w, const float* h, int64_t T,
               float* out, ActBuffer& act, const float* router_in = nullptr);

 private:
  void group_by_expert(const MoeParams& p, int64_t T);
  const uint8_t* gathered(ThreadPool& pool, ActFormat f, const float* h, int64_t T, int64_t n, int which);
  void run_experts(ThreadPool& pool, const MoeParams& p, const MoeWeights& w, const float* h, int64_t T);
  void combine(ThreadPool& pool, const MoeParams& p, const MoeWeights& w, int64_t T, int64_t E, float* out);
  void shared_gate(ThreadPool& pool, const MoeWeights& w, const float* h, int64_t T);
  // y[rows of expert e] += bias[e] (bias [n_expert × width], or empty: nothing).
  void add_expert_bias(ThreadPool& pool, const std::vector<float>& bias, float* y, int64_t width) const;

  std::vector<float> logits_;     // [T × n_expert] router logits
  std::vector<int32_t> ids_;      // [T × n_used] chosen experts
  std::vector<float> weights_;    // [T × n_used] their weights
  std::vector<int32_t> slot_row_; // [T × n_used] the row of slot (t, k) in the expert-sorted order
  std::vector<int32_t> row_tok_;  // [T × n_used] the token of each sorted row
  std::vector<int64_t> first_;    // [n_expert + 1] first sorted row of each expert
  std::vector<uint8_t> hq_[2], xq_[2];  // h quantized per token, then gathered per sorted row (per format)
  std::vector<uint8_t> gq_;       // the gated activations quantized for the down projections
  std::vector<float> g_, u_, y_;  // [rows × n_ff] ×2, [rows × n_embd]
  std::vector<float> sg_, su_, sy_;  // the shared experts': [T × n_ff_shared] ×2, [T × n_embd]
};

}  // namespace pyserve
