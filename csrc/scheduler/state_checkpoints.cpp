#include "scheduler/state_checkpoints.h"

#include <algorithm>

#include "scheduler/block_manager.h"

namespace pyserve {

StateCheckpoints::StateCheckpoints(int capacity, int n_layers, int64_t conv_floats, int64_t mat_floats)
    : store_(std::max(1, capacity), n_layers, conv_floats, mat_floats) {}

uint64_t StateCheckpoints::prefix_hash(uint64_t root, const int32_t* tokens, int n) {
  return BlockManager::hash_block(root ^ 0x51a7e5ull, tokens, n);
}

const StateCheckpoints::Entry* StateCheckpoints::find(const std::vector<int32_t>& tokens, int n, uint64_t root) const {
  if (n <= 0 || n > (int)tokens.size()) return nullptr;
  const auto it = by_hash_.find(prefix_hash(root, tokens.data(), n));
  if (it == by_hash_.end() || it->second.root != root || (int)it->second.tokens.size() != n ||
      !std::equal(tokens.begin(), tokens.begin() + n, it->second.tokens.begin()))
    return nullptr;
  return &it->second;
}

int StateCheckpoints::usable(const std::vector<int32_t>& tokens, int n_blocks, int block_size, uint64_t root) const {
  for (int k = n_blocks; k > 0; k--)
    if (find(tokens, k * block_size, root)) return k;
  return 0;
}

void StateCheckpoints::touch(const Entry& e) { lru_.splice(lru_.end(), lru_, e.lru); }

void StateCheckpoints::save(const std::vector<int32_t>& tokens, int n, const RecurrentStatePool& live, int slot,
                            uint64_t root) {
  if (const Entry* e = find(tokens, n, root)) {  // the same prefix's state: the same bits (batch invariance)
    touch(*e);
    return;
  }
  int dst = store_.acquire();
  if (dst < 0) {  // evict the least recently used
    const uint64_t old = lru_.front();
    lru_.pop_front();
    dst = by_hash_.at(old).slot;
    by_hash_.erase(old);
  }
  store_.copy_from(live, slot, dst);
  const uint64_t h = prefix_hash(root, tokens.data(), n);
  by_hash_.erase(h);  // a colliding prefix's: replaced
  lru_.push_back(h);
  by_hash_[h] = Entry{std::vector<int32_t>(tokens.begin(), tokens.begin() + n), root, dst, std::prev(lru_.end())};
}

bool StateCheckpoints::restore(const std::vector<int32_t>& tokens, int n, RecurrentStatePool& live, int slot,
                               uint64_t root) {
  const Entry* e = find(tokens, n, root);
  if (!e) return false;
  live.copy_from(store_, e->slot, slot);
  touch(*e);
  restored_++;
  return true;
}

}  // namespace pyserve
