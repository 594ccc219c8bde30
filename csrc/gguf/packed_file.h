// packed_file: a model's packed weights (packed.h) kept in a file, mapped instead of packed again.
//
// Packing copies every matrix into fresh memory: the kernel zeroes each new page first, so a load spends
// half its time there and a sixth in the repack itself (perf, Gemma 3 270M: 0.3-0.6 s on one core). A file
// of the packed layout, once written, is mapped read-only instead: its pages come from the page cache (no
// zeroing, no copy, shared by every process that maps it: a server's replicas hold one copy), mapped 2 MiB
// at a time where the file system keeps large folios (FilePmdMapped; the weights' stream needs huge pages).
//
// Layout: a header {magic "PYSPACK\0", u32 version, u32 n, char layout[32], u64 bytes}, n entries
// {u32 type, u32 reserved, i64 n_in, i64 n_groups, u64 group_bytes, u64 offset}, then each weight's
// n_groups · group_bytes bytes at its offset (2 MiB-aligned from 4 MiB on, as pack_weight aligns them).
// `layout` names this build's packed layout (packed_layout()); a file of another is not used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/packed.h"

namespace pyserve {

// Writes `ws` in order to `path` (created or replaced; not atomically: the caller writes a temporary name
// and renames it). Throws std::runtime_error with the path and the OS's reason when a write fails.
void write_packed_file(const std::string& path, const std::vector<const PackedWeight*>& ws);

// A mapped packed file (read-only, whole, MAP_POPULATE'd).
class PackedFile {
 public:
  // The file at `path` mapped, when it is one of this build's layout holding exactly `shapes` (each weight's
  // type, n_in, n_groups and group_bytes, in order) and is as long as its header says; nullptr otherwise
  // (missing, short, another layout or model: never throws for a file that does not fit -- the caller packs).
  static std::shared_ptr<const PackedFile> open(const std::string& path, const std::vector<PackedWeight>& shapes);
  ~PackedFile();
  PackedFile(const PackedFile&) = delete;
  PackedFile& operator=(const PackedFile&) = delete;

  // Weight i of file `f`: `shape` (open's shapes[i]) with its data in the mapping, which it keeps alive.
  static std::shared_ptr<const PackedWeight> weight(const std::shared_ptr<const PackedFile>& f, size_t i,
                                                    const PackedWeight& shape);

 private:
  PackedFile() = default;
  uint8_t* map_ = nullptr;  // the whole file, 2 MiB-aligned
  size_t bytes_ = 0;
  std::vector<uint64_t> offsets_;  // weight i's data at map_ + offsets_[i]
};

}  // namespace pyserve
