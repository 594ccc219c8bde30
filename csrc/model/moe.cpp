#include "model/moe.h"

#include <algorithm>
#include <cmath>

namespace pyserve {

namespace {

// The n_used best of scores[n] into ids, best first, ties to the lower id (a partial selection sort: n_used
// is small).
void top_k(const float* scores, int n, int n_used, int32_t* ids) {
  for (int k = 0; k < n_used; k++) {
    int best = -1;
    for (int e = 0; e < n; e++) {
      if (std::find(ids, ids + k, e) != ids + k) continue;
      if (best < 0 || scores[e] > scores[best]) best = e;
    }
    ids[k] = best;
  }
}

void softmax(const float* x, int n, float* y) {
  const float mx = *std::max_element(x, x + n);
  float sum = 0.f;
  for (int i = 0; i < n; i++) sum += (y[i] = std::exp(x[i] - mx));
  for (int i = 0; i < n; i++) y[i] /= sum;
}

}  // namespace

void swiglu_oai(float* g, const float* u, int64_t n) {
  constexpr float alpha = 1.702f, limit = 7.0f;  // gpt-oss's constants (ggml_swiglu_oai)
  for (int64_t i = 0; i < n; i++) {
    const float x = std::min(g[i], limit), y = std::max(std::min(u[i], limit), -limit);
    g[i] = x / (1.f + std::exp(-alpha * x)) * (y + 1.f);
  }
}

void MoeFfn::add_expert_bias(ThreadPool& pool, const std::vector<float>& bias, float* y, int64_t width) const {
  if (bias.empty()) return;
  pool.parallel_for((int64_t)first_.size() - 1, [&](int64_t e) {
    for (int64_t r = first_[e]; r < first_[e + 1]; r++)
      for (int64_t i = 0; i < width; i++) y[r * width + i] += bias[e * width + i];
  }, INLINE_ROWS);
}

void route(const MoeParams& p, const float* logits, const float* select_bias, int32_t* ids, float* w) {
  const int n = p.n_expert, k = p.n_used;
  thread_local std::vector<float> prob, score;  // [n_expert]: no allocation per token
  prob.resize(n);
  score.resize(n);
  if (p.gating == Gating::Softmax) softmax(logits, n, prob.data());
  else if (p.gating == Gating::Sigmoid)
    for (int e = 0; e < n; e++) prob[e] = 1.f / (1.f + std::exp(-logits[e]));
  else std::copy(logits, logits + n, prob.begin());
  for (int e = 0; e < n; e++) score[e] = prob[e] + (select_bias ? select_bias[e] : 0.f);
  top_k(score.data(), n, k, ids);
  for (int i = 0; i < k; i++) w[i] = prob[ids[i]];
  if (p.gating == Gating::SoftmaxWeight) softmax(w, k, w);
  if (p.norm_weights) {
    float sum = 0.f;
    for (int i = 0; i < k; i++) sum += w[i];
    for (int i = 0; i < k; i++) w[i] /= sum;
  }
  for (int i = 0; i < k; i++) w[i] *= p.weights_scale;
}

// Sorts the T · n_used (token, slot) pairs by expert (a counting sort, tokens in order within an expert).
void MoeFfn::group_by_expert(const MoeParams& p, int64_t T) {
  const int64_t S = T * p.n_used;
  first_.assign(p.n_expert + 1, 0);
  for (int64_t s = 0; s < S; s++) first_[ids_[s] + 1]++;
  for (int e = 0; e < p.n_expert; e++) first_[e + 1] += first_[e];
  std::vector<int64_t> next(first_.begin(), first_.end() - 1);
  slot_row_.resize(S);
  row_tok_.resize(S);
  for (int64_t s = 0; s < S; s++) {
    const int64_t r = next[ids_[s]]++;
    slot_row_[s] = (int32_t)r;
    row_tok_[r] = (int32_t)(s / p.n_used);
  }
}

// h[T × n] quantized once per token into format f, then copied to every sorted row that token has.
const uint8_t* MoeFfn::gathered(ThreadPool& pool, ActFormat f, const float* h, int64_t T, int64_t n, int which) {
  const size_t stride = act_row_size(f, n);
  const int64_t rows = (int64_t)row_tok_.size();
  hq_[which].resize(stride * T);
  xq_[which].resize(stride * rows);
  quantize_rows(pool, f, h, T, n, hq_[which].data());
  for (int64_t r = 0; r < rows; r++)
    std::copy_n(hq_[which].data() + row_tok_[r] * stride, stride, xq_[which].data() + r * stride);
  return xq_[which].data();
}

// gate and up of every chosen expert over its rows, SiLU(gate) · up, then down: y_[rows × n_embd].
void MoeFfn::run_experts(ThreadPool& pool, const MoeParams& p, const MoeWeights& w, const float* h, int64_t T) {
  const int64_t rows = (int64_t)row_tok_.size(), F = p.n_ff, E = w.router.n_in;
  grow(g_, rows * F);
  grow(u_, rows * F);
  grow(y_, rows * E);
  const ActFormat fg = type_traits((uint32_t)w.gate[0].type)->act, fu = type_traits((uint32_t)w.up[0].type)->act;
  const uint8_t* xg = gathered(pool, fg, h, T, E, 0);
  const uint8_t* xu = fu == fg ? xg : gathered(pool, fu, h, T, E, 1);
  const size_t sg = act_row_size(fg, E), su = act_row_size(fu, E);
  std::vector<MatmulJob> jobs;
  for (int e = 0; e < p.n_expert; e++) {
    const int64_t r0 = first_[e], n = first_[e + 1] - r0;
    if (n == 0) continue;
    jobs.push_back({&w.gate[e], xg + r0 * sg, sg, n, &g_[r0 * F]});
    jobs.push_back({&w.up[e], xu + r0 * su, su, n, &u_[r0 * F]});
  }
  matmul_jobs(pool, jobs);
  add_expert_bias(pool, w.gate_b, g_.data(), F);
  add_expert_bias(pool, w.up_b, u_.data(), F);
  pool.parallel_for(rows, [&](int64_t r) {
    if (p.oai_glu) swiglu_oai(&g_[r * F], &u_[r * F], F);
    else if (p.gelu) gelu_mul(&g_[r * F], &u_[r * F], F);
    else silu_mul(&g_[r * F], &u_[r * F], F);
  }, INLINE_ROWS);
  const ActFormat fd = type_traits((uint32_t)w.down[0].type)->act;
  const size_t sd = act_row_size(fd, F);
  gq_.resize(sd * rows);
  quantize_rows(pool, fd, g_.data(), rows, F, gq_.data());
  jobs.clear();
  for (int e = 0; e < p.n_expert; e++) {
    const int64_t r0 = first_[e], n = first_[e + 1] - r0;
    if (n > 0) jobs.push_back({&w.down[e], gq_.data() + r0 * sd, sd, n, &y_[r0 * E]});
  }
  matmul_jobs(pool, jobs);
  add_expert_bias(pool, w.down_b, y_.data(), E);
}

// out[t] = Σ_k w[t, k] · y[row of (t, k)] in selection order (+ the shared experts' output).
void MoeFfn::combine(ThreadPool& pool, const MoeParams& p, const MoeWeights& w, int64_t T, int64_t E, float* out) {
  const int K = p.n_used;
  pool.parallel_for(T, [&](int64_t t) {
    float* o = out + t * E;
    std::fill(o, o + E, 0.f);
    for (int k = 0; k < K; k++) {
      const float wk = weights_[t * K + k] * (w.down_scale.empty() ? 1.f : w.down_scale[ids_[t * K + k]]);
      const float* y = &y_[(int64_t)slot_row_[t * K + k] * E];
      for (int64_t i = 0; i < E; i++) o[i] += wk * y[i];
    }
    if (p.n_ff_shared > 0)
      for (int64_t i = 0; i < E; i++) o[i] += sy_[t * E + i];
  }, INLINE_ROWS);
}

// sy_[t] ×= sigmoid(sh_gate_inp · h[t]) (a float dot: the gate is a vector, never quantized).
void MoeFfn::shared_gate(ThreadPool& pool, const MoeWeights& w, const float* h, int64_t T) {
  const int64_t E = w.router.n_in;
  pool.parallel_for(T, [&](int64_t t) {
    float z = 0.f;
    for (int64_t i = 0; i < E; i++) z += w.sh_gate_inp[i] * h[t * E + i];
    const float g = 1.0f / (1.0f + std::exp(-z));
    for (int64_t i = 0; i < E; i++) sy_[t * E + i] *= g;
  }, INLINE_ROWS);
}

void MoeFfn::forward(ThreadPool& pool, const MoeParams& p, const MoeWeights& w, const float* h, int64_t T,
                     float* out, ActBuffer& act, const float* router_in) {
  const int64_t E = w.router.n_in, K = p.n_used;
  grow(logits_, T * p.n_expert);
  act_invalidate(act);
  matmul(pool, w.router, router_in ? router_in : h, T, logits_.data(), act);
  if (!w.router_bias.empty())
    for (int64_t t = 0; t < T; t++)
      for (int e = 0; e < p.n_expert; e++) logits_[t * p.n_expert + e] += w.router_bias[e];
  ids_.resize(T * K);
  weights_.resize(T * K);
  const float* bias = w.select_bias.empty() ? nullptr : w.select_bias.data();
  pool.parallel_for(T, [&](int64_t t) {
    route(p, &logits_[t * p.n_expert], bias, &ids_[t * K], &weights_[t * K]);
  }, INLINE_ROWS);
  group_by_expert(p, T);
  run_experts(pool, p, w, h, T);
  if (p.n_ff_shared > 0) {
    const int64_t F = p.n_ff_shared;
    grow(sg_, T * F);
    grow(su_, T * F);
    grow(sy_, T * E);
    matmul_group(pool, {{&w.sh_gate, sg_.data()}, {&w.sh_up, su_.data()}}, h, T, act);
    pool.parallel_for(T, [&](int64_t t) { silu_mul(&sg_[t * F], &su_[t * F], F); }, INLINE_ROWS);
    act_invalidate(act);
    matmul(pool, w.sh_down, sg_.data(), T, sy_.data(), act);
    if (!w.sh_gate_inp.empty()) shared_gate(pool, w, h, T);
  }
  combine(pool, p, w, T, E, out);
}

}  // namespace pyserve
