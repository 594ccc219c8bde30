// sampler: see sampler.h for the semantics.
//
// Cost on a 262,144-token vocabulary: a handful of vectorised passes over [n_vocab] floats, never a full sort.
// Sampling works on weights w = e^{(m - max m) / T} in [0, 1] (in work_; m = logits after bias and penalties).
// top-k / top-p keep a prefix of the order (w desc, id asc); it is found in the exact top 256 (selected in one
// pass) when the distribution is peaked, the usual LLM case, else by narrowing a bracket (lo, hi] of weights
// around the cut with counting passes until a few hundred elements remain, which are then sorted. min-p is a
// threshold on w. The draw sums the kept weight per block of 1024, then walks one block.
#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__SSE4_1__)
#include <smmintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace pyserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kNoCount = std::numeric_limits<int64_t>::max();
constexpr int kBlock = 1024;      // elements per float partial sum (bounds its rounding) and per draw block
constexpr int kFirstK = 256;      // exact top-K tried first; holds the top-p mass when the distribution is peaked
constexpr int kMaxBracket = 512;  // refinement stops once this few elements remain around the cut; they get sorted
constexpr int kSamples = 512;     // strided subsample (every 16th element at least) that guesses where the cut lies
constexpr float kGreedyTemperature = 1e-5f;  // below this vLLM samples greedily; so do we

// ---- float vectors of the host's register width (GCC / Clang vector extensions) ----
// -O3 alone does not vectorise these reductions (float sums need reassociation, the compares need if-conversion).
// Wider-than-native vectors would be lowered through memory, so the width follows the target.

#if defined(__AVX512F__)
constexpr int kW = 16;
#elif defined(__AVX__)
constexpr int kW = 8;
#else
constexpr int kW = 4;  // SSE / NEON
#endif
typedef float vf __attribute__((vector_size(kW * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kW * sizeof(int32_t))));

inline vf splat(float x) { return vf{} + x; }
inline vf select(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
inline vf vmax(vf a, vf b) { return select(a > b, a, b); }  // NaN in a never wins
inline vi iota_v() {
  vi v;
  for (int j = 0; j < kW; j++) v[j] = j;
  return v;
}
inline bool any(vi m) {  // any lane set
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask((__m512i)m, (__m512i)m) != 0;
#elif defined(__AVX__)
  return !_mm256_testz_si256((__m256i)m, (__m256i)m);
#elif defined(__SSE4_1__)
  return !_mm_testz_si128((__m128i)m, (__m128i)m);
#elif defined(__ARM_NEON) && defined(__aarch64__)
  return vmaxvq_u32((uint32x4_t)m) != 0;
#else
  int64_t h[2];
  std::memcpy(h, &m, sizeof h);
  return (h[0] | h[1]) != 0;
#endif
}

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// p[0..count) (count < kW), the rest `fill`.
inline vf load_tail(const float* p, int count, float fill) {
  float t[kW];
  for (int j = 0; j < kW; j++) t[j] = j < count ? p[j] : fill;
  return load(t);
}
inline void store(float* p, vf v, int count) {
  if (count >= kW) return (void)std::memcpy(p, &v, sizeof v);
  float t[kW];
  std::memcpy(t, &v, sizeof v);
  std::copy(t, t + count, p);
}
// body(i, x[i..i+kW), count) over [begin, end), the last vector padded with `fill` (count = real elements).
template <class Body>
inline void for_vectors(const float* x, int begin, int end, float fill, Body body) {
  int i = begin;
  for (; i + kW <= end; i += kW) body(i, load(x + i), kW);
  if (i < end) body(i, load_tail(x + i, end - i, fill), end - i);
}
inline double hsum(vf v) {
  double s = 0;
  for (int j = 0; j < kW; j++) s += v[j];
  return s;
}
inline float hmax(vf v) {
  float m = -kInf;
  for (int j = 0; j < kW; j++) m = v[j] > m ? v[j] : m;
  return m;
}
// 2^t for t <= 0 (max-subtracted logits, already in base 2), ~2 ulp (Cephes exp2f polynomial); 0 below -125
// (where floats turn subnormal), for -inf and NaN. Plain float ops: the same weights with any standard library.
inline vf exp2_approx(vf t) {
  const vi live = t > splat(-125.0f);
  t = select(live, t, splat(-125.0f));                           // also maps NaN to -125
  const vf n = (t + 12582912.0f) - 12582912.0f;                  // round(t); 12582912 = 1.5 * 2^23
  const vf f = t - n;                                            // [-0.5, 0.5]
  vf p = splat(1.535336188319500e-4f);
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  const vi pow2n = (__builtin_convertvector(n, vi) + 127) << 23;  // 2^n as float bits, n in [-125, 0]
  return select(live, p * (vf)pow2n, vf{});
}

// ---- passes over [n] floats ----

// Calls f(i) for each i in [0, n) where pred holds, in order, until f returns false. pred(vf) -> vi is tried on
// 4 vectors at a time, and only groups with a hit are looked into.
template <class Pred, class F>
void for_each_where(const float* x, int n, Pred pred, F f) {
  auto visit = [&](int i, vi hit, int count) {  // false: stop
    for (int j = 0; j < count; j++)
      if (hit[j] && !f(i + j)) return false;
    return true;
  };
  int i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    const vi h0 = pred(load(x + i)), h1 = pred(load(x + i + kW));
    const vi h2 = pred(load(x + i + 2 * kW)), h3 = pred(load(x + i + 3 * kW));
    if (!any(h0 | h1 | h2 | h3)) continue;
    if (!visit(i, h0, kW) || !visit(i + kW, h1, kW) || !visit(i + 2 * kW, h2, kW) || !visit(i + 3 * kW, h3, kW))
      return;
  }
  bool go = true;
  for_vectors(x, i, n, 0.0f, [&](int j, vf v, int count) { go = go && visit(j, pred(v), count); });
}

struct ArgMax {
  int32_t id;
  float value;
};

// First index of the largest value (ties → lowest id); NaN never wins; all -inf / NaN → {0, -inf}.
// A max pass (4 independent chains), then the first position holding it.
ArgMax argmax(const float* x, int n) {
  vf m[4] = {splat(-kInf), splat(-kInf), splat(-kInf), splat(-kInf)};
  int i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW)
    for (int k = 0; k < 4; k++) m[k] = vmax(load(x + i + k * kW), m[k]);
  for_vectors(x, i, n, -kInf, [&](int, vf v, int) { m[0] = vmax(v, m[0]); });
  const float best = hmax(vmax(vmax(m[0], m[1]), vmax(m[2], m[3])));
  if (!(best > -kInf)) return {0, best};
  int32_t at = 0;
  for_each_where(x, n, [&](vf v) { return v == splat(best); }, [&](int j) { return at = j, false; });
  return {at, best};
}

// Σ e^{(x_i - shift) · scale} (x <= shift), float lanes within a block and blocks added in double; with out,
// also stores the terms there (out may be x).
double sum_exp(const float* x, int n, float shift, float scale, float* out) {
  const float a = scale * 1.44269504f;  // e^y = 2^{y log2 e}
  double total = 0;
  for (int b = 0; b < n; b += kBlock) {
    vf acc = {};
    for_vectors(x, b, std::min(n, b + kBlock), -kInf, [&](int i, vf v, int count) {
      v = exp2_approx((v - shift) * a);
      if (out) store(out + i, v, count);
      acc += v;
    });
    total += hsum(acc);
  }
  return total;
}

// NaN ranks below everything, so that the order stays a strict weak order on broken logits.
inline float rank_key(float x) { return x == x ? x : -kInf; }

// The order used everywhere: value descending, then id ascending.
struct Better {
  const float* v;
  bool operator()(int32_t a, int32_t b) const {
    const float va = rank_key(v[a]), vb = rank_key(v[b]);
    return va > vb || (va == vb && a < b);
  }
};

// The k best ids of v[n] in Better order, sorted, into out; scratch: any float vector. O(n + k log k).
// One pass takes the maximum of each group of g elements (group = lane j of a chunk of g vectors: one vector
// store per chunk). The k-th largest group maximum bounds the k-th largest value from below, so only elements
// reaching it, in groups reaching it, are candidates: ~k to 2k of them. Large k (> n/8): nth_element over all.
void top_ids(const float* v, int n, int k, std::vector<int32_t>& out, std::vector<float>& scratch) {
  out.clear();
  k = std::min(k, n);
  if (k <= 0) return;
  const Better better{v};
  const int g = std::min<int64_t>(64, n / (4 * (int64_t)k));  // elements per group: >= 4k groups
  if (g >= 2) {
    const int chunk = g * kW, n_groups = (n + chunk - 1) / chunk * kW;
    scratch.resize(2 * (size_t)n_groups);
    float* gmax = scratch.data();  // [n_groups]: group (chunk c, lane j) = elements c·chunk + j + kW·t, t < g
    for (int c = 0; c < n; c += chunk) {
      vf m0 = splat(-kInf), m1 = m0;  // two dependency chains
      const int e = std::min(n, c + chunk);
      int i = c;
      for (; i + 2 * kW <= e; i += 2 * kW) m0 = vmax(load(v + i), m0), m1 = vmax(load(v + i + kW), m1);
      for_vectors(v, i, e, -kInf, [&](int, vf x, int) { m0 = vmax(x, m0); });
      const vf gm = vmax(m0, m1);
      std::memcpy(gmax + c / chunk * kW, &gm, sizeof gm);
    }
    float* sel = gmax + n_groups;
    std::copy(gmax, gmax + n_groups, sel);
    std::nth_element(sel, sel + (k - 1), sel + n_groups, std::greater<float>());
    const float thr = sel[k - 1];
    // Everything above thr is a candidate. Of the ties at thr only the k lowest ids can be: chunks come in id
    // order, so once k ties are in, later chunks' are skipped (masked logits: most of the vocabulary ties at -inf).
    int ties = 0;
    for (int c = 0; c < n; c += chunk) {
      const bool take_ties = ties < k;
      for (int j = 0, e = std::min(n, c + chunk); j < kW; j++) {
        const float gm = gmax[c / chunk * kW + j];
        if (!(gm > thr || (gm == thr && take_ties))) continue;
        for (int i = c + j; i < e; i += kW) {
          const float x = rank_key(v[i]);
          if (x > thr) out.push_back(i);
          else if (x == thr && take_ties) out.push_back(i), ties++;
        }
      }
    }
  } else {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0);
  }
  if ((int)out.size() > k) {
    std::nth_element(out.begin(), out.begin() + (k - 1), out.end(), better);
    out.resize(k);
  }
  std::sort(out.begin(), out.end(), better);
}

// ids with lo < w <= hi, ascending. Branch-free inside 4-vector groups that hold any: a bracket's elements are
// scattered, so a branch per element would mispredict often.
void collect_between(const float* w, int n, float lo, float hi, std::vector<int32_t>& out) {
  out.clear();
  size_t count = 0;
  auto take = [&](int i, vi hit, int lanes) {
    if (out.size() < count + kW) out.resize(std::max(2 * out.size(), count + 4 * kW));
    int32_t* o = out.data() + count;
#if defined(__AVX512F__)
    const __mmask16 k = _mm512_test_epi32_mask((__m512i)hit, (__m512i)hit) & ((1u << lanes) - 1);
    _mm512_storeu_si512(o, _mm512_maskz_compress_epi32(k, (__m512i)(iota_v() + i)));  // in-register: fast on Zen 4
    count += __builtin_popcount(k);
#else
    for (int j = 0; j < lanes; j++) *o = i + j, o += hit[j] != 0;
    count = o - out.data();
#endif
  };
  auto in = [&](vf x) { return (x > splat(lo)) & (x <= splat(hi)); };
  int i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    const vi h0 = in(load(w + i)), h1 = in(load(w + i + kW)), h2 = in(load(w + i + 2 * kW)), h3 = in(load(w + i + 3 * kW));
    if (!any(h0 | h1 | h2 | h3)) continue;
    take(i, h0, kW), take(i + kW, h1, kW), take(i + 2 * kW, h2, kW), take(i + 3 * kW, h3, kW);
  }
  for_vectors(w, i, n, 0.0f, [&](int j, vf x, int lanes) { take(j, in(x), lanes); });
  out.resize(count);
}

// Fallback pivots lo < p2 <= p1 < hi at the thirds of (max(lo, 0), hi]: in log space when the bracket spans
// more than a factor 4, else linear; at its middle when thirds round onto the ends. False: no float in between.
bool split_pivots(float lo, float hi, float& p1, float& p2) {
  const float lo0 = std::max(lo, 0.0f);
  if (lo0 > 0.0f && hi < 4.0f * lo0) {
    p1 = lo0 + (hi - lo0) * (2.0f / 3.0f), p2 = lo0 + (hi - lo0) * (1.0f / 3.0f);
  } else {
    const double l = std::log(std::max(lo0, 1e-38f)), h = std::log(hi);
    p1 = (float)std::exp(l + (h - l) * (2.0 / 3.0)), p2 = (float)std::exp(l + (h - l) / 3.0);
  }
  if (!(lo < p2 && p2 <= p1 && p1 < hi)) p1 = p2 = lo0 + (hi - lo0) * 0.5f;
  return lo < p2 && p2 <= p1 && p1 < hi;
}

inline double uniform01(std::mt19937_64& rng) { return (double)(rng() >> 11) * 0x1.0p-53; }  // [0, 1), 53 bits

uint64_t random_seed() {
  std::random_device rd;
  return ((uint64_t)rd() << 32) ^ rd();
}

template <class T>
[[noreturn]] void bad(const char* name, const char* rule, T value) {
  std::ostringstream s;
  s << name << " must be " << rule << ", got " << value;
  throw std::invalid_argument(s.str());
}

// logsumexp given max(logits) = mx.
float logsumexp_at(const float* logits, int n, float mx) {
  if (!(mx > -kInf) || mx == kInf) return mx;
  return mx + (float)std::log(sum_exp(logits, n, mx, 1.0f, nullptr));
}

}  // namespace

void check_token_id(const char* field, int64_t id, int n_vocab) {
  if (id < 0 || id >= n_vocab)
    throw std::invalid_argument(std::string(field) + ": token id " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
}

constexpr double kUnbounded = std::numeric_limits<double>::infinity();

const Bound kSamplingBounds[kNumBounds] = {
    {"temperature", 0, kUnbounded, false, true, ">= 0 and finite"},
    {"top_k", -1, kUnbounded, false, true, "-1 or 0 (off) or >= 1"},
    {"top_p", 0, 1, true, false, "in (0, 1]"},
    {"min_p", 0, 1, false, false, "in [0, 1]"},
    {"repetition_penalty", 0, kUnbounded, true, true, "> 0 and finite"},
    {"presence_penalty", -2, 2, false, false, "in [-2, 2]"},
    {"frequency_penalty", -2, 2, false, false, "in [-2, 2]"},
    {"min_tokens", 0, kUnbounded, false, true, ">= 0"},
};

bool Bound::holds(double x) const {
  return std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

namespace {
template <class T>
void check_bound(BoundId id, T value) {
  const Bound& b = kSamplingBounds[id];
  if (!b.holds((double)value)) bad(b.name, b.rule, value);
}
}  // namespace

void check_sampling(const SamplingConfig& c) {
  check_bound(kTemperature, c.temperature);
  check_bound(kTopK, c.top_k);
  check_bound(kTopP, c.top_p);
  check_bound(kMinP, c.min_p);
  check_bound(kRepetitionPenalty, c.repetition_penalty);
  check_bound(kPresencePenalty, c.presence_penalty);
  check_bound(kFrequencyPenalty, c.frequency_penalty);
  check_bound(kMinTokens, c.min_tokens);
  for (const auto& [id, bias] : c.logit_bias)
    if (std::isnan(bias) || bias == kInf) bad("logit_bias value", "finite or -inf", bias);
}

void check_sampling(const SamplingConfig& c, int n_vocab) {
  if (n_vocab <= 0) bad("n_vocab", "> 0", n_vocab);
  check_sampling(c);
  if (c.logprobs > n_vocab) bad("logprobs", ("<= n_vocab (" + std::to_string(n_vocab) + ")").c_str(), c.logprobs);
  for (const auto& [id, bias] : c.logit_bias) check_token_id("logit_bias", id, n_vocab);
  for (int32_t id : c.min_tokens_banned) check_token_id("stop_token_ids", id, n_vocab);
}

float logsumexp(const float* logits, int n) { return n > 0 ? logsumexp_at(logits, n, argmax(logits, n).value) : -kInf; }

// ---- Sampler ----

// Count and weight of {w > t1} and of {w > t2}, in one pass (w >= 0, t >= 0).
void Sampler::above2(const float* w, int n, float t1, float t2, Above& a1, Above& a2) {
  a1 = a2 = Above{};
  for (int b = 0; b < n; b += kBlock) {
    vf m1 = {}, m2 = {}, c1 = {}, c2 = {};  // counts <= kBlock / kW per lane: exact in float
    auto add = [&](int, vf x, int) {
      const vi g1 = x > splat(t1), g2 = x > splat(t2);
      m1 += select(g1, x, vf{}), c1 += select(g1, splat(1.0f), vf{});
      m2 += select(g2, x, vf{}), c2 += select(g2, splat(1.0f), vf{});
    };
    for_vectors(w, b, std::min(n, b + kBlock), 0.0f, add);
    a1.mass += hsum(m1), a1.count += (int64_t)hsum(c1);
    a2.mass += hsum(m2), a2.count += (int64_t)hsum(c2);
  }
}

Sampler::Sampler(const SamplingConfig& cfg, int n_vocab) : cfg_(cfg), n_vocab_(n_vocab) {
  check_sampling(cfg, n_vocab);
  rng_.seed(cfg.seed >= 0 ? (uint64_t)cfg.seed : random_seed());
}

void Sampler::set_prompt(const std::vector<int32_t>& prompt) {
  for (int32_t id : prompt) check_token_id("prompt", id, n_vocab_);
  for (int32_t id : prompt_ids_) in_prompt_[id] = 0;
  prompt_ids_.clear();
  if (cfg_.repetition_penalty == 1.0f) return;  // nothing else looks at the prompt
  in_prompt_.resize(n_vocab_, 0);
  for (int32_t id : prompt)
    if (!in_prompt_[id]) in_prompt_[id] = 1, prompt_ids_.push_back(id);
}

SampleResult Sampler::sample(const float* logits) {
  SampleResult r;
  const bool masked = grammar_ && load_mask(r.grammar_end);
  if (grammar_ && !masked) {  // the matcher failed: end the sample (whatever token, it is not reported as text)
    r.token = std::max(first_allowed(), 0);
    return r;
  }
  const float* m = modified_logits(logits, masked);
  ArgMax best = argmax(m, n_vocab_);
  // A grammar whose only allowed ids are banned (min_tokens) or have -inf logits: its lowest allowed id
  if (masked && !(best.value > -kInf)) best = {first_allowed(), kInf};
  const bool greedy = cfg_.temperature < kGreedyTemperature || cfg_.top_k == 1 || !(best.value > -kInf) ||
                      best.value == kInf;
  double z = 0;
  r.token = greedy ? best.id : draw_token(m, best.value, &z);
  // The weights' sum is the raw partition function when nothing modified the logits at T = 1.
  const bool z_is_raw = !greedy && m == logits && cfg_.temperature == 1.0f;
  const float raw_max = m == logits ? best.value : argmax(logits, n_vocab_).value;
  const float lse = z_is_raw ? raw_max + (float)std::log(z) : logsumexp_at(logits, n_vocab_, raw_max);
  fill_logprobs(logits, lse, r);
  output_counts_[r.token]++;
  n_out_++;
  if (grammar_) advance_grammar(r);
  return r;
}

void Sampler::set_grammar(std::unique_ptr<Matcher> m) {
  if (m && m->n_vocab() != n_vocab_)
    throw std::invalid_argument("grammar: compiled for a vocabulary of " + std::to_string(m->n_vocab()) +
                                " ids, the model has " + std::to_string(n_vocab_));
  grammar_ = std::move(m);
  if (grammar_) mask_.assign(grammar_->mask_words(), 0);
}

bool Sampler::load_mask(std::string& error) {
  if (grammar_->compute_mask(mask_.data())) return true;
  error = "error: grammar: " + grammar_->error();
  return false;
}

// m[i] = logits[i] where the mask allows i, else -inf; a word of 32 ids at a time (most are all-0 or all-1).
void Sampler::apply_mask(const float* logits, float* m) const {
  const int n = n_vocab_;
  for (int w = 0, base = 0; base < n; w++, base += 32) {
    const uint32_t bits = mask_[w];
    const int end = std::min(n, base + 32);
    if (bits == 0) std::fill(m + base, m + end, -kInf);
    else if (bits == ~0u) std::memcpy(m + base, logits + base, (end - base) * sizeof(float));
    else
      for (int i = base; i < end; i++) m[i] = (bits >> (i - base)) & 1u ? logits[i] : -kInf;
  }
}

int32_t Sampler::first_allowed() const {
  for (size_t w = 0; w < mask_.size(); w++)
    if (mask_[w]) return (int32_t)(w * 32 + __builtin_ctz(mask_[w]));
  return -1;
}

void Sampler::advance_grammar(SampleResult& r) {
  if (!grammar_->consume(r.token)) r.grammar_end = "error: grammar: " + grammar_->error();
  else if (grammar_->stopped()) r.grammar_end = "stop";
}

const float* Sampler::modified_logits(const float* logits, bool masked) {
  const bool rep = cfg_.repetition_penalty != 1.0f && (!prompt_ids_.empty() || !output_counts_.empty());
  const bool out = (cfg_.presence_penalty != 0.0f || cfg_.frequency_penalty != 0.0f) && !output_counts_.empty();
  const bool ban = n_out_ < cfg_.min_tokens && !cfg_.min_tokens_banned.empty();
  if (cfg_.logit_bias.empty() && !rep && !out && !ban && !masked) return logits;
  work_.resize(n_vocab_);
  float* m = work_.data();
  if (masked) apply_mask(logits, m);  // first: no bias or penalty lifts a disallowed id back
  else std::memcpy(m, logits, n_vocab_ * sizeof(float));
  if (ban)
    for (int32_t id : cfg_.min_tokens_banned) m[id] = -kInf;  // before the bias: no bias lifts them back
  for (const auto& [id, bias] : cfg_.logit_bias) m[id] += bias;
  if (rep) {  // once per distinct token seen in the prompt or the output (HF / vLLM)
    const float pen = cfg_.repetition_penalty;
    auto penalise = [&](int32_t id) { m[id] = m[id] > 0 ? m[id] / pen : m[id] * pen; };
    for (int32_t id : prompt_ids_) penalise(id);
    for (const auto& [id, count] : output_counts_)
      if (in_prompt_.empty() || !in_prompt_[id]) penalise(id);
  }
  if (out)
    for (const auto& [id, count] : output_counts_) m[id] -= cfg_.presence_penalty + cfg_.frequency_penalty * count;
  return m;
}

// m: [n_vocab] modified logits with maximum m_max (finite). Returns the drawn id; *z = Σ weights.
int32_t Sampler::draw_token(const float* m, float m_max, double* z) {
  const int n = n_vocab_;
  work_.resize(n);
  float* w = work_.data();
  *z = sum_exp(m, n, m_max, 1.0f / cfg_.temperature, w);  // max weight is e^0 = 1 exactly
  top_valid_ = false;
  Cut cut{0.0f, -1, *z};  // every positive weight
  if (cfg_.top_k > 0 && cfg_.top_k < n) cut = find_cut(w, Criterion{cfg_.top_k, INFINITY}, cut, *z);
  if (cfg_.top_p < 1.0f) {  // relative to what top-k kept, so it can only end inside it
    const Cut p = find_cut(w, Criterion{kNoCount, cfg_.top_p * cut.mass}, cut, *z);
    if (p.tau > cut.tau || (p.tau == cut.tau && p.last < cut.last)) cut = p;
  }
  return draw(w, cut, cfg_.min_p);  // min_p · (max weight = 1)
}

// The shortest prefix of (w desc, id asc) meeting crit; `none_met` when none does. z = Σ w.
Sampler::Cut Sampler::find_cut(const float* w, const Criterion& crit, const Cut& none_met, double z) {
  auto walk = [&](const std::vector<int32_t>& ids, int64_t c, double m) -> std::optional<Cut> {
    for (int32_t id : ids) {
      if (!(w[id] > 0)) break;  // zero weights are never kept
      c++, m += w[id];
      if (crit.met(c, m)) return Cut{w[id], id, m};
    }
    return std::nullopt;
  };
  const int k0 = (int)std::min<int64_t>({crit.count, kFirstK, n_vocab_});
  if (top_valid_)  // top-p inside the already sorted top-k
    if (auto c = walk(top_, 0, 0.0)) return *c;
  if (!top_valid_ || (int)top_.size() < k0) {
    top_ids(w, n_vocab_, k0, top_, scratch_);
    top_valid_ = true;
    if (auto c = walk(top_, 0, 0.0)) return *c;
  }
  if ((int)top_.size() == n_vocab_ || !(w[top_.back()] > 0)) return none_met;  // every positive weight walked
  return refine(w, crit, z);
}

// The cut lies below the sorted top_ (which missed crit). Invariant: {w > hi} does not meet crit and {w > lo}
// does, so the cut element has lo < w <= hi. Each round splits the bracket at two pivots with one counting pass,
// until few enough elements remain in it to sort. Starts with lo = -1: below every weight, {w > lo} is everything.
Sampler::Cut Sampler::refine(const float* w, const Criterion& crit, double z) {
  const int n = n_vocab_;
  float hi = w[top_.back()], lo = -1.0f;
  Above at_hi, at_lo{n, z};
  for (int32_t id : top_)
    if (w[id] > hi) at_hi.count++, at_hi.mass += w[id];
  sample_stride_ = std::max(16, n / kSamples);
  samples_.clear();
  for (int i = 0; i < n; i += sample_stride_) samples_.push_back(w[i]);
  std::sort(samples_.begin(), samples_.end(), std::greater<float>());

  // Counting passes run over all of w until the bracket holds a sixteenth of it, then over just those elements
  // (ids in cand_, weights in vals_): {w > p} = {w > hi at that point} ∪ those above p.
  const float* vals = w;
  int count = n;
  Above base;
  for (int round = 0; round < 64 && at_lo.count - at_hi.count > kMaxBracket; round++) {
    if (vals == w && at_lo.count - at_hi.count <= n / 16) {
      collect_between(w, n, lo, hi, cand_);
      vals_.resize(cand_.size());
      for (size_t j = 0; j < cand_.size(); j++) vals_[j] = w[cand_[j]];
      vals = vals_.data(), count = (int)cand_.size(), base = at_hi;
    }
    float p1, p2;  // lo < p2 <= p1 < hi
    if (!guess_pivots(lo, hi, at_hi, crit, p1, p2) && !split_pivots(lo, hi, p1, p2)) break;  // only ties remain
    Above a1, a2;
    above2(vals, count, p1, p2, a1, a2);
    a1.count += base.count, a1.mass += base.mass, a2.count += base.count, a2.mass += base.mass;
    if (crit.met(a1.count, a1.mass)) lo = p1, at_lo = a1;
    else if (crit.met(a2.count, a2.mass)) hi = p1, at_hi = a1, lo = p2, at_lo = a2;
    else hi = p2, at_hi = a2;
  }
  if (vals == w) {
    collect_between(w, n, lo, hi, cand_);
  } else {
    auto outside = [&](int32_t id) { return !(w[id] > lo && w[id] <= hi); };
    cand_.erase(std::remove_if(cand_.begin(), cand_.end(), outside), cand_.end());
  }
  if (auto c = walk_sorted(w, cand_, at_hi, crit)) return *c;
  return Cut{lo, -1, at_lo.mass};  // rounding: keep all above lo
}

// Walks ids (after the `before` elements that precede them) in Better order to the first prefix meeting crit,
// sorting them piecewise (256, 512, ... at a time) only as far as the cut. ids come in id order, so a bracket
// of ties is sorted already.
std::optional<Sampler::Cut> Sampler::walk_sorted(const float* w, std::vector<int32_t>& ids, const Above& before,
                                                 const Criterion& crit) {
  const Better better{w};
  const bool sorted = std::is_sorted(ids.begin(), ids.end(), better);
  int64_t c = before.count;
  double m = before.mass;
  for (size_t done = 0, step = 256; done < ids.size(); done += step, step *= 2) {
    const auto first = ids.begin() + done, last = ids.begin() + std::min(ids.size(), done + step);
    if (!sorted && last != ids.end()) std::nth_element(first, last - 1, ids.end(), better);
    if (!sorted) std::sort(first, last, better);
    for (auto it = first; it != last; ++it) {
      c++, m += w[*it];
      if (crit.met(c, m)) return Cut{w[*it], *it, m};
    }
  }
  return std::nullopt;
}

// Pivots around the cut as estimated from samples_ (each sample in (lo, hi] stands for sample_stride_ elements),
// ~2.5 standard deviations of the estimate to either side. False when too few samples fall in the bracket.
bool Sampler::guess_pivots(float lo, float hi, const Above& at_hi, const Criterion& crit, float& p1,
                           float& p2) const {
  auto first_at_or_below = [&](float t) {
    return (int)(std::lower_bound(samples_.begin(), samples_.end(), t, std::greater<float>()) - samples_.begin());
  };
  const int a = first_at_or_below(hi), b = first_at_or_below(lo);
  if (b - a < 16) return false;
  int64_t c = at_hi.count;
  double m = at_hi.mass, sq = 0;
  int r = b - 1;
  for (int s = a; s < b; s++) {
    c += sample_stride_, m += (double)sample_stride_ * samples_[s], sq += (double)samples_[s] * samples_[s];
    if (crit.met(c, m)) {
      r = s;
      break;
    }
  }
  // Error of the estimate, in sample ranks: of a count ~ sqrt(samples); of a mass ~ sqrt(Σ w²) / (w at the cut).
  const double sd = crit.count != kNoCount ? std::sqrt((double)(r - a + 1)) : std::sqrt(sq) / samples_[r];
  // At most a third of the bracket's samples between the pivots: a wrong guess still shrinks the bracket.
  const int margin = 2 + (int)std::min(2.5 * sd, (b - a) / 6.0);
  p1 = samples_[std::max(a, r - margin)];
  p2 = samples_[std::min(b - 1, r + margin)];
  if (p1 >= hi) p1 = std::nextafter(hi, -kInf), p2 = std::min(p2, p1);  // cut among ties at hi: isolate them
  return lo < p2 && p2 <= p1 && p1 < hi;
}

// Draws from the kept weights: per-block kept mass (vectorised), then a walk inside one block.
int32_t Sampler::draw(const float* w, const Cut& cut, float w_min) {
  const int n = n_vocab_;
  const float tau = cut.tau;
  const int32_t last = cut.last;
  auto kept = [&](int i) { return (w[i] > tau || (w[i] == tau && i <= last)) && w[i] >= w_min; };
  const int nb = (n + kBlock - 1) / kBlock;
  blocks_.resize(nb);
  double total = 0;
  for (int b = 0; b < nb; b++) {
    const int e = std::min(n, (b + 1) * kBlock);
    vf acc = {};
    for_vectors(w, b * kBlock, e, 0.0f, [&](int i, vf x, int) {
      const vi keep = ((x > splat(tau)) | ((x == splat(tau)) & (iota_v() + i <= last))) & (x >= splat(w_min));
      acc += select(keep, x, vf{});
    });
    total += blocks_[b] = hsum(acc);
  }
  const double target = uniform01(rng_) * total;
  double cum = 0;
  int32_t seen = -1;  // last kept id walked: the answer if rounding carries the walk past the end
  for (int b = 0; b < nb; b++) {
    if (cum + blocks_[b] <= target) {
      cum += blocks_[b];
      continue;
    }
    for (int i = b * kBlock, e = std::min(n, i + kBlock); i < e; i++) {
      if (!kept(i)) continue;
      seen = i, cum += w[i];
      if (cum > target) return i;
    }
  }
  if (seen >= 0) return seen;
  for (int i = n - 1; i >= 0; i--)
    if (kept(i)) return i;
  return argmax(w, n).id;  // unreachable: the top weight is always kept
}

namespace {

void raw_logprobs(const float* logits, int n_vocab, float lse, int k, SampleResult& r, std::vector<int32_t>& ids,
                  std::vector<float>& scratch) {
  r.logprob = logits[r.token] - lse;
  if (k <= 0) return;
  top_ids(logits, n_vocab, k, ids, scratch);
  r.top.reserve(ids.size());
  for (int32_t id : ids) r.top.emplace_back(id, logits[id] - lse);
}

}  // namespace

void Sampler::fill_logprobs(const float* logits, float lse, SampleResult& r) {
  raw_logprobs(logits, n_vocab_, lse, cfg_.logprobs, r, cand_, scratch_);
}

SampleResult score_token(const float* logits, int n_vocab, int32_t token, int k, ScoreScratch& s) {
  SampleResult r;
  r.token = token;
  raw_logprobs(logits, n_vocab, logsumexp(logits, n_vocab), k, r, s.ids, s.values);
  return r;
}

}  // namespace pyserve
