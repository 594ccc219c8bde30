// disk_blocks: the prefix cache's disk tier (kv/disk_tier.h) in the block manager's terms. A cached block the
// pool evicts is saved to the tier (its K/V copied out at once, written by the tier's thread); before a request
// is admitted, the blocks of its prompt that the pool no longer holds but the tier does are promoted: read into
// fresh blocks and registered in the cache, so the admission's lookup finds them as if never evicted. At
// shutdown every cached block is saved, so a restart finds them too.
//
// The chain is the block manager's (a table's root — a cache salt's — then each block's hash over its parent's),
// so a promoted block is exactly the one a lookup would have found: the same tokens after the same prefix. A
// block the tier cannot give back whole ends the promotion there; the rest is computed.
//
// Promotion reads on the engine thread, bounded: it stops after `seconds` (so running streams' steps wait at
// most that long; the next step goes on) and where reading a block takes longer than computing it would.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/disk_tier.h"
#include "kv/kv_cache.h"
#include "scheduler/block_manager.h"

namespace pyserve {

class DiskBlocks {
 public:
  // Hooks itself into `blocks`' evictions. blocks and kv outlive it; their block size must be the tier's.
  DiskBlocks(BlockManager& blocks, KVCache& kv, std::unique_ptr<DiskTier> tier);
  ~DiskBlocks();

  struct Promotion {
    int blocks = 0;         // read back this call
    bool complete = true;   // false: stopped by the time bound with more of the chain on disk
  };
  // The blocks of tokens (whose first block chains from root) past the pool's cached prefix, up to (but not
  // including) the last token's block, promoted while the tier holds them, while blocks are free, within
  // `seconds` (<= 0: no bound) and while a block reads faster than `compute_s` (<= 0: no bound).
  Promotion promote(const std::vector<int32_t>& tokens, uint64_t root, double seconds, double compute_s);
  void save_cached();  // every cached block no table holds, then waits for the writes
  // Blocks [first, end) of t (committed: their hashes known) to the tier, written by its thread: a prompt the
  // client will send again (Request::write_through), saved before any eviction.
  void save_table(const BlockTable& t, const int32_t* tokens, int first, int end);
  double read_seconds_per_block() const { return read_s_; }  // measured (0 until a read)
  DiskTierStats stats() const { return tier_->stats(); }

 private:
  void save(int block, uint64_t hash, uint64_t parent, const int32_t* tokens);

  BlockManager& blocks_;
  KVCache& kv_;
  std::unique_ptr<DiskTier> tier_;
  std::vector<uint8_t> staging_;  // [kv.block_bytes()]
  double read_s_ = 0.0;           // an average of the reads' seconds per block
};

}  // namespace pyserve
