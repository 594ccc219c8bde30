#include "kv/disk_tier.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace fs = std::filesystem;

namespace pyserve {

namespace {

constexpr char kMagic[8] = {'P', 'S', 'K', 'V', 'B', '0', '1', '\0'};
constexpr auto kStaleTemp = std::chrono::hours(1);  // a temporary file this old was left by a killed writer

// What precedes an entry's tokens [block_size] and payload [payload_bytes] in its file.
struct Header {
  char magic[8];
  uint64_t layout, hash, parent;
  uint32_t block_size, reserved;
  uint64_t payload_bytes;
  uint64_t checksum;  // of the tokens' and the payload's bytes
};
static_assert(sizeof(Header) == 56, "the entry header is 56 bytes");

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A 64-bit checksum of n bytes, continued from h: 8 bytes a round (the tail zero-padded), each round mixed.
uint64_t checksum(uint64_t h, const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h + w + 0x9e3779b97f4a7c15ull);
  }
  uint64_t w = 0;
  std::memcpy(&w, p + i, n - i);
  return mix(h + w + n);
}

uint64_t entry_checksum(const int32_t* tokens, int block_size, const uint8_t* payload, size_t payload_bytes) {
  const uint64_t h = checksum(0x5eed, reinterpret_cast<const uint8_t*>(tokens), (size_t)block_size * 4);
  return checksum(h, payload, payload_bytes);
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// The hash of an entry's file name under this layout ("<layout>-<hash>.kvb"), or false for any other name.
bool parse_name(const std::string& name, const std::string& layout_hex, uint64_t* hash) {
  if (name.size() != 16 + 1 + 16 + 4 || name.compare(0, 16, layout_hex) != 0 || name[16] != '-' ||
      name.compare(33, 4, ".kvb") != 0)
    return false;
  const std::string h = name.substr(17, 16);
  if (h.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  *hash = std::stoull(h, nullptr, 16);
  return true;
}

bool write_all(std::FILE* f, const void* p, size_t n) { return std::fwrite(p, 1, n, f) == n; }
bool read_all(std::FILE* f, void* p, size_t n) { return std::fread(p, 1, n, f) == n; }

std::atomic<uint64_t> temp_counter{0};

}  // namespace

DiskTier::DiskTier(const std::string& dir, int64_t max_bytes, uint64_t layout, size_t payload_bytes, int block_size,
                   size_t max_queue_bytes)
    : dir_(dir), max_bytes_(max_bytes), layout_(layout), payload_bytes_(payload_bytes), block_size_(block_size),
      max_queue_bytes_(max_queue_bytes) {
  if (max_bytes < 1 || payload_bytes < 1 || block_size < 1)
    throw std::invalid_argument("kv cache disk tier: max_bytes, payload_bytes and block_size must be >= 1");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    throw std::invalid_argument("kv cache dir '" + dir_ + "': cannot create it as a directory" +
                                (ec ? " (" + ec.message() + ")" : std::string()));
  scan();
  writer_ = std::thread([this] { writer_loop(); });
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

size_t DiskTier::file_bytes() const { return sizeof(Header) + (size_t)block_size_ * 4 + payload_bytes_; }

std::string DiskTier::path_of(uint64_t hash) const { return dir_ + "/" + hex16(layout_) + "-" + hex16(hash) + ".kvb"; }

// This layout's entries, least recently modified first (so they are evicted first); stale temporary files go.
void DiskTier::scan() {
  std::error_code ec;
  fs::directory_iterator it(dir_, ec);
  if (ec) throw std::invalid_argument("kv cache dir '" + dir_ + "': cannot list it (" + ec.message() + ")");
  const std::string layout_hex = hex16(layout_);
  std::vector<std::pair<fs::file_time_type, uint64_t>> found;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    std::error_code fe;
    const fs::file_time_type t = e.last_write_time(fe);
    uint64_t hash;
    if (fe) continue;
    if (name.size() > 4 && name[0] == '.' && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      if (now - t > kStaleTemp) fs::remove(e.path(), fe);
    } else if (parse_name(name, layout_hex, &hash)) {
      if (e.file_size(fe) == file_bytes() && !fe) found.emplace_back(t, hash);
      else fs::remove(e.path(), fe);  // this layout's, and not whole: never read
    }
  }
  std::sort(found.begin(), found.end());
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& f : found) index_add(f.second, (int64_t)file_bytes());
}

void DiskTier::index_add(uint64_t hash, int64_t bytes) {
  auto it = index_.find(hash);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return;
  }
  lru_.push_back(hash);
  index_[hash] = Entry{bytes, std::prev(lru_.end())};
  stats_.bytes += bytes;
  stats_.entries++;
  while (stats_.bytes > max_bytes_ && !lru_.empty()) {
    const uint64_t victim = lru_.front();
    std::error_code ec;
    fs::remove(path_of(victim), ec);
    index_drop(victim);
    stats_.evicted++;
  }
}

void DiskTier::index_drop(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  stats_.bytes -= it->second.bytes;
  stats_.entries--;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

bool DiskTier::contains(uint64_t hash) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (index_.count(hash) || queued_.count(hash)) return true;
  }
  std::error_code ec;
  if (fs::file_size(path_of(hash), ec) != file_bytes() || ec) return false;
  std::lock_guard<std::mutex> lk(mu_);  // written by another process since the scan
  index_add(hash, (int64_t)file_bytes());
  return true;
}

void DiskTier::put(uint64_t hash, uint64_t parent, const int32_t* tokens, const uint8_t* payload) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (index_.count(hash) || queued_.count(hash)) return;
    if (queue_bytes_ + payload_bytes_ > max_queue_bytes_) {
      stats_.dropped++;
      return;
    }
    queue_.push_back(Job{hash, parent, std::vector<int32_t>(tokens, tokens + block_size_),
                         std::vector<uint8_t>(payload, payload + payload_bytes_)});
    queued_.insert(hash);
    queue_bytes_ += payload_bytes_;
  }
  wake_.notify_one();
}

void DiskTier::writer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    wake_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, everything written
    Job job = std::move(queue_.front());
    queue_.pop_front();
    queue_bytes_ -= job.payload.size();
    lk.unlock();
    const bool ok = write_file(job);
    lk.lock();
    if (ok) {
      stats_.writes++;
      stats_.bytes_written += file_bytes();
      index_add(job.hash, (int64_t)file_bytes());
    } else {
      stats_.write_errors++;
    }
    queued_.erase(job.hash);
    idle_.notify_all();
  }
}

// The entry under a temporary name, then renamed into place: readers see all of it or none.
bool DiskTier::write_file(const Job& job) {
  const std::string path = path_of(job.hash);
  const std::string tmp = dir_ + "/." + hex16(layout_) + "-" + hex16(job.hash) + "." + std::to_string(getpid()) +
                          "." + std::to_string(temp_counter++) + ".tmp";
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.layout = layout_, h.hash = job.hash, h.parent = job.parent;
  h.block_size = (uint32_t)block_size_, h.payload_bytes = payload_bytes_;
  h.checksum = entry_checksum(job.tokens.data(), block_size_, job.payload.data(), payload_bytes_);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return false;
  bool ok = write_all(f, &h, sizeof h) && write_all(f, job.tokens.data(), job.tokens.size() * 4) &&
            write_all(f, job.payload.data(), job.payload.size());
  ok = (std::fclose(f) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) std::remove(tmp.c_str());
  return ok;
}

bool DiskTier::read_file(uint64_t hash, uint64_t parent, const int32_t* tokens, uint8_t* payload) {
  std::FILE* f = std::fopen(path_of(hash).c_str(), "rb");
  if (!f) return false;
  Header h;
  std::vector<int32_t> got((size_t)block_size_);
  char extra;
  bool ok = read_all(f, &h, sizeof h) && std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.layout == layout_ &&
            h.hash == hash && h.parent == parent && h.block_size == (uint32_t)block_size_ &&
            h.payload_bytes == payload_bytes_ && read_all(f, got.data(), got.size() * 4) &&
            std::memcmp(got.data(), tokens, got.size() * 4) == 0 && read_all(f, payload, payload_bytes_) &&
            std::fread(&extra, 1, 1, f) == 0 &&
            entry_checksum(got.data(), block_size_, payload, payload_bytes_) == h.checksum;
  std::fclose(f);
  return ok;
}

bool DiskTier::get(uint64_t hash, uint64_t parent, const int32_t* tokens, uint8_t* payload) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    idle_.wait(lk, [&] { return !queued_.count(hash); });  // a queued write of it lands first
  }
  const bool ok = read_file(hash, parent, tokens, payload);
  std::lock_guard<std::mutex> lk(mu_);
  if (ok) {
    stats_.hits++;
    stats_.bytes_read += file_bytes();
    index_add(hash, (int64_t)file_bytes());  // touched (or found: another process's entry)
    return true;
  }
  stats_.misses++;
  std::error_code ec;
  if (fs::exists(path_of(hash), ec)) {  // there, but not this block whole: never served, dropped
    stats_.corrupt++;
    fs::remove(path_of(hash), ec);
  }
  index_drop(hash);
  return false;
}

void DiskTier::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return queued_.empty(); });
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace pyserve
