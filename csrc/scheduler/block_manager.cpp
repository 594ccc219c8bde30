#include "scheduler/block_manager.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pyserve {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t BlockManager::hash_block(uint64_t parent, const int32_t* tokens, int n) {
  uint64_t h = mix(parent ^ 0x9e3779b97f4a7c15ull);
  for (int i = 0; i < n; i++) h = mix(h + (uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull);
  return h;
}

uint64_t BlockManager::salted_root(const std::string& salt) {
  if (salt.empty()) return kRootHash;
  uint64_t h = mix(kRootHash + salt.size());
  for (unsigned char c : salt) h = mix(h + c + 0x9e3779b97f4a7c15ull);
  return h == kRootHash ? h + 1 : h;
}

BlockManager::BlockManager(int num_blocks, int block_size, bool prefix_caching)
    : block_size_(block_size), prefix_caching_(prefix_caching) {
  if (num_blocks <= 0 || block_size <= 0) throw std::invalid_argument("the block manager needs blocks of >= 1 token");
  ref_.assign(num_blocks, 0);
  lru_pos_.resize(num_blocks);
  in_lru_.assign(num_blocks, 0);
  has_hash_.assign(num_blocks, 0);
  hash_.assign(num_blocks, 0);
  parent_.assign(num_blocks, 0);
  tokens_.assign((size_t)num_blocks * block_size, 0);
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; b--) free_.push_back(b);
}

// ---- single blocks ----

void BlockManager::uncache(int b) {
  if (!has_hash_[b]) return;
  auto it = by_hash_.find(hash_[b]);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  has_hash_[b] = 0;
}

int BlockManager::take_fresh() {
  int b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    in_lru_[b] = 0;
    if (on_evict_) on_evict_(b, hash_[b], parent_[b], &tokens_[(size_t)b * block_size_]);
    uncache(b);
  } else {
    throw std::runtime_error("KV block pool exhausted");
  }
  ref_[b] = 1;
  return b;
}

int BlockManager::allocate_block() { return take_fresh(); }

void BlockManager::retain(int b) {
  if (ref_.at(b) == 0) {
    if (!in_lru_[b]) throw std::logic_error("retain of free KV block " + std::to_string(b));
    lru_.erase(lru_pos_[b]);
    in_lru_[b] = 0;
  }
  ref_[b]++;
}

int BlockManager::release(int b) {
  int& r = ref_.at(b);
  if (r <= 0) throw std::logic_error("release of free KV block " + std::to_string(b));
  if (--r == 0) {
    if (has_hash_[b]) {
      lru_pos_[b] = lru_.insert(lru_.end(), b);
      in_lru_[b] = 1;
    } else {
      free_.push_back(b);
    }
  }
  return r;
}

// ---- the prefix cache ----

bool BlockManager::matches(int b, uint64_t parent, const int32_t* tokens) const {
  return parent_[b] == parent &&
         std::memcmp(&tokens_[(size_t)b * block_size_], tokens, block_size_ * sizeof(int32_t)) == 0;
}

std::vector<int32_t> BlockManager::lookup(const std::vector<int32_t>& tokens, uint64_t root) const {
  std::vector<int32_t> out;
  if (!prefix_caching_ || tokens.empty()) return out;
  const int max_blocks = ((int)tokens.size() - 1) / block_size_;  // never the block of the last token
  uint64_t parent = root;
  for (int i = 0; i < max_blocks; i++) {
    const int32_t* tk = tokens.data() + (size_t)i * block_size_;
    uint64_t h = hash_block(parent, tk, block_size_);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end() || !matches(it->second, parent, tk)) break;
    out.push_back(it->second);
    parent = h;
  }
  return out;
}

void BlockManager::ensure_hashes(BlockTable& t, const std::vector<int32_t>& tokens, int n_full) const {
  while ((int)t.hashes.size() < n_full) {
    size_t i = t.hashes.size();
    uint64_t parent = i == 0 ? t.root : t.hashes[i - 1];
    t.hashes.push_back(hash_block(parent, tokens.data() + i * block_size_, block_size_));
  }
}

void BlockManager::commit(BlockTable& t, const std::vector<int32_t>& tokens, int n_computed) {
  int full = std::min({n_computed, (int)tokens.size()}) / block_size_;
  full = std::min(full, (int)t.blocks.size());
  if (!prefix_caching_ || full <= t.n_committed) {
    t.n_committed = std::max(t.n_committed, full);
    return;
  }
  ensure_hashes(t, tokens, full);
  for (int i = t.n_committed; i < full; i++) {
    int b = t.blocks[i];
    if (has_hash_[b]) continue;  // a hit, or already registered
    uint64_t h = t.hashes[i];
    if (by_hash_.count(h)) continue;  // the same prefix computed twice (concurrently): keep the first
    register_block(b, h, i == 0 ? t.root : t.hashes[i - 1], tokens.data() + (size_t)i * block_size_);
  }
  t.n_committed = full;
}

bool BlockManager::register_block(int b, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  if (!prefix_caching_ || has_hash_.at(b) || by_hash_.count(hash)) return false;
  has_hash_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent;
  std::memcpy(&tokens_[(size_t)b * block_size_], tokens, block_size_ * sizeof(int32_t));
  by_hash_[hash] = b;
  return true;
}

void BlockManager::for_each_cached(const EvictionHook& fn) const {
  for (int32_t b : lru_) fn(b, hash_[b], parent_[b], &tokens_[(size_t)b * block_size_]);
}

// ---- tables ----

bool BlockManager::can_allocate(const std::vector<int32_t>& prefix, int n_tokens) const {
  int fresh = std::max(0, blocks_for(n_tokens) - (int)prefix.size());
  int revived = 0;  // hit blocks that sit in the LRU: taking them leaves fewer to allocate
  for (int32_t b : prefix)
    if (ref_[b] == 0) revived++;
  return fresh + revived <= num_free();
}

int BlockManager::allocate(BlockTable& t, const std::vector<int32_t>& tokens, const std::vector<int32_t>& prefix,
                           int n_tokens, bool looked_up) {
  if (!t.blocks.empty()) throw std::logic_error("allocate on a table that holds blocks");
  if (!can_allocate(prefix, n_tokens)) throw std::logic_error("allocate without room: check can_allocate first");
  for (int32_t b : prefix) retain(b);
  t.blocks = prefix;
  t.n_committed = (int)prefix.size();
  int fresh = blocks_for(n_tokens) - (int)prefix.size();
  for (int i = 0; i < fresh; i++) t.blocks.push_back(take_fresh());
  int hit = (int)prefix.size() * block_size_;
  if (looked_up) {
    queried_ += tokens.size();
    hit_ += hit;
  }
  return hit;
}

bool BlockManager::append(BlockTable& t, int n_computed, int n_tokens, std::vector<BlockCopy>* copies) {
  const int have = (int)t.blocks.size();
  const int fresh = std::max(0, blocks_for(n_tokens) - have);
  // Blocks written this step that another table also holds (or that the cache holds) are copied first.
  const int first = n_computed / block_size_, last = std::min(have, blocks_for(n_tokens));
  int shared = 0;
  for (int i = first; i < last; i++)
    if (ref_[t.blocks[i]] > 1 || has_hash_[t.blocks[i]]) shared++;
  if (fresh + shared > num_free()) return false;
  for (int i = first; i < last; i++) {
    int32_t old = t.blocks[i];
    if (ref_[old] == 1 && !has_hash_[old]) continue;
    int32_t nb = take_fresh();
    if (copies) copies->emplace_back(old, nb);
    t.blocks[i] = nb;
    release(old);
  }
  for (int i = 0; i < fresh; i++) t.blocks.push_back(take_fresh());
  return true;
}

void BlockManager::fork(const BlockTable& src, BlockTable& dst) {
  if (!dst.blocks.empty()) throw std::logic_error("fork into a table that holds blocks");
  for (int32_t b : src.blocks) retain(b);
  dst = src;
}

void BlockManager::truncate(BlockTable& t, int n_tokens) {
  const size_t keep = (size_t)blocks_for(std::max(n_tokens, 0));
  while (t.blocks.size() > keep) {
    release(t.blocks.back());
    t.blocks.pop_back();
  }
  t.n_committed = std::min(t.n_committed, (int)keep);
  t.hashes.resize(std::min(t.hashes.size(), (size_t)std::max(n_tokens, 0) / block_size_));
}

void BlockManager::free(BlockTable& t) {
  for (auto it = t.blocks.rbegin(); it != t.blocks.rend(); ++it) release(*it);
  t.blocks.clear();
  t.n_committed = 0;
}

}  // namespace pyserve
