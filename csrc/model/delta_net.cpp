#include "model/delta_net.h"

#include <cmath>

#include "kernels/delta_rule.h"

namespace pyserve {

int DeltaNetParams::n_recurrent() const {
  int n = 0;
  for (int i : index) n += i >= 0;
  return n;
}

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // ggml's threshold

void l2_norm(float* x, int n, float eps) {
  float ss = 0.f;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  const float s = 1.0f / std::sqrt(ss + eps);
  for (int i = 0; i < n; i++) x[i] *= s;
}

}  // namespace

void DeltaNet::forward(ThreadPool& pool, const DeltaNetParams& p, const DeltaNetWeights& w, float eps, const float* h,
                       int64_t T, StateSlots slots, RecurrentStatePool& states, int rl, float* out, ActBuffer& act) {
  grow(qkv_, (size_t)T * p.conv_dim());
  grow(z_, (size_t)T * p.value_dim());
  grow(beta_, (size_t)T * p.n_v_heads);
  grow(g_, (size_t)T * p.n_v_heads);
  grow(o_, (size_t)T * p.value_dim());
  runs_.split(slots.state, T);
  act_invalidate(act);
  matmul_group(pool, {{&w.qkv, qkv_.data()}, {&w.gate, z_.data()}, {&w.beta, beta_.data()}, {&w.alpha, g_.data()}},
               h, T, act);
  causal_conv(pool, qkv_.data(), p.conv_dim(), p.d_conv, w.conv.data(), runs_, states, rl, true, slots.snapshots);  // then SiLU
  prepare(pool, p, w, eps, T);
  recur(pool, p, states, rl, slots.snapshots);
  gated_norm(pool, p, w, eps, T);
  act_invalidate(act);
  matmul(pool, w.out, z_.data(), T, out, act);
}

// Per token: q and k L2-normed per head, beta = sigmoid, decay = exp(g), g = softplus(alpha + dt) · a.
void DeltaNet::prepare(ThreadPool& pool, const DeltaNetParams& p, const DeltaNetWeights& w, float eps, int64_t T) {
  const int64_t C = p.conv_dim();
  pool.parallel_for(T, [&](int64_t t) {
    float* x = &qkv_[t * C];
    for (int hd = 0; hd < 2 * p.n_k_heads; hd++) l2_norm(x + (int64_t)hd * p.head_k, p.head_k, eps);
    for (int hv = 0; hv < p.n_v_heads; hv++) {
      float& b = beta_[t * p.n_v_heads + hv];
      float& g = g_[t * p.n_v_heads + hv];
      b = sigmoid(b);
      g = std::exp(softplus(g + w.dt[hv]) * w.a[hv]);  // the decay exp(g) the recurrence multiplies by
    }
  }, INLINE_ROWS);
}

// The delta rule over each (run, value head): delta_rule's kernel, the head's M after a token copied into
// that token's snapshot slot where it has one.
void DeltaNet::recur(ThreadPool& pool, const DeltaNetParams& p, RecurrentStatePool& states, int rl,
                     const std::vector<int32_t>& snaps) {
  const int64_t C = p.conv_dim(), Hv = p.n_v_heads, Sk = p.head_k, Sv = p.head_v, n_runs = runs_.size();
  const float scale = 1.0f / std::sqrt((float)Sk);
  pool.parallel_for(n_runs * Hv, [&](int64_t item) {
    const int64_t r = item / Hv, hv = item % Hv, hk = hv % p.n_k_heads, t0 = runs_.first[r];
    const int64_t n = runs_.first[r + 1] - t0;
    thread_local std::vector<float*> snap;
    if (!snaps.empty()) {
      snap.assign((size_t)n, nullptr);
      for (int64_t t = 0; t < n; t++)
        if (snaps[t0 + t] >= 0) snap[t] = states.mat(snaps[t0 + t], rl) + hv * Sv * Sk;
    }
    const float* x = &qkv_[t0 * C];
    const DeltaRuleRun run{x + hk * Sk, x + p.key_dim() + hk * Sk, x + 2 * p.key_dim() + hv * Sv, C,
                           &g_[t0 * Hv + hv], &beta_[t0 * Hv + hv], Hv, &o_[t0 * p.value_dim() + hv * Sv],
                           p.value_dim(), snaps.empty() ? nullptr : snap.data()};
    delta_rule(run, n, (int)Sk, (int)Sv, scale, states.mat(runs_.slot[r], rl) + hv * Sv * Sk);
  });
}

// z ← RMSnorm(o) per value head (ssm_norm) · SiLU(z): the output projection's input.
void DeltaNet::gated_norm(ThreadPool& pool, const DeltaNetParams& p, const DeltaNetWeights& w, float eps, int64_t T) {
  const int64_t Sv = p.head_v;
  pool.parallel_for(T, [&](int64_t t) {
    for (int hv = 0; hv < p.n_v_heads; hv++) {
      float* o = &o_[t * p.value_dim() + hv * Sv];
      float* z = &z_[t * p.value_dim() + hv * Sv];
      rmsnorm(o, w.norm.data(), o, Sv, eps);
      silu_mul(z, o, Sv);
    }
  }, INLINE_ROWS);
}

}  // namespace pyserve
