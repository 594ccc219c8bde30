#include "kv/recurrent_state.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace pyserve {

RecurrentStatePool::RecurrentStatePool(int n_slots, int n_layers, int64_t conv_floats, int64_t mat_floats)
    : n_slots_(n_slots), n_layers_(n_layers), conv_floats_(conv_floats), mat_floats_(mat_floats),
      slot_floats_(slot_bytes(n_layers, conv_floats, mat_floats) / (int64_t)sizeof(float)) {
  if (n_slots < 0 || n_layers < 0 || conv_floats < 0 || mat_floats < 0)
    throw std::invalid_argument("recurrent state pool: negative size");
  const size_t n = (size_t)n_slots * (size_t)std::max<int64_t>(1, slot_floats_);
  data_.reset(static_cast<float*>(std::calloc(n, sizeof(float))));
  if (!data_) throw std::runtime_error("recurrent state pool: cannot allocate " + std::to_string(n * 4) + " bytes");
  used_.assign(n_slots, 0);
  for (int s = n_slots - 1; s >= 0; s--) free_.push_back(s);
}

int RecurrentStatePool::acquire(bool zeroed) {
  if (free_.empty()) return -1;
  const int s = free_.back();
  free_.pop_back();
  used_[s] = 1;
  if (zeroed) std::memset(slot(s), 0, (size_t)slot_floats_ * sizeof(float));
  return s;
}

void RecurrentStatePool::release(int s) {
  if (s < 0) return;
  if (s >= n_slots_ || !used_[s]) throw std::logic_error("recurrent state slot " + std::to_string(s) + " is not in use");
  used_[s] = 0;
  free_.push_back(s);
}

void RecurrentStatePool::copy(int src, int dst) {
  std::memcpy(slot(dst), slot(src), (size_t)slot_floats_ * sizeof(float));
}

void RecurrentStatePool::copy_from(const RecurrentStatePool& other, int src, int dst) {
  if (other.slot_floats_ != slot_floats_) throw std::logic_error("recurrent state pools of different layouts");
  std::memcpy(slot(dst), other.slot(src), (size_t)slot_floats_ * sizeof(float));
}

float* RecurrentStatePool::conv(int s, int layer) {
  assert(s >= 0 && s < n_slots_ && layer < n_layers_);
  return slot(s) + (int64_t)layer * (conv_floats_ + mat_floats_);
}

float* RecurrentStatePool::mat(int s, int layer) { return conv(s, layer) + conv_floats_; }

}  // namespace pyserve
