// kv_cache: paged K/V storage (block ids are handed out by BlockManager, block_manager.h).
//
// Storage is one arena for K and one for V, each layer's part of them num_blocks × block_size token slots of
// its own width (layers may differ: gemma4's local and global heads; a layer of width 0 has no storage: it
// reads another layer's), each slot holding the K (or V) vectors of all that layer's KV heads in fp16 (as
// llama.cpp's default; half the memory and bandwidth of f32). The arena is left uninitialised, so pages become
// resident only as tokens are written: memory grows with the tokens in use. A sequence owns a block table
// (logical block i → physical block id); attention reads token j of a sequence at slot
// (table[j / block_size], j % block_size). Throws std::invalid_argument for no blocks or a negative width.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

namespace pyserve {

class KVCache {
 public:
  // kv_dim = n_head_kv * head_dim floats per token slot, for K and for V, in every layer.
  KVCache(int n_layer, int kv_dim, int num_blocks, int block_size);
  // widths[l] floats per token slot in layer l (0: the layer owns no K/V).
  KVCache(const std::vector<int>& widths, int num_blocks, int block_size);
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  size_t bytes() const { return bytes_per_block(widths_, block_size_) * num_blocks_; }
  static size_t bytes_per_block(int n_layer, int kv_dim, int block_size) {
    return 2ull * n_layer * block_size * kv_dim * sizeof(uint16_t);
  }
  static size_t bytes_per_block(const std::vector<int>& widths, int block_size);

  uint16_t* k(int layer, int block, int slot) { return k_.get() + index(layer, block, slot); }
  uint16_t* v(int layer, int block, int slot) { return v_.get() + index(layer, block, slot); }
  // Copies all layers' K/V of block src into block dst (copy-on-write of a shared block).
  void copy_block(int src, int dst);

 private:
  size_t index(int layer, int block, int slot) const {
    return offset_[layer] + ((size_t)block * block_size_ + slot) * widths_[layer];
  }
  std::vector<int> widths_;      // [n_layer] floats per slot
  std::vector<size_t> offset_;   // [n_layer] start of each layer's part of the arenas
  int num_blocks_, block_size_;
  std::unique_ptr<uint16_t[]> k_, v_;  // per layer [num_blocks][block_size][width] fp16
};

}  // namespace pyserve
