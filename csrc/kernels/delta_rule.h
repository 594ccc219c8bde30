// delta_rule: the gated delta rule of one Gated DeltaNet value head over a run of a sequence's tokens, the
// recurrence at the heart of delta_net (llama.cpp: delta-net-base.cpp's autoregressive form).
//
//   per token t, per value row j (M's column j, head_k floats; rows are independent of one another):
//     m ← m · decay_t;  d = beta_t · (v_t[j] − m·k_t);  m ← m + d · k_t;  o_t[j] = (m·q_t) · scale
//
// M is stored transposed, in panels of DELTA_PANEL value rows: panel p holds rows [64p, 64p + w) as
// [head_k][w] (w = min(64, head_v − 64p)), so a vector of value rows shares one k_t[i], each row's dot products
// sum over i in order (one fused multiply-add per step), and a panel (32 KB at head_k 128) stays in L1 across
// a run's tokens without the cache-set conflicts a 512-byte row stride gives. That order is the reference's: the SIMD kernel and delta_rule_reference give the same bits (test_delta_rule.py),
// and a token's result is the same however its sequence's tokens are split into runs.
#pragma once

#include <cstdint>

namespace pyserve {

constexpr int DELTA_PANEL = 64;  // value rows per panel of M

struct DeltaRuleRun {
  const float *q, *k, *v;  // token t's [head_k], [head_k], [head_v] at q + t * stride (likewise k, v)
  int64_t stride;
  const float *decay, *beta;  // token t's exp(g) and beta at decay[t * gate_stride], beta[t * gate_stride]
  int64_t gate_stride;
  float* o;                // token t's output [head_v] at o + t * o_stride
  int64_t o_stride;
  float* const* snap;      // [n] or null: where snap[t] is not null, M after token t is copied there
};

// Advances M (head_k × head_v floats in panels) over the run's n tokens and writes their outputs. Never fails (the caller
// sizes every pointer); head_k, head_v ≥ 1.
void delta_rule(const DeltaRuleRun& run, int64_t n, int head_k, int head_v, float scale, float* M);
// The same, one scalar at a time (the twin the SIMD kernel must equal bit for bit).
void delta_rule_reference(const DeltaRuleRun& run, int64_t n, int head_k, int head_v, float scale, float* M);

}  // namespace pyserve
