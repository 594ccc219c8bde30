// disk_tier: the KV cache's second tier — full blocks of prompt K/V kept as files in a directory, so that a
// prefix the in-memory pool has evicted (or a restart has lost) can be read back instead of recomputed.
//
// An entry is one block: its chain hash (block_manager.h: the hash of its tokens chained over its parent's, from
// its table's root — so a cache salt's entries are its own), the parent hash, the block's tokens (compared on
// read, so a 64-bit collision cannot alias two prefixes) and the payload (every layer's K and V rows of the
// block). A file is named <layout>-<hash>.kvb; `layout` is a hash of what makes payloads interchangeable (the
// model file, the KV dtype, the block size, the layers' widths: the caller's to make). Entries of another layout
// are never read, and never deleted: another model's server may share the directory.
//
// Writes are atomic (a temporary name, then rename(2)): a reader — this process, or another server on the same
// directory — sees a whole entry or none, and a process killed mid-write leaves only a temporary file (removed by
// the next scan once it is an hour old; an entry file of the wrong size is removed by the scan). An entry that fails its checks on read (magic, sizes, layout, hash,
// parent, tokens, checksum: a corrupt or truncated file) is deleted and read as a miss: never served. The
// directory holds at most max_bytes of this layout's entries; the least recently used go first (by use in this
// process, by modification time from the scan at start). A write that fails (a full disk, a directory gone) is
// counted and dropped, never thrown: the tier is a cache.
//
// Threads: every verb may be called from any thread (one mutex over the index). put() copies the block and
// queues it for the tier's writer thread, so the step that evicts a block never waits on the disk; at most
// max_queue_bytes wait (more are dropped and counted).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace pyserve {

struct DiskTierStats {
  uint64_t hits = 0, misses = 0;       // get()s that returned a block, and those that did not
  uint64_t corrupt = 0;                // entries dropped on read: failed checks
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t writes = 0, write_errors = 0, dropped = 0;  // files written, writes failed, puts dropped (queue full)
  uint64_t evicted = 0;                // entries deleted to stay within max_bytes
  int64_t bytes = 0;                   // this layout's entries on disk, as this process knows them
  int64_t entries = 0;
};

class DiskTier {
 public:
  // Creates `dir` if needed and scans it for this layout's entries. Throws std::invalid_argument naming the
  // directory when it cannot be created or listed, and for max_bytes < 1, payload_bytes < 1 or block_size < 1.
  DiskTier(const std::string& dir, int64_t max_bytes, uint64_t layout, size_t payload_bytes, int block_size,
           size_t max_queue_bytes = 256u << 20);
  ~DiskTier();  // writes what is queued, then stops the writer
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  size_t payload_bytes() const { return payload_bytes_; }
  int block_size() const { return block_size_; }
  // Whether an entry for `hash` is on disk (in the index, or written since by another process) or queued.
  bool contains(uint64_t hash);
  // Queues a block for writing: tokens [block_size], payload [payload_bytes] (both copied). No-op when the
  // entry is on disk or queued already.
  void put(uint64_t hash, uint64_t parent, const int32_t* tokens, const uint8_t* payload);
  // Reads the entry into payload [payload_bytes] if it is on disk and whole, for this parent and these tokens
  // (a queued one is waited for). False otherwise (a miss; a failed entry is deleted).
  bool get(uint64_t hash, uint64_t parent, const int32_t* tokens, uint8_t* payload);
  void flush();  // returns once every queued write is done (or failed)
  DiskTierStats stats() const;

 private:
  struct Job {
    uint64_t hash, parent;
    std::vector<int32_t> tokens;
    std::vector<uint8_t> payload;
  };
  struct Entry {
    int64_t bytes;
    std::list<uint64_t>::iterator lru;
  };
  std::string path_of(uint64_t hash) const;
  void scan();
  void writer_loop();
  bool write_file(const Job& job);
  bool read_file(uint64_t hash, uint64_t parent, const int32_t* tokens, uint8_t* payload);
  void index_add(uint64_t hash, int64_t bytes);  // under mu_; evicts past max_bytes_
  void index_drop(uint64_t hash);                // under mu_
  size_t file_bytes() const;

  std::string dir_;
  int64_t max_bytes_;
  uint64_t layout_;
  size_t payload_bytes_;
  int block_size_;
  size_t max_queue_bytes_;

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::unordered_map<uint64_t, Entry> index_;
  std::list<uint64_t> lru_;  // front: evicted first
  std::deque<Job> queue_;
  std::unordered_set<uint64_t> queued_;  // the hashes in queue_ or being written
  size_t queue_bytes_ = 0;
  bool stop_ = false;
  DiskTierStats stats_;
  std::thread writer_;
};

}  // namespace pyserve
