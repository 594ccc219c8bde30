// step_cost: see step_cost.h.
#include "scheduler/step_cost.h"

#include <algorithm>
#include <cmath>

namespace pyserve {

StepCostModel::StepCostModel(const StepMacs& macs) : macs_(macs) {}

double StepCostModel::predict(const StepShape& s) const { return w_[0] + w_[1] * gmacs(s); }

// Recursive least squares with forgetting on x = (1, GMACs): k = P x / (λ + xᵀ P x); w += k (y − wᵀ x);
// P = (P − k xᵀ P) / λ, its trace held under a bound (steps of one size alone would otherwise wind it up).
void StepCostModel::observe(const StepShape& s, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  const double x[2] = {1.0, gmacs(s)};
  const double px[2] = {P_[0][0] * x[0] + P_[0][1] * x[1], P_[1][0] * x[0] + P_[1][1] * x[1]};
  const double denom = kForget + x[0] * px[0] + x[1] * px[1];
  const double err = seconds - (w_[0] * x[0] + w_[1] * x[1]);
  // projected onto w >= 0: a step's floor and the compute rate are never negative, though noisy timings (a
  // busy machine) can pull the unconstrained fit below 0
  for (int i = 0; i < 2; i++) w_[i] = std::max(w_[i] + px[i] / denom * err, 0.0);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) P_[i][j] = (P_[i][j] - px[i] * px[j] / denom) / kForget;
  const double trace = P_[0][0] + P_[1][1];
  if (trace > kMaxTrace)
    for (auto& row : P_)
      for (double& v : row) v *= kMaxTrace / trace;
}

double StepCostModel::chunk_cost(int n, int pos, int sampled) const {
  StepShape s;
  s.add(n, pos, sampled);
  return w_[1] * gmacs(s);
}

int StepCostModel::tokens_within(double seconds, int pos, int cap, bool sampled_if_last) const {
  int lo = 0, hi = std::max(cap, 0);  // cost grows with n: the largest n whose cost fits
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (chunk_cost(mid, pos, sampled_if_last && mid == cap) <= seconds) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace pyserve
