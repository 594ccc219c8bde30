// sampler: turns one row of logits into the next token, per request, with its log-probabilities.
//
// Order (as vLLM): grammar mask (disallowed ids to -inf; sampler owns the sample's Matcher) → logit bias → repetition / presence / frequency penalties → temperature → top-k → top-p →
// min-p → draw. temperature == 0 (< 1e-5) is greedy (argmax after bias and penalties; ties go to the lowest id).
// Log-probabilities are always those of the raw model distribution (log-softmax of the unmodified logits),
// as llama.cpp's n_probs and vLLM's default report them.
#pragma once

#include <cstdint>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sampling/grammar.h"

namespace pyserve {

struct SamplingConfig {
  float temperature = 1.0f;        // 0 (below 1e-5, as vLLM) = greedy
  int top_k = 0;                   // <= 0: off
  float top_p = 1.0f;              // (0, 1]
  float min_p = 0.0f;              // [0, 1]
  float repetition_penalty = 1.0f; // > 0; applies to prompt and output tokens (as vLLM / HF)
  float presence_penalty = 0.0f;   // output tokens only
  float frequency_penalty = 0.0f;  // output tokens only
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  int64_t seed = -1;               // < 0: a random seed
  int logprobs = -1;               // number of top alternatives to report; < 0: none
  int min_tokens = 0;              // outputs before `min_tokens_banned` may be drawn (vLLM's min_tokens)
  std::vector<int32_t> min_tokens_banned;  // the ids that would end it early (EOS, stop ids; the engine's)
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                            // raw log-softmax of the chosen token
  std::vector<std::pair<int32_t, float>> top;      // the `logprobs` best (id, raw logprob), best first
  // With a grammar: "stop" once the drawn token completes it (only end-of-generation may follow), "error:
  // grammar: …" if the matcher failed; "" otherwise
  std::string grammar_end;
};

class Sampler {
 public:
  // Throws std::invalid_argument as check_sampling(cfg, n_vocab).
  Sampler(const SamplingConfig& cfg, int n_vocab);

  // Prompt tokens, for the repetition penalty; throws as check_token_id("prompt", …).
  void set_prompt(const std::vector<int32_t>& prompt);
  // Picks the next token from logits[n_vocab] (not modified) and records it as an output token. The token
  // is an id in [0, n_vocab) whatever the logits hold (NaN and ±inf too): the forward pass relies on it.
  // With a grammar, only the ids it allows are drawn (ids outside it get -inf first); the drawn token is
  // consumed by the matcher.
  SampleResult sample(const float* logits);
  // Constrains every later draw to `m`'s grammar (null: none).
  void set_grammar(std::unique_ptr<Matcher> m);
  // How many of `tokens` in a row the grammar would let this sampler draw next (all without a grammar).
  int grammar_accepts(const std::vector<int32_t>& tokens) const {
    return grammar_ ? grammar_->validate(tokens.data(), (int)tokens.size()) : (int)tokens.size();
  }

 private:
  // A kept prefix of the order (weight desc, id asc): {w > tau} ∪ {w == tau, id <= last}; mass = its total weight.
  struct Cut {
    float tau;
    int32_t last;
    double mass;
  };
  // Wanted: the first prefix with count >= top_k or mass >= top_p × the mass it applies to.
  struct Criterion {
    int64_t count;
    double mass;
    bool met(int64_t c, double m) const { return c >= count || m >= mass; }
  };
  struct Above {  // count and weight of {w > t}
    int64_t count = 0;
    double mass = 0;
  };
  static void above2(const float* w, int n, float t1, float t2, Above& a1, Above& a2);

  const float* modified_logits(const float* logits, bool masked);  // logits itself when nothing applies, else work_
  bool load_mask(std::string& error);                 // the grammar's mask into mask_; false: matcher error
  void apply_mask(const float* logits, float* m) const;
  int32_t first_allowed() const;                      // the lowest id mask_ allows (-1: none)
  void advance_grammar(SampleResult& r);
  int32_t draw_token(const float* m, float m_max, double* z);
  Cut find_cut(const float* w, const Criterion& crit, const Cut& none_met, double z);
  Cut refine(const float* w, const Criterion& crit, double z);
  static std::optional<Cut> walk_sorted(const float* w, std::vector<int32_t>& ids, const Above& before,
                                        const Criterion& crit);
  bool guess_pivots(float lo, float hi, const Above& at_hi, const Criterion& crit, float& p1, float& p2) const;
  int32_t draw(const float* w, const Cut& cut, float w_min);
  void fill_logprobs(const float* logits, float lse, SampleResult& r);

  SamplingConfig cfg_;
  int n_vocab_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> output_counts_;  // token id → times generated
  int64_t n_out_ = 0;                               // tokens sampled so far
  std::vector<uint8_t> in_prompt_;                  // [n_vocab] 1 where the token occurs in the prompt (rep. penalty only)
  std::vector<int32_t> prompt_ids_;                 // distinct prompt tokens, in first-seen order
  std::vector<float> work_;                         // [n_vocab] scratch: the modified logits, then their weights
  std::vector<int32_t> top_;                        // exact best ids of work_, sorted (when top_valid_)
  bool top_valid_ = false;
  std::vector<int32_t> cand_;                       // ids around a cut, or the reported top logprobs
  std::vector<float> vals_;                         // weights of cand_
  std::vector<float> samples_;                      // strided subsample of the weights, sorted descending
  int sample_stride_ = 1;
  std::vector<float> scratch_;                      // for top_ids
  std::vector<double> blocks_;                      // kept weight per block of work_, for the draw
  std::unique_ptr<Matcher> grammar_;                // this sample's constraint (null: none)
  std::vector<uint32_t> mask_;                      // [⌈n_vocab / 32⌉] the ids grammar_ allows next, one bit each
};

// A sampling parameter's range: lo < x (lo_open) or lo <= x, and x < hi (hi_open) or x <= hi, x finite. The
// one statement of it: check_sampling applies it, the HTTP layer declares it on its fields (sampling_bounds).
struct Bound {
  const char* name;
  double lo, hi;
  bool lo_open, hi_open;
  const char* rule;  // as the error message says it: "in (0, 1]"
  bool holds(double x) const;
};

enum BoundId { kTemperature, kTopK, kTopP, kMinP, kRepetitionPenalty, kPresencePenalty, kFrequencyPenalty,
               kMinTokens, kNumBounds };
extern const Bound kSamplingBounds[kNumBounds];  // [BoundId]

// The rules of the sampling parameters that need no model (kSamplingBounds, logit_bias values). Throws
// std::invalid_argument whose message starts with the parameter's name ("top_p must be in (0, 1], got 2").
void check_sampling(const SamplingConfig& c);
// The same, plus the rules against a vocabulary of n_vocab ids: logit_bias ids, logprobs <= n_vocab.
void check_sampling(const SamplingConfig& c, int n_vocab);
// Throws std::invalid_argument "<field>: token id <id> is outside the vocabulary [0, n_vocab)" unless
// 0 <= id < n_vocab.
void check_token_id(const char* field, int64_t id, int n_vocab);

// Log-softmax helpers, exposed for tests: logsumexp of logits[n].
float logsumexp(const float* logits, int n);

// Buffers for score_token, reused across calls (one per thread).
struct ScoreScratch {
  std::vector<int32_t> ids;
  std::vector<float> values;
};
// `token`'s raw log-probability under logits[n_vocab] and the k best (id, logprob), best first: what
// Sampler::sample reports when it draws that token, bit for bit (the same log-sum-exp: at temperature 1 the
// sampler reuses its draw's sum, which is the same sum_exp of the same row).
SampleResult score_token(const float* logits, int n_vocab, int32_t token, int k, ScoreScratch& s);

}  // namespace pyserve
