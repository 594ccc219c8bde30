#include "kernels/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/simd.h"

namespace pyserve {

namespace {

// A panel of M: value rows [jv, jv + width) of the head, stored [head_k][width] at P.
struct Panel {
  float* P;
  int64_t offset;  // P's offset in M (a snapshot's panel is at snap[t] + offset)
  int width, jv;
};

// The panel of M that starts at value row jv.
Panel panel_at(float* M, int head_k, int head_v, int jv) {
  const int64_t offset = (int64_t)jv * head_k;
  return Panel{M + offset, offset, std::min(DELTA_PANEL, head_v - jv), jv};
}

// M's panel columns [j0, j1) after token t, into the run's snapshot of t (if it has one).
void snapshot(const DeltaRuleRun& r, int64_t t, int head_k, const Panel& pn, int j0, int j1) {
  if (!r.snap || !r.snap[t]) return;
  float* dst = r.snap[t] + pn.offset;
  for (int64_t i = 0; i < head_k; i++)
    std::memcpy(dst + i * pn.width + j0, pn.P + i * pn.width + j0, (size_t)(j1 - j0) * sizeof(float));
}

// The panel's columns [j0, j1), one scalar at a time, in the order the SIMD blocks keep per lane.
void columns_scalar(const DeltaRuleRun& r, int64_t n, int head_k, float scale, const Panel& pn, int j0, int j1) {
  for (int64_t t = 0; t < n; t++) {
    const float *q = r.q + t * r.stride, *k = r.k + t * r.stride, *v = r.v + t * r.stride + pn.jv;
    const float decay = r.decay[t * r.gate_stride], beta = r.beta[t * r.gate_stride];
    float* o = r.o + t * r.o_stride + pn.jv;
    for (int j = j0; j < j1; j++) {
      float mk = 0.f, mq = 0.f;
      for (int64_t i = 0; i < head_k; i++) {
        float& m = pn.P[i * pn.width + j];
        m = m * decay;
        mk = std::fma(m, k[i], mk);
      }
      const float d = beta * (v[j] - mk);
      for (int64_t i = 0; i < head_k; i++) {
        float& m = pn.P[i * pn.width + j];
        m = std::fma(d, k[i], m);
        mq = std::fma(m, q[i], mq);
      }
      o[j] = mq * scale;
    }
    snapshot(r, t, head_k, pn, j0, j1);
  }
}

#if defined(__AVX512F__) || PS_AVX2
#if defined(__AVX512F__)
using V = __m512;
constexpr int W = 16;
#define PS_VOP(op) _mm512_##op
#else
using V = __m256;
constexpr int W = 8;
#define PS_VOP(op) _mm256_##op
#endif
V load(const float* p) { return PS_VOP(loadu_ps)(p); }
void store(float* p, V x) { PS_VOP(storeu_ps)(p, x); }
V set1(float x) { return PS_VOP(set1_ps)(x); }
V mul(V a, V b) { return PS_VOP(mul_ps)(a, b); }
V sub(V a, V b) { return PS_VOP(sub_ps)(a, b); }
V fma(V a, V b, V c) { return PS_VOP(fmadd_ps)(a, b, c); }
#undef PS_VOP

// The SIMD block: the panel's columns [j0, j0 + NV·W), NV vectors of lanes, each lane one value row; the panel
// stays in L1 across the run's tokens. Per lane the operations of columns_scalar, in its order.
template <int NV>
struct Columns {
  const DeltaRuleRun& r;
  int64_t head_k;
  const Panel& pn;
  int j0;

  const float* q(int64_t t) const { return r.q + t * r.stride; }
  const float* k(int64_t t) const { return r.k + t * r.stride; }
  V gate(const float* g, int64_t t) const { return set1(g[t * r.gate_stride]); }
  float* row(int64_t i) const { return pn.P + i * pn.width + j0; }

  // m ← m · decay_t, acc = m · k_t
  void decay(int64_t t, V* acc) const {
    const V dt = gate(r.decay, t);
    for (int u = 0; u < NV; u++) acc[u] = set1(0.f);
    for (int64_t i = 0; i < head_k; i++) {
      const V ki = set1(k(t)[i]);
      for (int u = 0; u < NV; u++) {
        const V x = mul(load(row(i) + u * W), dt);
        store(row(i) + u * W, x);
        acc[u] = fma(x, ki, acc[u]);
      }
    }
  }
  // m ← m + d · k_t, out = m · q_t; fused with the next token's decay (acc = its m · k) where NEXT.
  template <bool NEXT>
  void correct(int64_t t, const V* d, V* out, V* acc) const {
    const V dt = NEXT ? gate(r.decay, t + 1) : set1(1.f);
    for (int u = 0; u < NV; u++) out[u] = set1(0.f), acc[u] = set1(0.f);
    for (int64_t i = 0; i < head_k; i++) {
      const V ki = set1(k(t)[i]), qi = set1(q(t)[i]);
      for (int u = 0; u < NV; u++) {
        V x = fma(d[u], ki, load(row(i) + u * W));
        out[u] = fma(x, qi, out[u]);
        if constexpr (NEXT) x = mul(x, dt), acc[u] = fma(x, set1(k(t + 1)[i]), acc[u]);
        store(row(i) + u * W, x);
      }
    }
  }
  void run(int64_t n, float scale) const {
    V acc[NV], d[NV], out[NV];
    decay(0, acc);
    for (int64_t t = 0; t < n; t++) {
      const float* v = r.v + t * r.stride + pn.jv + j0;
      const V beta = gate(r.beta, t);
      for (int u = 0; u < NV; u++) d[u] = mul(beta, sub(load(v + u * W), acc[u]));
      const bool snap = r.snap && r.snap[t], next = t + 1 < n;
      if (next && !snap) correct<true>(t, d, out, acc);
      else correct<false>(t, d, out, acc);
      float* o = r.o + t * r.o_stride + pn.jv + j0;
      for (int u = 0; u < NV; u++) store(o + u * W, mul(out[u], set1(scale)));
      if (snap) snapshot(r, t, (int)head_k, pn, j0, j0 + NV * W);
      if (snap && next) decay(t + 1, acc);
    }
  }
};
#endif

}  // namespace

// Each panel in turn over all the run's tokens: its columns in blocks of 4 vectors, then 1, then scalars.
void delta_rule(const DeltaRuleRun& run, int64_t n, int head_k, int head_v, float scale, float* M) {
  for (int jv = 0; jv < head_v; jv += DELTA_PANEL) {
    const Panel pn = panel_at(M, head_k, head_v, jv);
    int j = 0;
#if defined(__AVX512F__) || PS_AVX2
    for (; j + 4 * W <= pn.width; j += 4 * W) Columns<4>{run, head_k, pn, j}.run(n, scale);
    for (; j + W <= pn.width; j += W) Columns<1>{run, head_k, pn, j}.run(n, scale);
#endif
    if (j < pn.width) columns_scalar(run, n, head_k, scale, pn, j, pn.width);
  }
}

void delta_rule_reference(const DeltaRuleRun& run, int64_t n, int head_k, int head_v, float scale, float* M) {
  for (int jv = 0; jv < head_v; jv += DELTA_PANEL) {
    const Panel pn = panel_at(M, head_k, head_v, jv);
    columns_scalar(run, n, head_k, scale, pn, 0, pn.width);
  }
}

}  // namespace pyserve
