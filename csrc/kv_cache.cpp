#include "kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pyserve {

KVCache::KVCache(int n_layer, int kv_dim, int num_blocks, int block_size)
    : n_layer_(n_layer), kv_dim_(kv_dim), num_blocks_(num_blocks), block_size_(block_size) {
  if (num_blocks <= 0 || block_size <= 0) throw std::invalid_argument("KV cache needs at least one block");
  size_t n = (size_t)n_layer * num_blocks * block_size * kv_dim;
  k_.reset(new uint16_t[n]);  // uninitialised on purpose: see the header
  v_.reset(new uint16_t[n]);
}

void KVCache::copy_block(int src, int dst) {
  size_t len = (size_t)block_size_ * kv_dim_;
  for (int l = 0; l < n_layer_; l++) {
    std::memcpy(k(l, dst, 0), k(l, src, 0), len * sizeof(uint16_t));
    std::memcpy(v(l, dst, 0), v(l, src, 0), len * sizeof(uint16_t));
  }
}

}  // namespace pyserve
