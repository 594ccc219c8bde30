// block_manager: the KV blocks' owner — reference counts, the prefix cache, copy-on-write.
//
// A block is in one of three states:
//   used    ref > 0: in one or more block tables (more than one after a fork, or a prefix-cache hit);
//   cached  ref == 0 and it holds a full block of computed tokens registered under its hash: reusable by
//           a later request with the same prefix, evicted least-recently-released first when a fresh
//           block is needed;
//   free    ref == 0 and nothing worth keeping.
// A full block's hash chains its parent's: h(i) = H(h(i-1), tokens of block i), so equal hashes mean equal
// prefixes (the tokens are compared too, so a 64-bit collision cannot alias two prefixes' blocks). The first
// block's parent is the table's root: kRootHash, or a cache salt's (salted_root) — tables of different salts
// share no block, as no chain of one can equal a chain of the other (tenants cannot probe each other's prompts).
//
// Verbs, for the scheduler (and for tests, without a model):
//   lookup(tokens, root)            the cached chain of tokens' full blocks, never the block holding the last
//                                   token (so at least one token is computed and no shared block is written);
//   can_allocate / allocate         admission: reuse that chain, add fresh blocks up to n_tokens;
//   append                          grow a table to n_tokens; a block about to be written while shared (ref > 1)
//                                   is replaced by a fresh copy, returned as (src, dst) for KVCache::copy_block;
//   commit                          register the table's newly computed full blocks in the cache;
//   fork                            a second table sharing every block (ref + 1);
//   truncate                        release the blocks past the first n tokens (rejected draft positions);
//   free                            release every block, last first (so a prefix's tail is evicted before its head).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pyserve {

constexpr uint64_t kRootHash = 0x6a09e667f3bcc908ull;  // the parent of an unsalted sequence's first block

// One sequence's view of the cache.
struct BlockTable {
  uint64_t root = kRootHash;     // its first block's parent: kRootHash, or its cache salt's (salted_root)
  std::vector<int32_t> blocks;   // logical block → physical block
  std::vector<uint64_t> hashes;  // chain hashes of full token blocks, computed lazily (they depend on tokens only)
  int n_committed = 0;           // leading blocks already registered in (or checked against) the cache
};

using BlockCopy = std::pair<int32_t, int32_t>;  // (src, dst)

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size, bool prefix_caching = true);

  int num_blocks() const { return (int)ref_.size(); }
  int block_size() const { return block_size_; }
  int num_free() const { return (int)free_.size() + (int)lru_.size(); }  // allocatable: free + cached
  int num_used() const { return num_blocks() - num_free(); }               // ref > 0
  int num_cached() const { return (int)lru_.size(); }                     // ref == 0, kept for reuse
  int ref_count(int block) const { return ref_.at(block); }
  bool is_cached(int block) const { return has_hash_.at(block) != 0; }     // registered under a hash (any ref)
  int blocks_for(int n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }
  uint64_t queried_tokens() const { return queried_; }
  uint64_t hit_tokens() const { return hit_; }

  // ---- single blocks (outside any table) ----
  bool can_allocate(int n) const { return n <= num_free(); }
  int allocate_block();          // a fresh block with ref 1 (evicts the LRU cached one when none is free)
  void retain(int block);        // ref + 1 (a cached block leaves the LRU)
  int release(int block);        // ref - 1; at 0 to the LRU (cached) or the free list. Returns the new count

  // ---- tables ----
  std::vector<int32_t> lookup(const std::vector<int32_t>& tokens, uint64_t root = kRootHash) const;
  // Whether a table holding `prefix` (from lookup) plus fresh blocks up to n_tokens fits now.
  bool can_allocate(const std::vector<int32_t>& prefix, int n_tokens) const;
  // Admission of an empty table: reuses `prefix`, adds fresh blocks so it holds n_tokens, counts tokens.size()
  // queried and the prefix's tokens hit (unless !looked_up: a table that skipped the lookup counts neither).
  // Returns the hit tokens; throws std::logic_error if it does not fit.
  int allocate(BlockTable& t, const std::vector<int32_t>& tokens, const std::vector<int32_t>& prefix, int n_tokens,
               bool looked_up = true);
  // Makes t hold n_tokens, writable from position n_computed on. False, with nothing changed, if blocks are short.
  bool append(BlockTable& t, int n_computed, int n_tokens, std::vector<BlockCopy>* copies);
  // Registers t's full blocks within the first n_computed tokens.
  void commit(BlockTable& t, const std::vector<int32_t>& tokens, int n_computed);
  void fork(const BlockTable& src, BlockTable& dst);
  // Releases t's blocks past the first n_tokens' (last first). What they held is never read again: a
  // position's K/V is written before any row attends to it.
  void truncate(BlockTable& t, int n_tokens);
  void free(BlockTable& t);

  // ---- the disk tier (disk_blocks.h) ----
  // Called with a cached block about to be evicted (its K/V still intact): (block, hash, parent, tokens).
  using EvictionHook = std::function<void(int, uint64_t, uint64_t, const int32_t*)>;
  void set_eviction_hook(EvictionHook hook) { on_evict_ = std::move(hook); }
  // Registers block b (held, with the K/V of tokens [block_size]) in the cache under hash and parent, as
  // commit() registers a computed one. False (nothing changed) when prefix caching is off or the hash is held.
  bool register_block(int b, uint64_t hash, uint64_t parent, const int32_t* tokens);
  // fn(block, hash, parent, tokens) for every cached block no table holds.
  void for_each_cached(const EvictionHook& fn) const;

  // h(parent, tokens[begin, begin + block_size)), exposed for tests.
  static uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n);
  // The root of the tables of a cache salt: kRootHash for "", else a hash of its bytes (never kRootHash).
  static uint64_t salted_root(const std::string& salt);

 private:
  int take_fresh();
  void ensure_hashes(BlockTable& t, const std::vector<int32_t>& tokens, int n_full) const;
  bool matches(int block, uint64_t parent, const int32_t* tokens) const;
  void uncache(int block);  // drops its hash registration

  int block_size_;
  bool prefix_caching_;
  std::vector<int> ref_;
  std::vector<int32_t> free_;                        // stack of free ids (never cached)
  std::list<int32_t> lru_;                           // cached, unreferenced; front = evicted first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<uint8_t> in_lru_;
  std::vector<uint8_t> has_hash_;
  std::vector<uint64_t> hash_, parent_;              // per block, when has_hash_
  std::vector<int32_t> tokens_;                      // [num_blocks × block_size], when has_hash_
  std::unordered_map<uint64_t, int32_t> by_hash_;
  uint64_t queried_ = 0, hit_ = 0;
  EvictionHook on_evict_;
};

}  // namespace pyserve
