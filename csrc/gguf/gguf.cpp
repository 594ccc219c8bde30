#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace pyserve {

namespace {

constexpr uint32_t GGUF_MAGIC = 0x46554747;  // "GGUF" little-endian
constexpr int MAX_DIMS = 4;
constexpr int MAX_NESTING = 4;

// A bounds-checked cursor over the mapped file.
class Reader {
 public:
  Reader(const GGUFFile& f, const uint8_t* base, size_t size) : f_(f), base_(base), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }
  void need(uint64_t n, const char* what) {
    if (n > remaining())
      f_.fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes at offset " +
              std::to_string(pos_) + ", file has " + std::to_string(size_));
  }

 private:
  const GGUFFile& f_;
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

size_t scalar_size(GGUFType t) {
  switch (t) {
    case GGUFType::UINT8: case GGUFType::INT8: case GGUFType::BOOL: return 1;
    case GGUFType::UINT16: case GGUFType::INT16: return 2;
    case GGUFType::UINT32: case GGUFType::INT32: case GGUFType::FLOAT32: return 4;
    case GGUFType::UINT64: case GGUFType::INT64: case GGUFType::FLOAT64: return 8;
    default: return 0;
  }
}

bool is_float(GGUFType t) { return t == GGUFType::FLOAT32 || t == GGUFType::FLOAT64; }

// Reads one integer-like scalar (bool, (u)int8..64) as int64.
int64_t read_int(Reader& r, GGUFType t, const char* what) {
  switch (t) {
    case GGUFType::UINT8: return r.read<uint8_t>(what);
    case GGUFType::INT8: return r.read<int8_t>(what);
    case GGUFType::BOOL: return r.read<uint8_t>(what) != 0;
    case GGUFType::UINT16: return r.read<uint16_t>(what);
    case GGUFType::INT16: return r.read<int16_t>(what);
    case GGUFType::UINT32: return r.read<uint32_t>(what);
    case GGUFType::INT32: return r.read<int32_t>(what);
    case GGUFType::UINT64: return (int64_t)r.read<uint64_t>(what);
    default: return r.read<int64_t>(what);
  }
}

double read_float(Reader& r, GGUFType t, const char* what) {
  return t == GGUFType::FLOAT32 ? (double)r.read<float>(what) : r.read<double>(what);
}

}  // namespace

const char* gguf_type_name(GGUFType t) {
  static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                "bool", "string", "array", "uint64", "int64", "float64"};
  uint32_t i = (uint32_t)t;
  return i < 13 ? names[i] : "unknown";
}

size_t GGUFValue::size() const { return ai.size() + af.size() + as.size() + aa.size(); }

std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) escape(c);
      else out += (char)c;
      i++;
      continue;
    }
    // the length of a well-formed sequence starting here (RFC 3629: no overlongs, no surrogates, <= U+10FFFF)
    size_t len = 0;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) len = 3;
    else if (c >= 0xf0 && c <= 0xf4) len = 4;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; k++) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && len == 3) {
      unsigned char c1 = p[i + 1];
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
    }
    if (ok && len == 4) {
      unsigned char c1 = p[i + 1];
      ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      escape(c);
      i++;
    }
  }
  return out;
}

void GGUFFile::fail(const std::string& what) const { throw GGUFError(printable(path_ + ": " + what)); }

GGUFFile::GGUFFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail("not a regular file");
  }
  size_ = (size_t)st.st_size;
  if (size_ > 0) {
    void* m = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) {
      ::close(fd_);
      fd_ = -1;
      fail(std::string("mmap failed: ") + std::strerror(errno));
    }
    map_ = static_cast<uint8_t*>(m);
  }
  try {
    parse();
  } catch (...) {
    release();
    throw;
  }
}

GGUFFile::~GGUFFile() { release(); }

void GGUFFile::release() {
  if (map_) munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
  map_ = nullptr;
  fd_ = -1;
}

namespace {

void read_value(const GGUFFile& f, Reader& r, GGUFType t, GGUFValue& v, const std::string& key, int depth);

void read_array(const GGUFFile& f, Reader& r, GGUFValue& v, const std::string& key, int depth) {
  size_t at = r.pos();
  uint32_t et = r.read<uint32_t>("array element type");
  uint64_t n = r.read<uint64_t>("array length");
  v.elem_type = (GGUFType)et;
  if (et > 12) f.fail("key '" + key + "': unknown array element type " + std::to_string(et) + " at offset " +
                      std::to_string(at));
  size_t min_elem = v.elem_type == GGUFType::STRING ? 8 : v.elem_type == GGUFType::ARRAY ? 12 : scalar_size(v.elem_type);
  if (n > r.remaining() / min_elem)
    f.fail("key '" + key + "': array of " + std::to_string(n) + " elements runs past the end of the file (offset " +
           std::to_string(at) + ")");
  if (v.elem_type == GGUFType::STRING) {
    v.as.reserve(n);
    for (uint64_t k = 0; k < n; k++) v.as.push_back(r.read_string("array string"));
  } else if (v.elem_type == GGUFType::ARRAY) {
    if (depth >= MAX_NESTING) f.fail("key '" + key + "': arrays nested too deeply");
    v.aa.resize(n);
    for (uint64_t k = 0; k < n; k++) read_value(f, r, GGUFType::ARRAY, v.aa[k], key, depth + 1);
  } else if (is_float(v.elem_type)) {
    v.af.resize(n);
    for (uint64_t k = 0; k < n; k++) v.af[k] = read_float(r, v.elem_type, "array float");
  } else {
    v.ai.resize(n);
    for (uint64_t k = 0; k < n; k++) v.ai[k] = read_int(r, v.elem_type, "array integer");
  }
}

void read_value(const GGUFFile& f, Reader& r, GGUFType t, GGUFValue& v, const std::string& key, int depth) {
  v.type = t;
  if (t == GGUFType::STRING) v.s = r.read_string("string value");
  else if (t == GGUFType::ARRAY) read_array(f, r, v, key, depth);
  else if (is_float(t)) v.f = read_float(r, t, "float value");
  else v.i = read_int(r, t, "integer value");
}

uint64_t checked_mul(const GGUFFile& f, uint64_t a, uint64_t b, const std::string& tensor) {
  if (b != 0 && a > UINT64_MAX / b) f.fail("tensor '" + tensor + "': dimensions overflow");
  return a * b;
}

// One tensor's info at the reader: name, dimensions, type, offset (aligned), its size in bytes.
void read_tensor_info(const GGUFFile& f, Reader& r, GGUFTensor& t, uint64_t alignment) {
  size_t at = r.pos();
  t.name = r.read_string("tensor name");
  uint32_t nd = r.read<uint32_t>("tensor n_dims");
  if (nd == 0 || nd > MAX_DIMS)
    f.fail("tensor '" + t.name + "': " + std::to_string(nd) + " dimensions (1 to 4 allowed), offset " + std::to_string(at));
  t.n_dims = (int)nd;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t ne = r.read<uint64_t>("tensor dimension");
    if (ne == 0 || ne > (uint64_t)INT64_MAX / 8)
      f.fail("tensor '" + t.name + "': dimension " + std::to_string(d) + " is " + std::to_string(ne));
    t.ne[d] = (int64_t)ne;
  }
  uint32_t type = r.read<uint32_t>("tensor type");
  const TypeTraits* tt = type_traits(type);
  if (!tt) {
    const char* known = ggml_type_name(type);  // a real GGML type this engine lacks: say which
    f.fail("tensor '" + t.name + "': unsupported tensor type " + std::to_string(type) +
           (known ? std::string(" (") + known + ")" : std::string()) + " at offset " + std::to_string(at));
  }
  t.type = (GGMLType)type;
  t.offset = r.read<uint64_t>("tensor offset");
  if (t.ne[0] % tt->block_size)
    f.fail("tensor '" + t.name + "': row of " + std::to_string(t.ne[0]) + " elements is not a multiple of " + tt->name +
           "'s block size " + std::to_string(tt->block_size));
  uint64_t rows = checked_mul(f, checked_mul(f, t.ne[1], t.ne[2], t.name), t.ne[3], t.name);
  uint64_t row_bytes = checked_mul(f, t.ne[0] / tt->block_size, tt->type_size, t.name);
  t.nbytes = checked_mul(f, rows, row_bytes, t.name);
  if (t.offset % alignment) f.fail("tensor '" + t.name + "': data offset " + std::to_string(t.offset) + " is not aligned");
}

}  // namespace

void GGUFFile::parse() {
  Reader r(*this, map_, size_);
  uint32_t magic = r.read<uint32_t>("magic");
  if (magic != GGUF_MAGIC) fail("bad magic (not a GGUF file)");
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  uint64_t n_tensors = r.read<uint64_t>("tensor count");
  uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Each kv needs >= 12 bytes and each tensor info >= 24: a larger count cannot fit in the file.
  if (n_kv > r.remaining() / 12) fail("metadata count " + std::to_string(n_kv) + " exceeds the file size");
  if (n_tensors > r.remaining() / 24) fail("tensor count " + std::to_string(n_tensors) + " exceeds the file size");

  for (uint64_t k = 0; k < n_kv; k++) {
    size_t at = r.pos();
    std::string key = r.read_string("metadata key");
    uint32_t t = r.read<uint32_t>("metadata value type");
    if (t > 12) fail("key '" + key + "': unknown value type " + std::to_string(t) + " at offset " + std::to_string(at));
    if (kv_.count(key)) fail("duplicate metadata key '" + key + "' at offset " + std::to_string(at));
    read_value(*this, r, (GGUFType)t, kv_[key], key, 0);
  }

  uint64_t alignment = (uint64_t)get_int("general.alignment", 32);
  if (alignment == 0 || (alignment & (alignment - 1)))
    fail("general.alignment " + std::to_string(alignment) + " is not a power of two");

  tensors_.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; k++) {
    GGUFTensor& t = tensors_[k];
    read_tensor_info(*this, r, t, alignment);
    if (by_name_.count(t.name)) fail("duplicate tensor name '" + t.name + "'");
    by_name_[t.name] = k;
  }

  uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  for (GGUFTensor& t : tensors_) {
    if (data_start > size_ || t.offset > size_ - data_start || t.nbytes > size_ - data_start - t.offset)
      fail("tensor '" + t.name + "': data [" + std::to_string(data_start + t.offset) + ", +" + std::to_string(t.nbytes) +
           ") lies outside the file of " + std::to_string(size_) + " bytes");
    t.data = map_ + data_start + t.offset;
  }
}

const GGUFTensor* GGUFFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void wrong_type(const GGUFFile& f, const std::string& key, GGUFType t, const char* want) {
  f.fail("metadata key '" + key + "' has type " + gguf_type_name(t) + ", expected " + want);
}
}  // namespace

int64_t GGUFFile::get_int(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) fail("missing metadata key '" + key + "'");
  GGUFType t = it->second.type;
  if (t == GGUFType::STRING || t == GGUFType::ARRAY || is_float(t)) wrong_type(*this, key, t, "an integer");
  return it->second.i;
}

int64_t GGUFFile::get_int(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }

double GGUFFile::get_float(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) fail("missing metadata key '" + key + "'");
  GGUFType t = it->second.type;
  if (is_float(t)) return it->second.f;
  if (t == GGUFType::STRING || t == GGUFType::ARRAY || t == GGUFType::BOOL) wrong_type(*this, key, t, "a number");
  return (double)it->second.i;
}

double GGUFFile::get_float(const std::string& key, double def) const { return has(key) ? get_float(key) : def; }

std::string GGUFFile::get_str(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) fail("missing metadata key '" + key + "'");
  if (it->second.type != GGUFType::STRING) wrong_type(*this, key, it->second.type, "a string");
  return it->second.s;
}

std::string GGUFFile::get_str(const std::string& key, const std::string& def) const {
  return has(key) ? get_str(key) : def;
}

void GGUFFile::drop_pages(const void* p, size_t n) const {
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), base = (uintptr_t)map_;
  const uintptr_t lo = std::max((uintptr_t)p, base), hi = std::min((uintptr_t)p + n, base + size_);
  const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
  if (b > a) madvise((void*)a, b - a, MADV_DONTNEED);
}

}  // namespace pyserve
