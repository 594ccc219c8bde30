#include "model/per_layer_embd.h"

#include <cmath>

#include "kernels/quant.h"

namespace pyserve {

void PerLayerEmbd::load(const HParams& hp, const WeightLoader& weight, const VecLoader& vec) {
  P_ = hp.n_embd_per_layer;
  L_ = hp.n_layer;
  E_ = hp.n_embd;
  eps_ = hp.eps;
  if (P_ == 0) return;
  const int64_t LP = (int64_t)L_ * P_;
  tok_ = weight("per_layer_token_embd.weight", LP, hp.n_vocab);
  model_proj_ = weight("per_layer_model_proj.weight", E_, LP);
  proj_norm_ = vec("per_layer_proj_norm.weight", P_);
  layers_.resize(L_);
  for (int il = 0; il < L_; il++) {
    const std::string p = "blk." + std::to_string(il) + ".";
    layers_[il].inp_gate = weight(p + "inp_gate.weight", E_, P_);
    layers_[il].proj = weight(p + "proj.weight", P_, E_);
    layers_[il].post_norm = vec(p + "post_norm.weight", E_);
  }
}

std::vector<Weight*> PerLayerEmbd::matrices() {
  std::vector<Weight*> ws;
  if (P_ == 0) return ws;
  ws.push_back(&model_proj_);
  for (Layer& l : layers_) {
    ws.push_back(&l.inp_gate);
    ws.push_back(&l.proj);
  }
  return ws;
}

void PerLayerEmbd::inputs(ThreadPool& pool, const int32_t* tokens, const float* x, int T, ActBuffer& act) {
  const int64_t LP = (int64_t)L_ * P_;
  grow(inp_, (size_t)T * LP);
  act_invalidate(act);
  matmul(pool, model_proj_, x, T, inp_.data(), act);
  const float proj_scale = 1.f / std::sqrt((float)E_), tok_scale = std::sqrt((float)P_);
  const float half = 1.f / std::sqrt(2.f);
  pool.parallel_for(T, [&](int64_t t) {
    thread_local std::vector<float> row;  // this token's per_layer_token_embd row
    row.resize(LP);
    dequantize_row(tok_.type, tok_.row(tokens[t]), row.data(), LP);
    float* in = &inp_[t * LP];
    for (int l = 0; l < L_; l++) {
      float* v = in + (int64_t)l * P_;
      for (int i = 0; i < P_; i++) v[i] *= proj_scale;
      rmsnorm(v, proj_norm_.data(), v, P_, eps_);
      for (int i = 0; i < P_; i++) v[i] = (v[i] + row[(int64_t)l * P_ + i] * tok_scale) * half;
    }
  }, INLINE_ROWS);
}

void PerLayerEmbd::apply(int il, ThreadPool& pool, float* x, int T, ActBuffer& act) {
  const Layer& L = layers_[il];
  const int64_t LP = (int64_t)L_ * P_;
  grow(g_, (size_t)T * P_);
  grow(y_, (size_t)T * E_);
  act_invalidate(act);
  matmul(pool, L.inp_gate, x, T, g_.data(), act);
  pool.parallel_for(T, [&](int64_t t) { gelu_mul(&g_[t * P_], &inp_[t * LP + (int64_t)il * P_], P_); }, INLINE_ROWS);
  act_invalidate(act);
  matmul(pool, L.proj, g_.data(), T, y_.data(), act);
  pool.parallel_for(T, [&](int64_t t) {
    float* y = &y_[t * E_];
    rmsnorm(y, L.post_norm.data(), y, E_, eps_);
    for (int i = 0; i < E_; i++) x[t * E_ + i] += y[i];
  }, INLINE_ROWS);
}

}  // namespace pyserve
