// disk_tier: the KV cache's disk tier alone (kv/disk_tier.h), over a directory, no model: blocks are byte
// arrays the test makes.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/testing/testing.h"
#include "kv/disk_tier.h"

namespace py = pybind11;

namespace pyserve {

namespace {

class PyDiskTier {
 public:
  PyDiskTier(const std::string& dir, int64_t max_bytes, uint64_t layout, size_t payload_bytes, int block_size,
             size_t max_queue_bytes)
      : tier_(std::make_unique<DiskTier>(dir, max_bytes, layout, payload_bytes, block_size, max_queue_bytes)) {}

  DiskTier& tier() {
    if (!tier_) throw std::logic_error("the disk tier is closed");
    return *tier_;
  }
  void put(uint64_t hash, uint64_t parent, const std::vector<int32_t>& tokens, const py::bytes& payload) {
    const std::string data = payload;
    check(tokens, data.size());
    py::gil_scoped_release nogil;
    tier().put(hash, parent, tokens.data(), reinterpret_cast<const uint8_t*>(data.data()));
  }
  py::object get(uint64_t hash, uint64_t parent, const std::vector<int32_t>& tokens) {
    check(tokens, tier().payload_bytes());
    std::vector<uint8_t> out(tier().payload_bytes());
    bool ok;
    {
      py::gil_scoped_release nogil;
      ok = tier().get(hash, parent, tokens.data(), out.data());
    }
    if (!ok) return py::none();
    return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
  }
  py::dict stats() {
    const DiskTierStats s = tier().stats();
    return py::dict(py::arg("hits") = s.hits, py::arg("misses") = s.misses, py::arg("corrupt") = s.corrupt,
                    py::arg("bytes_read") = s.bytes_read, py::arg("bytes_written") = s.bytes_written,
                    py::arg("writes") = s.writes, py::arg("write_errors") = s.write_errors,
                    py::arg("dropped") = s.dropped, py::arg("evicted") = s.evicted, py::arg("bytes") = s.bytes,
                    py::arg("entries") = s.entries);
  }
  void close() {
    py::gil_scoped_release nogil;
    tier_.reset();
  }

 private:
  void check(const std::vector<int32_t>& tokens, size_t payload) {
    if ((int)tokens.size() != tier().block_size() || payload != tier().payload_bytes())
      throw std::invalid_argument("a block is block_size tokens and payload_bytes bytes");
  }
  std::unique_ptr<DiskTier> tier_;
};

}  // namespace

void bind_testing_disk_tier(py::module_& m) {
  py::class_<PyDiskTier>(m, "DiskTier", "The KV cache's disk tier over a directory (kv/disk_tier.h), no model.")
      .def(py::init<const std::string&, int64_t, uint64_t, size_t, int, size_t>(), py::arg("dir"),
           py::arg("max_bytes"), py::arg("layout"), py::arg("payload_bytes"), py::arg("block_size"),
           py::arg("max_queue_bytes") = (size_t)256 << 20)
      .def("put", &PyDiskTier::put, py::arg("hash"), py::arg("parent"), py::arg("tokens"), py::arg("payload"),
           "queues the block's write (a copy)")
      .def("get", &PyDiskTier::get, py::arg("hash"), py::arg("parent"), py::arg("tokens"),
           "-> the payload (bytes) or None: a miss, or an entry that failed its checks (then deleted)")
      .def("contains", [](PyDiskTier& t, uint64_t h) { return t.tier().contains(h); }, py::arg("hash"))
      .def("flush", [](PyDiskTier& t) {
             py::gil_scoped_release nogil;
             t.tier().flush();
           }, "returns once every queued write is done")
      .def("stats", &PyDiskTier::stats)
      .def("close", &PyDiskTier::close, "writes what is queued and stops the writer (a restart's first half)");
}

}  // namespace pyserve
