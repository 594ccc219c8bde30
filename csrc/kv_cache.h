// kv_cache: paged K/V storage and the pool of its blocks.
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

// Reference-counted block ids. allocate() throws std::runtime_error when none is free: callers check
// num_free() (or can_allocate) first.
class BlockPool {
 public:
  explicit BlockPool(int num_blocks);
  int num_blocks() const { return (int)ref_.size(); }
  int num_free() const { return (int)free_.size(); }
  int num_used() const { return num_blocks() - num_free(); }
  bool can_allocate(int n) const { return n <= num_free(); }
  int allocate();
  void retain(int block) { ref_.at(block)++; }
  // Drops one reference; the block returns to the free list at zero. Returns the remaining count.
  int release(int block);
  int ref_count(int block) const { return ref_.at(block); }

 private:
  std::vector<int> ref_;   // [num_blocks]
  std::vector<int> free_;  // a stack of free ids
};

}  // namespace pyserve
