#include "scheduler/disk_blocks.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace pyserve {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

DiskBlocks::DiskBlocks(BlockManager& blocks, KVCache& kv, std::unique_ptr<DiskTier> tier)
    : blocks_(blocks), kv_(kv), tier_(std::move(tier)), staging_(kv.block_bytes()) {
  if (tier_->block_size() != blocks.block_size() || tier_->payload_bytes() != kv.block_bytes())
    throw std::invalid_argument("disk tier: its block size or payload does not fit the KV cache's");
  blocks_.set_eviction_hook([this](int b, uint64_t h, uint64_t p, const int32_t* t) { save(b, h, p, t); });
}

DiskBlocks::~DiskBlocks() { blocks_.set_eviction_hook(nullptr); }

void DiskBlocks::save(int block, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  if (tier_->contains(hash)) return;
  kv_.save_block(block, staging_.data());
  tier_->put(hash, parent, tokens, staging_.data());
}

void DiskBlocks::save_table(const BlockTable& t, const int32_t* tokens, int first, int end) {
  const int bs = blocks_.block_size();
  for (int i = first; i < end && i < (int)t.hashes.size(); i++)
    save(t.blocks[i], t.hashes[i], i == 0 ? t.root : t.hashes[i - 1], tokens + (size_t)i * bs);
}

void DiskBlocks::save_cached() {
  blocks_.for_each_cached([this](int b, uint64_t h, uint64_t p, const int32_t* t) { save(b, h, p, t); });
  tier_->flush();
}

DiskBlocks::Promotion DiskBlocks::promote(const std::vector<int32_t>& tokens, uint64_t root, double seconds,
                                          double compute_s) {
  const int bs = blocks_.block_size();
  const std::vector<int32_t> cached = blocks_.lookup(tokens, root);
  const int max_blocks = tokens.empty() ? 0 : ((int)tokens.size() - 1) / bs;  // never the last token's block
  std::vector<int32_t> held = cached;  // pinned while blocks are taken: an eviction must not cut the chain
  for (int32_t b : held) blocks_.retain(b);
  uint64_t parent = root;
  for (int i = 0; i < (int)cached.size(); i++) parent = BlockManager::hash_block(parent, tokens.data() + (size_t)i * bs, bs);
  Promotion out;
  const double t0 = now_s();
  for (int i = (int)cached.size(); i < max_blocks; i++) {
    const int32_t* tk = tokens.data() + (size_t)i * bs;
    const uint64_t h = BlockManager::hash_block(parent, tk, bs);
    if (!tier_->contains(h) || blocks_.num_free() == 0) break;
    if (compute_s > 0 && read_s_ > compute_s) break;  // computing the rest is faster
    if (seconds > 0 && now_s() - t0 > seconds) {
      out.complete = false;
      break;
    }
    const double t = now_s();
    const int b = blocks_.allocate_block();
    const bool ok = tier_->get(h, parent, tk, staging_.data());
    if (ok) kv_.load_block(b, staging_.data());
    if (!ok || !blocks_.register_block(b, h, parent, tk)) {
      blocks_.release(b);
      break;
    }
    read_s_ = read_s_ == 0 ? now_s() - t : 0.8 * read_s_ + 0.2 * (now_s() - t);
    held.push_back(b);
    out.blocks++;
    parent = h;
  }
  for (auto it = held.rbegin(); it != held.rend(); ++it) blocks_.release(*it);  // the tail evicted before the head
  return out;
}

}  // namespace pyserve
