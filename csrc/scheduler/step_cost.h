// step_cost: predicts an engine step's wall time from what it holds, fitted online, and turns a step-time
// target into how many prompt tokens a step may take beside its decodes.
//
// What a step holds is counted in multiply-adds from the model's shape: every row through the layers, each
// sampled row also through the vocabulary projection, attention over each row's context. Time ≈ a + b·MACs:
// `a` is the floor of a step (the weights streamed from memory once however few rows, the pool's barriers),
// `b` the compute rate. Two numbers, fitted by recursive least squares with forgetting on the engine's own
// step timings: well conditioned (steps of every size feed it) and following the machine (other load, clock)
// within ~50 steps. Seeded by two scratch forwards when the engine starts.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace pyserve {

// Multiply-adds per unit of work, from the model's hyper-parameters.
struct StepMacs {
  double per_row = 0;      // one row through every layer
  double per_logit = 0;    // one row through the output projection
  double per_context = 0;  // attention of one row over one position of context
};

struct StepShape {
  int tokens = 0;       // rows through the layers
  int logit_rows = 0;   // rows projected to the vocabulary and sampled
  double context = 0;   // Σ over rows of the positions attended
  // n_tokens rows from first_pos, the last `sampled` of them projected (a decode 1, a verified draft 1 + k)
  void add(int n_tokens, int first_pos, int sampled) {
    tokens += n_tokens;
    logit_rows += sampled;
    // rows first_pos … first_pos + n - 1 attend to first_pos + 1 … first_pos + n positions
    context += (double)n_tokens * first_pos + (double)n_tokens * (n_tokens + 1) / 2;
  }
  double macs(const StepMacs& m) const { return tokens * m.per_row + logit_rows * m.per_logit + context * m.per_context; }
};

// What the forward pass of r rows, every one projected to logits, takes, r = 1 … spec_rows: seeded when the
// engine starts (the least of a few scratch forwards each), then followed on the steps of decodes and drafts
// alone. The forward only: a drafted row that is accepted is sampled in place of a later decode's draw. The
// forward is memory-bound for a few rows — the weights stream once — and then compute-bound: a knee no line
// fits, and drafted rows are priced on it.
struct RowCosts {
  static constexpr double kFollow = 0.1;  // weight of each observed step
  std::vector<double> seconds;            // [r]: the forward of r rows; seconds[0] = 0
  void observe(int rows, double s) {
    if (rows >= 1 && rows < (int)seconds.size()) seconds[rows] += kFollow * (s - seconds[rows]);
  }
  // A row must be expected to give kMargin × √streams times the tokens its time would give the step: slack for
  // the estimate's error (p is a guess from few drafts, optimistic by its prior), and for whom the gain goes
  // to — the drafting stream alone, while every stream in the step waits for the slower step (√: between the
  // step's throughput, 1, and each stream paying for all, streams).
  static constexpr double kMargin = 1.25;
  // Whether one more row expected to give `gain` tokens raises the tokens per second of a step of `rows` rows
  // and `streams` decodes, expected to give `tokens`, by that margin: (tokens + gain / margin) / T(rows + 1) >
  // tokens / T(rows).
  bool worth(double gain, double tokens, int rows, int streams) const {
    if (rows < 1 || rows + 1 >= (int)seconds.size()) return false;
    const double margin = kMargin * std::sqrt((double)std::max(streams, 1));
    return (tokens + gain / margin) * seconds[rows] > tokens * seconds[rows + 1];
  }
};

class StepCostModel {
 public:
  explicit StepCostModel(const StepMacs& macs = {});
  double predict(const StepShape& s) const;             // seconds
  void observe(const StepShape& s, double seconds);     // one step's measured wall time
  double chunk_cost(int n, int pos, int sampled) const;  // seconds n rows (the last `sampled` projected) add
  // The most tokens n ≤ cap of a prompt chunk starting at position `pos` (its last row sampled if
  // `sampled_if_last` and n == cap) that add at most `seconds` to a step; 0 when not even one fits.
  int tokens_within(double seconds, int pos, int cap, bool sampled_if_last) const;
  std::array<double, 2> weights() const { return {w_[0], w_[1]}; }  // a (s), b (s per GMAC)
  void set_weights(double floor_s, double s_per_gmac) { w_ = {std::max(floor_s, 0.0), std::max(s_per_gmac, 0.0)}; }

 private:
  static constexpr double kForget = 0.98;  // a step's weight halves after ~35 steps
  static constexpr double kPrior = 1.0;    // P's prior diagonal (weights in s and s/GMAC: a weak prior)
  static constexpr double kMaxTrace = 2 * kPrior;
  double gmacs(const StepShape& s) const { return s.macs(macs_) * 1e-9; }
  StepMacs macs_;
  std::array<double, 2> w_{1e-3, 1e-2};  // 1 ms a step, 10 ms a GMAC until seeded
  std::array<std::array<double, 2>, 2> P_{{{kPrior, 0}, {0, kPrior}}};
};

}  // namespace pyserve
