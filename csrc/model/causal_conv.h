// causal_conv: the short causal depthwise convolution over each sequence's tokens that both recurrent mixers
// run (Gated DeltaNet's over its qkv, LFM2's short-conv blocks over B·x; llama.cpp: ggml_ssm_conv), with the
// per-sequence conv state (its last K - 1 inputs, oldest first) kept in a RecurrentStatePool slot.
//
// A step's tokens come as runs, one per sequence, consecutive and in order (the engine's batch). Each
// (run, channel) is independent: its taps read the state then the run's own earlier tokens, so a token's
// output depends only on its sequence's earlier inputs (batch-invariant, chunk-invariant).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "kv/recurrent_state.h"
#include "base/threadpool.h"

namespace pyserve {

// A batch's tokens grouped into runs of one sequence (a recurrent state slot) each.
struct SeqRuns {
  std::vector<int64_t> first;  // [n_runs + 1]: the first token of each run, then T
  std::vector<int32_t> slot;   // [n_runs]: each run's state slot
  // slots[T]: each token's slot (a sequence's tokens consecutive). Replaces the previous runs.
  void split(const std::vector<int32_t>& slots, int64_t T);
  int64_t size() const { return (int64_t)slot.size(); }
};

// Where a step's tokens keep their state in the pool: token t's sequence's is slot state[t]; where snapshots
// is not empty and snapshots[t] >= 0, slot snapshots[t] takes a copy of it once token t is in (speculation:
// the state after a drafted row, to roll a rejected draft back to). Both [T].
struct StateSlots {
  const std::vector<int32_t>& state;
  const std::vector<int32_t>& snapshots;  // or empty: none
};

// The weights of a file's conv ([C × K], each channel's taps side by side) as causal_conv reads them: [K × C],
// tap-major (a tap's weights for neighbouring channels side by side). Done once at load.
std::vector<float> conv_taps_major(const std::vector<float>& w, int64_t C, int64_t K);

// x[T × C] ← the causal conv of width K of x with weights wt[K × C] (conv_taps_major: tap 0 the oldest input,
// tap K - 1 the token itself), then SiLU where `silu`. Each run's conv state (states.conv(slot, layer): [K - 1][C]) is read
// as the inputs before its first token and left holding its last K - 1 inputs; where snaps[t] >= 0 (snaps
// [T], or empty: none), slot snaps[t] takes a copy of the state once token t is in. K >= 1.
void causal_conv(ThreadPool& pool, float* x, int64_t C, int64_t K, const float* wt, const SeqRuns& runs,
                 RecurrentStatePool& states, int layer, bool silu, const std::vector<int32_t>& snaps);

}  // namespace pyserve
