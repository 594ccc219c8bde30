// state_checkpoints: prefix caching for hybrid models. A cached run of KV blocks is of no use to a sequence of
// a model with recurrent layers unless the recurrent state at the run's end is known too; this store keeps
// copies of sequences' states at block boundaries (taken when a step ends on one), keyed by the tokens before
// the boundary and its block table's root (a cache salt's checkpoints are its own, as its blocks are), so an
// admitted sequence whose cached prefix ends at a checkpoint resumes there instead of at
// token 0.
//
// Its own budget: a fixed number of slots (a RecurrentStatePool of the live pool's layout), evicted least
// recently used. A checkpoint is independent of the blocks: one whose blocks were evicted is never reached
// (the lookup stops where the cached blocks do) and ages out. Lookups compare the tokens, not only their hash,
// so a collision cannot hand a sequence another prefix's state.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "kv/recurrent_state.h"
#include "scheduler/block_manager.h"

namespace pyserve {

class StateCheckpoints {
 public:
  // capacity slots (>= 1), each as large as one of `live`'s.
  StateCheckpoints(int capacity, int n_layers, int64_t conv_floats, int64_t mat_floats);

  // The largest k <= n_blocks such that a checkpoint after tokens[0, k · block_size) is held (0: none).
  int usable(const std::vector<int32_t>& tokens, int n_blocks, int block_size, uint64_t root = kRootHash) const;
  // Keeps live slot `slot` as the state after tokens[0, n_tokens) (refreshes it if already held).
  void save(const std::vector<int32_t>& tokens, int n_tokens, const RecurrentStatePool& live, int slot,
            uint64_t root = kRootHash);
  // live slot `slot` = the checkpoint after tokens[0, n_tokens); false (nothing changed) when none is held.
  bool restore(const std::vector<int32_t>& tokens, int n_tokens, RecurrentStatePool& live, int slot,
               uint64_t root = kRootHash);

  int capacity() const { return store_.num_slots(); }
  int size() const { return (int)by_hash_.size(); }
  uint64_t restored() const { return restored_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;  // the prefix it follows
    uint64_t root;                // the block table root it was saved under
    int slot;                     // in store_
    std::list<uint64_t>::iterator lru;
  };
  static uint64_t prefix_hash(uint64_t root, const int32_t* tokens, int n);
  const Entry* find(const std::vector<int32_t>& tokens, int n, uint64_t root) const;
  void touch(const Entry& e);

  RecurrentStatePool store_;
  std::unordered_map<uint64_t, Entry> by_hash_;
  std::list<uint64_t> lru_;  // front: evicted first
  uint64_t restored_ = 0;
};

}  // namespace pyserve
