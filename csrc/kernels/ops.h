// ops: the element-wise and row-wise operations of a forward pass, and the quantized matrix product.
// Every reduction runs in one fixed order per output element, whatever the batch size.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/packed.h"
#include "kernels/quant.h"
#include "base/threadpool.h"

namespace pyserve {

// v holds at least n values (work buffers grow to the largest step and stay).
inline void grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Batches of at most this many rows do their element-wise work on the calling thread: a barrier costs
// more than a few rows of it.
constexpr int64_t INLINE_ROWS = 4;

// A 2-D weight in the file: rows of `n_in` elements of `type`, `n_out` rows.
struct Weight {
  GGMLType type = GGMLType::F32;
  int64_t n_in = 0, n_out = 0;
  size_t row_bytes = 0;
  const uint8_t* data = nullptr;  // [n_out][row_bytes], into the mapped file
  std::shared_ptr<const PackedWeight> packed;  // the same rows re-laid for matmul (packable types), or null
  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
};

// y[T, n] = x[T, n] / rms(x) * w[n]; in place allowed.
void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps);
// Per-head RMS norm of x[n_heads, head_dim] in place with w[head_dim].
void rmsnorm_heads(float* x, const float* w, int n_heads, int head_dim, float eps);

float gelu_tanh(float x);
float silu(float x);
// g[i] = act(g[i]) * u[i] for n values: GELU (tanh form, written as x·sigmoid(2y)) or SiLU; vectorized.
void gelu_mul(float* g, const float* u, int64_t n);
void silu_mul(float* g, const float* u, int64_t n);
void silu_inplace(float* x, int64_t n);  // x[i] = SiLU(x[i]), vectorized as silu_mul
// x[i] = exp(x[i] - mx) for n values; returns their sum (fixed order). Vectorized.
float exp_shift_sum(float* x, int64_t n, float mx);
// max(x[0, n)), n >= 1: exact, so the same value whatever the order (the SIMD lanes' maxima, then the tail).
float max_of(const float* x, int64_t n);

struct RopeParams {
  int head_dim = 0;             // elements per head
  int rope_dim = 0;             // leading elements of each head that rotate (<= head_dim)
  bool neox = false;            // rotate pairs (i, i + rope_dim/2) instead of (2i, 2i+1)
  std::vector<double> inv_freq;  // [rope_dim/2] angle per position, radians
  float mscale = 1.f;            // cos and sin × this (YaRN, LongRoPE)
};
// How a file stretches RoPE past its trained context (llama.cpp's rope_ext parameters).
struct RopeScaling {
  double freq_scale = 1.0;   // 1 / factor: positions interpolated (linear, YaRN)
  double ext_factor = 0.0;   // YaRN 1: the fast-turning pairs keep their frequency, across a ramp of pairs
  int n_ctx_orig = 0;        // YaRN: the context before the stretch (where the ramp's ends are)
  double beta_fast = 32.0, beta_slow = 1.0;  // YaRN: the ramp's ends, in turns over n_ctx_orig
  double attn_factor = 1.0;  // cos and sin × this (× YaRN's 1 + 0.1·ln(factor) where ext_factor is on)
};
// inv_freq[i] = base^(-2i/rope_dim) / factors[i] (factors: llama3 / LongRoPE, may be null), interpolated by
// freq_scale (YaRN: blended with the unscaled one across its ramp), and the rotation's magnitude.
RopeParams make_rope(int head_dim, int rope_dim, bool neox, float base, const RopeScaling& s, const float* factors);
// The rotation of position pos: cs[2i] = cos, cs[2i + 1] = sin of pair i, for i < rope_dim / 2 (computed
// once per token and step, shared by every layer).
void rope_angles(int pos, const RopeParams& p, float* cs);
// Rotates x[n_heads, head_dim] in place by the angles cs (from rope_angles).
void rope(float* x, int n_heads, const float* cs, const RopeParams& p);

// Scratch for the quantized activations of one matmul input, reused across calls.
struct ActBuffer {
  std::vector<uint8_t> data;
  ActFormat format = ActFormat::F32;
  const float* source = nullptr;  // the float rows last quantized (to skip repeat work for Q, K, V)
  int64_t rows = 0, n = 0;
};

// y[T, W.n_out] = x[T, W.n_in] · Wᵀ, split over the pool by weight rows. `act` caches the quantized x:
// consecutive calls with the same x and format reuse it (call act_invalidate when x changes in place).
void matmul(ThreadPool& pool, const Weight& W, const float* x, int64_t T, float* y, ActBuffer& act);

// Several products of the same x (Q, K and V; gate and up) in one pass over the pool: one barrier
// instead of one per weight. Falls back to one pass each when their activation formats differ.
struct MatmulOut {
  const Weight* w;
  float* y;  // [T, w->n_out]
};
void matmul_group(ThreadPool& pool, const std::vector<MatmulOut>& outs, const float* x, int64_t T, ActBuffer& act);
void act_invalidate(ActBuffer& act);

// One product of a batch of them: y[T, w->n_out] = the T activation rows at act (stride bytes apart,
// already in w's format: quantize_rows) · Wᵀ.
struct MatmulJob {
  const Weight* w;
  const uint8_t* act;
  size_t stride;
  int64_t T;
  float* y;
};
// Every job in one pass over the pool, one barrier (a MoE layer's experts, each with its own tokens).
void matmul_jobs(ThreadPool& pool, const std::vector<MatmulJob>& jobs);
// x[T, n] quantized row by row into format f at dst (T · act_row_size(f, n) bytes), split over the pool.
void quantize_rows(ThreadPool& pool, ActFormat f, const float* x, int64_t T, int64_t n, uint8_t* dst);

}  // namespace pyserve
