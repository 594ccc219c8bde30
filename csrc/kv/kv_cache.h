// kv_cache: paged K/V storage (block ids are handed out by BlockManager, block_manager.h).
//
// Storage is one arena for K and one for V, each layer's part of them num_blocks × block_size token slots of
// its own width (layers may differ: gemma4's local and global heads; a layer of width 0 has no storage: it
// reads another layer's), each slot holding the K (or V) vectors of all that layer's KV heads as one row in
// the cache's dtype (kv_rows.h: f16 by default, as llama.cpp's; f32, bf16, or q8_0 blocks of 32, each
// head's part of a row starting at head · kv_row_bytes(dtype, head_dim)). The arena is left uninitialised,
// so pages become resident only as tokens are written: memory grows with the tokens in use. A sequence owns
// a block table (logical block i → physical block id); attention reads token j of a sequence at slot
// (table[j / block_size], j % block_size). Throws std::invalid_argument for no blocks, a negative width, or
// a width that is not a whole number of the dtype's blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kv/kv_rows.h"

namespace pyserve {

class KVCache {
 public:
  // widths[l] values per token slot in layer l (0: the layer owns no K/V).
  KVCache(const std::vector<int>& widths, int num_blocks, int block_size, KVDType dtype = KVDType::F16);
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  KVDType dtype() const { return dtype_; }
  size_t bytes() const { return bytes_per_block(widths_, block_size_, dtype_) * num_blocks_; }
  // K and V of every layer for one block of block_size slots.
  static size_t bytes_per_block(const std::vector<int>& widths, int block_size, KVDType dtype);

  uint8_t* k(int layer, int block, int slot) { return k_.get() + index(layer, block, slot); }
  uint8_t* v(int layer, int block, int slot) { return v_.get() + index(layer, block, slot); }
  const uint8_t* k(int layer, int block, int slot) const { return k_.get() + index(layer, block, slot); }
  const uint8_t* v(int layer, int block, int slot) const { return v_.get() + index(layer, block, slot); }
  // Copies all layers' K/V of block src into block dst (copy-on-write of a shared block).
  void copy_block(int src, int dst);
  // A block's K/V as bytes [block_bytes()]: each layer's K rows, then its V rows (the disk tier's payload).
  size_t block_bytes() const { return bytes_per_block(widths_, block_size_, dtype_); }
  void save_block(int block, uint8_t* dst) const;
  void load_block(int block, const uint8_t* src);

 private:
  size_t index(int layer, int block, int slot) const {
    return offset_[layer] + ((size_t)block * block_size_ + slot) * row_bytes_[layer];
  }
  std::vector<int> widths_;       // [n_layer] values per slot
  std::vector<size_t> row_bytes_;  // [n_layer] bytes per slot: kv_row_bytes(dtype, width)
  std::vector<size_t> offset_;    // [n_layer] byte offset of each layer's part of the arenas
  int num_blocks_, block_size_;
  KVDType dtype_;
  std::unique_ptr<uint8_t[]> k_, v_;  // per layer [num_blocks][block_size][row_bytes]
};

}  // namespace pyserve
