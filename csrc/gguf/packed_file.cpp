#include "gguf/packed_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace pyserve {

namespace {

constexpr char MAGIC[8] = {'P', 'Y', 'S', 'P', 'A', 'C', 'K', '\0'};
constexpr uint32_t VERSION = 1;
constexpr size_t HUGE = 2u << 20;

struct Header {
  char magic[8];
  uint32_t version, n;
  char layout[32];
  uint64_t bytes;  // the whole file
};

struct Entry {
  uint32_t type, reserved;
  int64_t n_in, n_groups;
  uint64_t group_bytes, offset;
};

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

uint64_t data_bytes(const PackedWeight& w) { return (uint64_t)w.n_groups * w.group_bytes; }

Header header(uint32_t n, uint64_t bytes) {
  Header h{};
  std::memcpy(h.magic, MAGIC, sizeof MAGIC);
  h.version = VERSION;
  h.n = n;
  std::strncpy(h.layout, packed_layout().c_str(), sizeof h.layout - 1);
  h.bytes = bytes;
  return h;
}

// The entries of `ws` with their offsets (as pack_weight aligns them), and the file's length.
std::vector<Entry> layout_entries(const std::vector<const PackedWeight*>& ws, uint64_t& bytes) {
  std::vector<Entry> es(ws.size());
  uint64_t at = sizeof(Header) + ws.size() * sizeof(Entry);
  for (size_t i = 0; i < ws.size(); i++) {
    const PackedWeight& w = *ws[i];
    at = align_up(at, data_bytes(w) >= PACK_HUGE_FROM ? HUGE : 64);
    es[i] = Entry{(uint32_t)w.type, 0, w.n_in, w.n_groups, w.group_bytes, at};
    at += data_bytes(w);
  }
  bytes = at;
  return es;
}

class Writer {
 public:
  explicit Writer(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
    if (fd_ < 0) fail("cannot create");
  }
  ~Writer() {
    if (fd_ >= 0) ::close(fd_);
  }
  void at(uint64_t offset, const void* p, size_t n) {
    const char* c = (const char*)p;
    while (n > 0) {
      const ssize_t k = ::pwrite(fd_, c, n, (off_t)offset);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail("cannot write");
      c += k, n -= (size_t)k, offset += (uint64_t)k;
    }
  }
  void close(uint64_t length) {
    if (::ftruncate(fd_, (off_t)length) != 0) fail("cannot write");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot write");
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw std::runtime_error(std::string(what) + " " + path_ + ": " + std::strerror(errno));
  }
  std::string path_;
  int fd_;
};

bool same_shape(const Entry& e, const PackedWeight& w) {
  return e.type == (uint32_t)w.type && e.n_in == w.n_in && e.n_groups == w.n_groups && e.group_bytes == w.group_bytes;
}

// The file's n entries if its header is this build's and says `bytes` = the file's length; else empty.
bool read_table(int fd, uint64_t file_bytes, size_t n, std::vector<Entry>& es) {
  Header h{};
  if (file_bytes < sizeof h || ::pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) return false;
  const Header want = header((uint32_t)n, file_bytes);
  if (std::memcmp(&h, &want, sizeof h) != 0) return false;  // magic, version, count, layout, length
  es.resize(n);
  const size_t tb = n * sizeof(Entry);
  return ::pread(fd, es.data(), tb, sizeof h) == (ssize_t)tb;
}

// `n` bytes of `fd` mapped read-only at a 2 MiB boundary (huge pages where the page cache has large folios).
uint8_t* map_aligned(int fd, size_t n) {
  void* area = ::mmap(nullptr, n + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) return nullptr;
  uint8_t* at = (uint8_t*)align_up((uintptr_t)area, HUGE);
  void* m = ::mmap(at, n, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, 0);
  // the reservation's ends around the mapping go back
  if (at > (uint8_t*)area) ::munmap(area, at - (uint8_t*)area);
  uint8_t* end = at + align_up(n, (size_t)sysconf(_SC_PAGESIZE));
  if ((uint8_t*)area + n + HUGE > end) ::munmap(end, (uint8_t*)area + n + HUGE - end);
  if (m == MAP_FAILED) {
    ::munmap(at, n);
    return nullptr;
  }
  return at;
}

}  // namespace

void write_packed_file(const std::string& path, const std::vector<const PackedWeight*>& ws) {
  uint64_t bytes = 0;
  const std::vector<Entry> es = layout_entries(ws, bytes);
  Writer w(path);
  const Header h = header((uint32_t)ws.size(), bytes);
  w.at(0, &h, sizeof h);
  if (!es.empty()) w.at(sizeof h, es.data(), es.size() * sizeof(Entry));
  for (size_t i = 0; i < ws.size(); i++) w.at(es[i].offset, ws[i]->data.get(), data_bytes(*ws[i]));
  w.close(bytes);  // the length the header says, whatever the last weight's size
}

std::shared_ptr<const PackedFile> PackedFile::open(const std::string& path, const std::vector<PackedWeight>& shapes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st{};
  std::vector<Entry> es;
  bool ok = ::fstat(fd, &st) == 0 && read_table(fd, (uint64_t)st.st_size, shapes.size(), es);
  for (size_t i = 0; ok && i < es.size(); i++)
    ok = same_shape(es[i], shapes[i]) && es[i].offset % 64 == 0 &&
         es[i].offset + data_bytes(shapes[i]) <= (uint64_t)st.st_size;
  uint8_t* map = ok ? map_aligned(fd, (size_t)st.st_size) : nullptr;
  ::close(fd);  // the mapping stays
  if (!map) return nullptr;
  std::shared_ptr<PackedFile> f(new PackedFile());
  f->map_ = map;
  f->bytes_ = (size_t)st.st_size;
  for (const Entry& e : es) f->offsets_.push_back(e.offset);
  return f;
}

PackedFile::~PackedFile() {
  if (map_) ::munmap(map_, bytes_);
}

std::shared_ptr<const PackedWeight> PackedFile::weight(const std::shared_ptr<const PackedFile>& f, size_t i,
                                                       const PackedWeight& shape) {
  auto* w = new PackedWeight();
  w->type = shape.type;
  w->n_in = shape.n_in;
  w->n_groups = shape.n_groups;
  w->group_bytes = shape.group_bytes;
  w->data = {f->map_ + f->offsets_.at(i), [](void*) {}};  // the mapping's: unmapped with the file
  return std::shared_ptr<const PackedWeight>(w, [f](const PackedWeight* p) { delete p; });
}

}  // namespace pyserve
