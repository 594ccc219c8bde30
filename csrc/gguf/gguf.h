// gguf: a GGUF v2/v3 file, memory-mapped. Metadata is parsed into values; tensor data is never copied —
// each tensor points into the mapping, so resident memory after load is about the file's size.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace pyserve {

// Every malformed-file condition: the message names the file, what is wrong and where (tensor, key, offset).
class GGUFError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class GGUFType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GGUFType t);

// `s` with every byte that is not part of valid UTF-8, and every control character, written as \xNN: names
// and strings from a file go into error messages through it, so a message is always valid UTF-8 (Python
// can turn it into a str) and printable.
std::string printable(const std::string& s);

struct GGUFValue {
  GGUFType type = GGUFType::UINT8;
  GGUFType elem_type = GGUFType::UINT8;  // element type when type == ARRAY
  // Scalars: integers and bools in i (UINT64 bit-cast), floats in f, strings in s.
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  // Arrays, by element kind: integers/bools in ai, floats in af, strings in as, nested arrays in aa.
  std::vector<int64_t> ai;
  std::vector<double> af;
  std::vector<std::string> as;
  std::vector<GGUFValue> aa;
  size_t size() const;  // element count of an array
};

struct GGUFTensor {
  std::string name;
  GGMLType type;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] = elements per row (the contiguous dimension)
  uint64_t offset = 0;            // from the start of the data section
  size_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
};

class GGUFFile {
 public:
  // Maps and parses `path`. Throws GGUFError (with file, key / tensor and offset) on any malformed input:
  // truncation, bad magic or version, unknown value or tensor type, overflowing dimensions, misaligned or
  // out-of-file tensor data, duplicate names.
  explicit GGUFFile(const std::string& path);
  ~GGUFFile();
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GGUFValue>& metadata() const { return kv_; }
  const std::vector<GGUFTensor>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return kv_.count(key) > 0; }
  // Typed getters: a missing key returns the default (or throws when none is given); a key of the wrong
  // type throws GGUFError naming the key, its type and the expected one.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double def) const;
  std::string get_str(const std::string& key) const;
  std::string get_str(const std::string& key, const std::string& def) const;

  // The tensor named `name`, or nullptr.
  const GGUFTensor* find(const std::string& name) const;

  // Hands back the resident pages wholly inside [p, p + n) of the mapping (after a copy of them was
  // made): they stay readable and are read from the file again if touched. No-op outside the mapping.
  void drop_pages(const void* p, size_t n) const;

  [[noreturn]] void fail(const std::string& what) const;  // throws GGUFError("<path>: <what>")

 private:
  void parse();
  void release();  // unmaps and closes; safe to call twice
  std::string path_;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, GGUFValue> kv_;
  std::vector<GGUFTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace pyserve
