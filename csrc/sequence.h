// sequence: one request's state as the scheduler and the engine see it.
//
// One rule drives prefill, chunked prefill and decode alike: a running sequence's computed tokens
// (those whose K/V sit in the cache) catch up with its total tokens (prompt + generated).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "block_manager.h"
#include "sampler.h"

namespace pyserve {

enum class SeqStatus { WAITING, RUNNING, FINISHED };

struct StopConfig {
  int max_tokens = 16;                 // generated tokens at most
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids; // besides the model's EOS tokens
};

struct Sequence {
  std::string id;
  int index = 0;                     // which of the request's n samples (after the fork)
  std::vector<int32_t> tokens;       // prompt then generated ids
  int n_prompt = 0;
  int n_computed = 0;                // tokens whose K/V are in the cache
  BlockTable blocks;                 // logical block → physical block, and the prefix-cache hashes
  SeqStatus status = SeqStatus::WAITING;
  StopConfig stop;
  std::unique_ptr<Sampler> sampler;
  // n > 1: the sample indexes this sequence still stands for until its prompt is computed; then it forks
  // into one sequence per index (sharing the prompt's blocks), each with its own sampler (seed + index).
  std::vector<int> pending_samples;
  std::vector<std::unique_ptr<Sampler>> fork_samplers;  // [n], by sample index, until the fork
  uint64_t arrival = 0;              // admission order, for preemption (latest goes first)
  int n_cached = -1;                 // prompt tokens found in the prefix cache at first admission (-1: not yet)
  double first_scheduled = 0.0;      // monotonic seconds of the step that first scheduled it (0: not yet)

  int n_generated() const { return (int)tokens.size() - n_prompt; }
  int n_pending() const { return (int)tokens.size() - n_computed; }

  // A sibling sample after the prompt: same request, tokens and stop config; no blocks or sampler yet
  // (the caller forks the block table and gives it its own sampler).
  std::unique_ptr<Sequence> sibling(int sample_index) const {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->index = sample_index;
    s->tokens = tokens;
    s->n_prompt = n_prompt;
    s->first_scheduled = first_scheduled;
    s->stop = stop;
    return s;
  }
};

}  // namespace pyserve
