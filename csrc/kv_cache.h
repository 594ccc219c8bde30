// kv_cache: paged K/V storage (block ids are handed out by BlockManager, block_manager.h).
//
// Storage is one arena per layer of num_blocks × block_size token slots, each slot holding the K (or V)
// vectors of all KV heads in fp16 (as llama.cpp's default; half the memory and bandwidth of f32). The
// arena is left uninitialised, so pages become resident only as tokens are written: memory grows with
// the tokens in use. A sequence owns a block table (logical block i → physical block id); attention
// reads token j of a sequence at slot (table[j / block_size], j % block_size).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

namespace pyserve {

class KVCache {
 public:
  // kv_dim = n_head_kv * head_dim floats per token slot, for K and for V.
  KVCache(int n_layer, int kv_dim, int num_blocks, int block_size);
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  size_t bytes() const { return bytes_per_block(n_layer_, kv_dim_, block_size_) * num_blocks_; }
  static size_t bytes_per_block(int n_layer, int kv_dim, int block_size) {
    return 2ull * n_layer * block_size * kv_dim * sizeof(uint16_t);
  }

  uint16_t* k(int layer, int block, int slot) { return k_.get() + index(layer, block, slot); }
  uint16_t* v(int layer, int block, int slot) { return v_.get() + index(layer, block, slot); }
  // Copies all layers' K/V of block src into block dst (copy-on-write of a shared block).
  void copy_block(int src, int dst);

 private:
  size_t index(int layer, int block, int slot) const {
    return (((size_t)layer * num_blocks_ + block) * block_size_ + slot) * kv_dim_;
  }
  int n_layer_, kv_dim_, num_blocks_, block_size_;
  std::unique_ptr<uint16_t[]> k_, v_;  // [n_layer][num_blocks][block_size][kv_dim] fp16
};

}  // namespace pyserve
