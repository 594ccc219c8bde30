#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/simd.h"

namespace pyserve {

float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

namespace {

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 sigmoid8(__m256 z) {
  __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), z))));
}
#endif

}  // namespace

// Σ x[i]² in a fixed order: 8-lane partial sums (two accumulators) reduced across lanes, then the tail.
static float sum_squares(const float* x, int64_t n) {
  int64_t i = 0;
  float ss = 0.f;
#if PS_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    a1 = _mm256_fmadd_ps(v1, v1, a1);
  }
  ss = hsum8(_mm256_add_ps(a0, a1));
#endif
  for (; i < n; i++) ss = std::fma(x[i], x[i], ss);
  return ss;
}

void rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float ss = sum_squares(x, n);
  float scale = 1.0f / std::sqrt(ss / (float)n + eps);
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
}

void rmsnorm_heads(float* x, const float* w, int n_heads, int head_dim, float eps) {
  for (int h = 0; h < n_heads; h++) rmsnorm(x + h * head_dim, w, x + h * head_dim, head_dim, eps);
}

void gelu_mul(float* g, const float* u, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 c2 = _mm256_set1_ps(2.0f * 0.7978845608028654f), a = _mm256_set1_ps(0.044715f);
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(g + i);
    __m256 y = _mm256_mul_ps(c2, _mm256_fmadd_ps(_mm256_mul_ps(a, x), _mm256_mul_ps(x, x), x));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid8(y)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; i++) g[i] = gelu_tanh(g[i]) * u[i];
}

void silu_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(v, sigmoid8(v)));
  }
#endif
  for (; i < n; i++) x[i] = silu(x[i]);
}

void silu_mul(float* g, const float* u, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid8(x)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; i++) g[i] = silu(g[i]) * u[i];
}

float exp_shift_sum(float* x, int64_t n, float mx) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps(), m = _mm256_set1_ps(mx);
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum8(acc);
#endif
  for (; i < n; i++) sum += (x[i] = std::exp(x[i] - mx));
  return sum;
}

float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float mx = x[0];
#if defined(__AVX2__)
  if (n >= 8) {
    __m256 m = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    mx = _mm_cvtss_f32(_mm_max_ss(r, _mm_shuffle_ps(r, r, 1)));
  }
#endif
  for (; i < n; i++) mx = std::max(mx, x[i]);
  return mx;
}

namespace {

// YaRN's ramp (ggml's rope_yarn_corr_dims / rope_yarn_ramp): the pair at which a frequency turns `turns`
// times over n_ctx_orig positions, and the blend of pair i between interpolated (0) and unscaled (1).
double yarn_corr_pair(int rope_dim, int n_ctx_orig, double turns, double base) {
  return rope_dim * std::log(n_ctx_orig / (turns * 2 * M_PI)) / (2 * std::log(base));
}

double yarn_ramp(const RopeScaling& s, int rope_dim, double base, int i) {
  if (s.ext_factor == 0.0) return 0.0;
  const double lo = std::max(0.0, std::floor(yarn_corr_pair(rope_dim, s.n_ctx_orig, s.beta_fast, base)));
  const double hi = std::min(rope_dim - 1.0, std::ceil(yarn_corr_pair(rope_dim, s.n_ctx_orig, s.beta_slow, base)));
  const double y = (i - lo) / std::max(0.001, hi - lo);
  return (1.0 - std::min(1.0, std::max(0.0, y))) * s.ext_factor;
}

}  // namespace

RopeParams make_rope(int head_dim, int rope_dim, bool neox, float base, const RopeScaling& s, const float* factors) {
  RopeParams p;
  p.head_dim = head_dim;
  p.rope_dim = rope_dim;
  p.neox = neox;
  p.inv_freq.resize(rope_dim / 2);
  for (int i = 0; i < rope_dim / 2; i++) {
    double f = std::pow((double)base, -2.0 * i / rope_dim);
    if (factors) f /= factors[i];
    const double ramp = yarn_ramp(s, rope_dim, base, i);
    p.inv_freq[i] = f * (s.freq_scale * (1.0 - ramp) + ramp);
  }
  const double yarn_mag = s.ext_factor != 0.0 ? 1.0 + 0.1 * std::log(1.0 / s.freq_scale) : 1.0;
  p.mscale = (float)(s.attn_factor * yarn_mag);
  return p;
}

void rope_angles(int pos, const RopeParams& p, float* cs) {
  for (int i = 0; i < p.rope_dim / 2; i++) {
    const double theta = (double)pos * p.inv_freq[i];
    cs[2 * i] = (float)std::cos(theta) * p.mscale;
    cs[2 * i + 1] = (float)std::sin(theta) * p.mscale;
  }
}

void rope(float* x, int n_heads, const float* cs, const RopeParams& p) {
  const int half = p.rope_dim / 2;
  for (int i = 0; i < half; i++) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const int a = p.neox ? i : 2 * i, b = p.neox ? i + half : 2 * i + 1;
    for (int h = 0; h < n_heads; h++) {
      float* v = x + h * p.head_dim;
      float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

void act_invalidate(ActBuffer& act) { act.source = nullptr; }

namespace {

// Quantizes x[T, n] into act (parallel over rows) unless it already holds exactly that.
void quantize_input(ThreadPool& pool, ActFormat f, const float* x, int64_t T, int64_t n, ActBuffer& act) {
  if (act.source == x && act.format == f && act.rows == T && act.n == n) return;
  size_t stride = act_row_size(f, n);
  if (act.data.size() < stride * T) act.data.resize(stride * T);
  quantize_rows(pool, f, x, T, n, act.data.data());
  act.source = x;
  act.format = f;
  act.rows = T;
  act.n = n;
}

constexpr int64_t ROW_TILE = 16;  // weight rows kept hot in L1 while the token columns stream past (a
                                  // multiple of PACK_ROWS, so a tile never splits a packed group)
constexpr int COL_TILE = 8;       // token columns per vec_dot_tile call

// Rows [r0, r0 + nr) of W against all T activation columns into y[T, W.n_out].
void tile_product(const Weight& W, int64_t r0, int64_t nr, const uint8_t* a, size_t stride, int64_t T, float* y) {
  const int64_t n = W.n_in, m = W.n_out;
  if (W.packed) {
    // Whole groups through the packed kernels; rows past the last group through the scalar reference,
    // which computes the same chain bit for bit.
    const int64_t g0 = r0 / PACK_ROWS, g1 = std::min(W.packed->n_groups, (r0 + nr) / PACK_ROWS);
    if (g1 > g0) packed_tile(*W.packed, g0, g1, a, stride, (int)T, y + r0, m);
    for (int64_t r = std::max(r0, g1 * PACK_ROWS); r < r0 + nr; r++)
      for (int64_t t = 0; t < T; t++) y[t * m + r] = vec_dot_ref(W.type, n, W.row(r), a + t * stride);
    return;
  }
  for (int64_t t0 = 0; t0 < T; t0 += COL_TILE) {
    const int nc = (int)std::min<int64_t>(COL_TILE, T - t0);
    vec_dot_tile(W.type, n, W.row(r0), W.row_bytes, nr, a + t0 * stride, stride, nc, y + t0 * m + r0, m);
  }
}

}  // namespace

void matmul(ThreadPool& pool, const Weight& W, const float* x, int64_t T, float* y, ActBuffer& act) {
  matmul_group(pool, {{&W, y}}, x, T, act);
}

void matmul_group(ThreadPool& pool, const std::vector<MatmulOut>& outs, const float* x, int64_t T, ActBuffer& act) {
  if (T == 0 || outs.empty()) return;
  const ActFormat f = type_traits((uint32_t)outs[0].w->type)->act;
  for (const MatmulOut& o : outs) {
    if (type_traits((uint32_t)o.w->type)->act != f || o.w->n_in != outs[0].w->n_in) {
      for (const MatmulOut& one : outs) matmul_group(pool, {one}, x, T, act);
      return;
    }
  }
  const int64_t n = outs[0].w->n_in;
  quantize_input(pool, f, x, T, n, act);
  std::vector<MatmulJob> jobs;
  for (const MatmulOut& o : outs) jobs.push_back({o.w, act.data.data(), act_row_size(f, n), T, o.y});
  matmul_jobs(pool, jobs);
}

void quantize_rows(ThreadPool& pool, ActFormat f, const float* x, int64_t T, int64_t n, uint8_t* dst) {
  const size_t stride = act_row_size(f, n);
  pool.parallel_for(T, [&](int64_t t) { quantize_act_row(f, x + t * n, dst + t * stride, n); }, INLINE_ROWS);
}

void matmul_jobs(ThreadPool& pool, const std::vector<MatmulJob>& jobs) {
  // Tiles of all the jobs in one index space: tile g is (job i, weight rows [r0, r0 + ROW_TILE)).
  std::vector<int64_t> first_tile(jobs.size() + 1, 0);
  for (size_t i = 0; i < jobs.size(); i++)
    first_tile[i + 1] = first_tile[i] + (jobs[i].T > 0 ? (jobs[i].w->n_out + ROW_TILE - 1) / ROW_TILE : 0);
  if (first_tile.back() == 0) return;
  pool.run_split(first_tile.back(), [&](int64_t g0, int64_t g1) {
    size_t i = 0;
    for (int64_t g = g0; g < g1;) {
      while (g >= first_tile[i + 1]) i++;
      const MatmulJob& j = jobs[i];
      // A packed matrix's tiles of this share in one call: its kernels keep a panel of rows' decoded
      // codes hot across the columns (packed_amx.h); the per-row kernels take ROW_TILE rows at a time.
      const int64_t g_end = j.w->packed ? std::min(g1, first_tile[i + 1]) : g + 1;
      const int64_t r0 = (g - first_tile[i]) * ROW_TILE;
      tile_product(*j.w, r0, std::min(j.w->n_out, (g_end - first_tile[i]) * ROW_TILE) - r0, j.act, j.stride, j.T, j.y);
      g = g_end;
    }
  });
}

}  // namespace pyserve
