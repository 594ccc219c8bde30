#include "kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pyserve {

KVCache::KVCache(int n_layer, int kv_dim, int num_blocks, int block_size)
    : KVCache(std::vector<int>(std::max(0, n_layer), kv_dim), num_blocks, block_size) {}

KVCache::KVCache(const std::vector<int>& widths, int num_blocks, int block_size)
    : widths_(widths), num_blocks_(num_blocks), block_size_(block_size) {
  if (num_blocks <= 0 || block_size <= 0) throw std::invalid_argument("KV cache needs at least one block");
  size_t n = 0;
  for (int w : widths_) {
    if (w < 0) throw std::invalid_argument("KV cache layer width " + std::to_string(w) + " is negative");
    offset_.push_back(n);
    n += (size_t)num_blocks * block_size * w;
  }
  k_.reset(new uint16_t[std::max<size_t>(n, 1)]);  // uninitialised on purpose: see the header
  v_.reset(new uint16_t[std::max<size_t>(n, 1)]);
}

size_t KVCache::bytes_per_block(const std::vector<int>& widths, int block_size) {
  size_t floats = 0;
  for (int w : widths) floats += (size_t)w;
  return 2ull * block_size * floats * sizeof(uint16_t);
}

void KVCache::copy_block(int src, int dst) {
  for (size_t l = 0; l < widths_.size(); l++) {
    if (widths_[l] == 0) continue;
    const size_t len = (size_t)block_size_ * widths_[l];
    std::memcpy(k((int)l, dst, 0), k((int)l, src, 0), len * sizeof(uint16_t));
    std::memcpy(v((int)l, dst, 0), v((int)l, src, 0), len * sizeof(uint16_t));
  }
}

}  // namespace pyserve
