// sequence: one request's state as the scheduler and the engine see it.
//
// One rule drives prefill, chunked prefill and decode alike: a running sequence's computed tokens
// (those whose K/V sit in the cache) catch up with its total tokens (prompt + generated).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/block_manager.h"
#include "scheduler/ngram_draft.h"
#include "sampling/sampler.h"

namespace pyserve {

enum class SeqStatus { WAITING, RUNNING, FINISHED };

// An embedding request's pooling of the final-norm hidden states (the output projection's input) of its
// prompt: the last row (vLLM's default for decoder models) or the mean of every row.
enum class Pooling { NONE, LAST, MEAN, RANK };  // RANK: LAST's row through the classifier head (Model::rank)

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
  // Hybrid models: the recurrent state slot (recurrent_state.h) held while running (-1: none), and until an
  // n > 1 request forks, the slots reserved for its other samples.
  int state_slot = -1;
  std::vector<int> spare_slots;
  SeqStatus status = SeqStatus::WAITING;
  StopConfig stop;
  std::unique_ptr<Sampler> sampler;
  // n > 1: the sample indexes this sequence still stands for until its prompt is computed; then it forks
  // into one sequence per index (sharing the prompt's blocks), each with its own sampler (seed + index).
  std::vector<int> pending_samples;
  std::vector<std::unique_ptr<Sampler>> fork_samplers;  // [n], by sample index, until the fork (none in SchedulerSim)
  uint64_t arrival = 0;              // admission order, for preemption (latest goes first)
  int priority = 0;                  // lower is served first (vLLM's `priority`): admission, the step's budget, preemption
  bool return_progress = false;      // an output after each step that computed part of its prompt (StepOutput::progress)
  bool write_through = false;        // with a disk tier: its prompt's full blocks are saved as they are computed
  int n_cached = -1;                 // prompt tokens found in the prefix cache at first admission (-1: not yet)
  double first_scheduled = 0.0;      // monotonic seconds of the step that first scheduled it (0: not yet)
  // What a request may ask of its prompt rows, each recorded once (a recomputation after preemption skips
  // the rows already in): an embedding (pooling; prefill only, nothing drawn) or prompt logprobs.
  Pooling pooling = Pooling::NONE;
  bool normalize = true;             // L2-normalise the pooled vector
  std::vector<double> pooled;        // [n_embd]: the last prompt row, or the sum of every prompt row (mean)
  int prompt_logprobs = -1;          // alternatives per prompt position (< 0: none)
  std::shared_ptr<std::vector<SampleResult>> prompt_lp;  // positions 1, 2, … as recorded; to the first output
  int n_recorded = 0;                // rows [record_begin(), n_recorded) are recorded
  // Speculative decoding (a decoding sequence only): the tokens drafted for this step, which follow `tokens`
  // as extra rows of its decode; the scheduler keeps what fits, the step's sampling verifies them. Empty
  // outside the step that proposed them.
  std::vector<int32_t> draft;
  // A hybrid's drafted decode: [draft size] state slots, j taking the recurrent state after the step's row j
  // (the forward writes them, Batch::snapshots), so verification can keep the state of the rows it accepts.
  // Taken with the draft's rows (Scheduler::add_drafts), freed at its verification or wherever the sequence's
  // slots are.
  std::vector<int> draft_slots;
  // A hybrid's prompt chunk that runs past its last full block's boundary: a state slot the forward copies the
  // state after token checkpoint_at - 1 into (Batch::snapshots), checkpointed there and freed once the step
  // is computed (Scheduler::checkpoint_within), so the chunk need not stop at the boundary.
  int checkpoint_slot = -1;
  int checkpoint_at = 0;
  NgramIndex ngrams;                 // over `tokens`, extended as it grows (built at the first draft)
  // MTP drafting: the MTP layer's guess of the token after the pending one, made when tokens had mtp_at
  // entries (stale once they have more).
  int32_t mtp_next = -1;
  int mtp_at = -1;
  DraftPolicy draft_policy;

  int n_generated() const { return (int)tokens.size() - n_prompt; }
  int n_pending() const { return (int)tokens.size() - n_computed; }
  bool prefill_only() const { return pooling != Pooling::NONE || stop.max_tokens == 0; }
  // Prompt rows [record_begin(), record_end()) whose output is recorded: row p's logits score token p + 1.
  int record_begin() const { return pooling == Pooling::LAST || pooling == Pooling::RANK ? n_prompt - 1 : 0; }
  int record_end() const {
    return pooling != Pooling::NONE ? n_prompt : prompt_logprobs >= 0 ? n_prompt - 1 : 0;
  }
  // The rows to record when the next n tokens are computed: [first, second), empty when first >= second.
  std::pair<int, int> rows_to_record(int n) const {
    return {std::max(n_computed, n_recorded), std::min(n_computed + n, record_end())};
  }
  // Leading tokens a prefix-cache hit may skip: none whose row is still to be recorded (the last prompt row,
  // LAST pooling's, is never a hit: lookup leaves the last token's block out).
  int cacheable() const { return n_recorded < record_end() ? n_recorded : (int)tokens.size(); }

  // A sibling sample after the prompt: same request, tokens and stop config; no blocks or sampler yet
  // (the caller forks the block table and gives it its own sampler).
  std::unique_ptr<Sequence> sibling(int sample_index) const {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->index = sample_index;
    s->tokens = tokens;
    s->n_prompt = n_prompt;
    s->first_scheduled = first_scheduled;
    s->priority = priority;
    s->stop = stop;
    return s;
  }
};

}  // namespace pyserve
