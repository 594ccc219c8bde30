#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace pyserve {

KVCache::KVCache(const std::vector<int>& widths, int num_blocks, int block_size, KVDType dtype)
    : widths_(widths), num_blocks_(num_blocks), block_size_(block_size), dtype_(dtype) {
  if (num_blocks <= 0 || block_size <= 0) throw std::invalid_argument("KV cache needs at least one block");
  size_t n = 0;
  for (int w : widths_) {
    if (w < 0) throw std::invalid_argument("KV cache layer width " + std::to_string(w) + " is negative");
    if (w % kv_dtype_block(dtype))
      throw std::invalid_argument("KV cache layer width " + std::to_string(w) + " is not a multiple of " +
                                  std::to_string(kv_dtype_block(dtype)) + " (kv_cache_dtype " + kv_dtype_name(dtype) + ")");
    offset_.push_back(n);
    row_bytes_.push_back(kv_row_bytes(dtype, w));
    n += (size_t)num_blocks * block_size * row_bytes_.back();
  }
  k_.reset(new uint8_t[std::max<size_t>(n, 1)]);  // uninitialised on purpose: see the header
  v_.reset(new uint8_t[std::max<size_t>(n, 1)]);
}

size_t KVCache::bytes_per_block(const std::vector<int>& widths, int block_size, KVDType dtype) {
  size_t bytes = 0;
  for (int w : widths) bytes += kv_row_bytes(dtype, w);
  return 2ull * block_size * bytes;
}

void KVCache::copy_block(int src, int dst) {
  for (size_t l = 0; l < widths_.size(); l++) {
    if (widths_[l] == 0) continue;
    const size_t len = (size_t)block_size_ * row_bytes_[l];
    std::memcpy(k((int)l, dst, 0), k((int)l, src, 0), len);
    std::memcpy(v((int)l, dst, 0), v((int)l, src, 0), len);
  }
}

void KVCache::save_block(int block, uint8_t* dst) const {
  for (size_t l = 0; l < widths_.size(); l++) {
    const size_t len = (size_t)block_size_ * row_bytes_[l];
    if (len == 0) continue;
    std::memcpy(dst, k((int)l, block, 0), len);
    std::memcpy(dst + len, v((int)l, block, 0), len);
    dst += 2 * len;
  }
}

void KVCache::load_block(int block, const uint8_t* src) {
  for (size_t l = 0; l < widths_.size(); l++) {
    const size_t len = (size_t)block_size_ * row_bytes_[l];
    if (len == 0) continue;
    std::memcpy(k((int)l, block, 0), src, len);
    std::memcpy(v((int)l, block, 0), src + len, len);
    src += 2 * len;
  }
}

}  // namespace pyserve
