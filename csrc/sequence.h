// sequence: one request's state as the scheduler and the engine see it.
//
// One rule drives prefill, chunked prefill and decode alike: a running sequence's computed tokens
// (those whose K/V sit in the cache) catch up with its total tokens (prompt + generated).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  std::vector<int32_t> tokens;       // prompt then generated ids
  int n_prompt = 0;
  int n_computed = 0;                // tokens whose K/V are in the cache
  std::vector<int32_t> block_table;  // logical block → physical block
  SeqStatus status = SeqStatus::WAITING;
  StopConfig stop;
  std::unique_ptr<Sampler> sampler;
  uint64_t arrival = 0;              // admission order, for preemption (latest goes first)

  int n_generated() const { return (int)tokens.size() - n_prompt; }
  int n_pending() const { return (int)tokens.size() - n_computed; }
};

}  // namespace pyserve
