// sampler: turns one row of logits into the next token, per request, with its log-probabilities.
//
// Order (as vLLM): logit bias → repetition / presence / frequency penalties → temperature → top-k → top-p →
// min-p → draw. temperature == 0 is greedy (argmax after bias and penalties; ties go to the lowest id).
// Log-probabilities are always those of the raw model distribution (log-softmax of the unmodified logits),
// as llama.cpp's n_probs and vLLM's default report them.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pyserve {

struct SamplingConfig {
  float temperature = 1.0f;        // 0 = greedy
  int top_k = 0;                   // <= 0: off
  float top_p = 1.0f;              // (0, 1]
  float min_p = 0.0f;              // [0, 1]
  float repetition_penalty = 1.0f; // > 0; applies to prompt and output tokens (as vLLM / HF)
  float presence_penalty = 0.0f;   // output tokens only
  float frequency_penalty = 0.0f;  // output tokens only
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  int64_t seed = -1;               // < 0: a random seed
  int logprobs = -1;               // number of top alternatives to report; < 0: none
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                            // raw log-softmax of the chosen token
  std::vector<std::pair<int32_t, float>> top;      // the `logprobs` best (id, raw logprob), best first
};

class Sampler {
 public:
  // Throws std::invalid_argument on a parameter out of range or a logit_bias id outside [0, n_vocab).
  Sampler(const SamplingConfig& cfg, int n_vocab);

  // Prompt tokens, for the repetition penalty.
  void set_prompt(const std::vector<int32_t>& prompt);
  // Picks the next token from logits[n_vocab] (not modified) and records it as an output token.
  SampleResult sample(const float* logits);

 private:
  SamplingConfig cfg_;
  int n_vocab_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> output_counts_;  // token id → times generated
  std::vector<uint8_t> in_prompt_;                  // [n_vocab] 1 where the token occurs in the prompt
  std::vector<float> work_;                         // [n_vocab] scratch: the modified logits
};

// Log-softmax helpers, exposed for tests: logsumexp of logits[n].
float logsumexp(const float* logits, int n);

}  // namespace pyserve
