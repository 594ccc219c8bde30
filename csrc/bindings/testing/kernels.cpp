// kernels: the quantized kernels beside their scalar twins (tests hold the SIMD paths to them and the
// dequantizers to gguf's): dequantize, vec_dot*, matmul, the activation formats.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/testing/testing.h"
#include "base/simd.h"
#include "kernels/ops.h"
#include "kernels/packed.h"
#include "kernels/packed_amx.h"
#include "kernels/quant.h"

namespace py = pybind11;

namespace pyserve {

namespace {

const TypeTraits& traits_or_throw(uint32_t type) {
  const TypeTraits* tt = type_traits(type);
  if (!tt) throw std::invalid_argument("unsupported GGML type id " + std::to_string(type));
  return *tt;
}

py::array_t<float> py_dequantize(uint32_t type, u8array raw, int64_t n) {
  const TypeTraits& tt = traits_or_throw(type);
  if (n % tt.block_size) throw std::invalid_argument("n is not a multiple of the block size");
  if ((size_t)raw.size() < row_size((GGMLType)type, n)) throw std::invalid_argument("raw data too short");
  py::array_t<float> out(n);
  dequantize_row((GGMLType)type, raw.data(), out.mutable_data(), n);
  return out;
}

// The rows of x ([ncols, n], or one row [n]) in activation format f, act_row_size(f, n) bytes apart.
std::vector<uint8_t> act_bytes(ActFormat f, const f32array& x) {
  const int64_t n = x.ndim() == 2 ? x.shape(1) : x.size(), ncols = x.ndim() == 2 ? x.shape(0) : 1;
  const size_t stride = act_row_size(f, n);
  std::vector<uint8_t> buf(stride * ncols);
  for (int64_t c = 0; c < ncols; c++) quantize_act_row(f, x.data() + c * n, buf.data() + c * stride, n);
  return buf;
}

// out[c · nrows + r] = row r of w (rb bytes apart) · activation column c, through the kernels the engine's
// matmul runs for type t: the packed groups (packed.h) where t is packable, the rows zero-padded to whole
// groups (a zero block has scale 0), vec_dot_tile otherwise.
void engine_products(GGMLType t, int64_t n, const uint8_t* w, size_t rb, int64_t nrows, const uint8_t* act,
                     int ncols, float* out) {
  const size_t stride = act_row_size(type_traits((uint32_t)t)->act, n);
  if (!packable(t)) return vec_dot_tile(t, n, w, rb, nrows, act, stride, ncols, out, nrows);
  const int64_t padded = (nrows + PACK_ROWS - 1) / PACK_ROWS * PACK_ROWS;
  std::vector<uint8_t> rows(padded * rb, 0);
  std::memcpy(rows.data(), w, nrows * rb);
  const auto p = pack_weight(t, rows.data(), rb, padded, n);
  std::vector<float> all((size_t)ncols * padded);
  packed_tile(*p, 0, p->n_groups, act, stride, ncols, all.data(), padded);
  for (int c = 0; c < ncols; c++) std::memcpy(out + c * nrows, all.data() + c * padded, nrows * sizeof(float));
}

float py_vec_dot(uint32_t type, u8array w_row, f32array x, const std::string& impl) {
  const TypeTraits& tt = traits_or_throw(type);
  int64_t n = x.size();
  const size_t rb = row_size((GGMLType)type, n);
  if ((size_t)w_row.size() < rb) throw std::invalid_argument("weight row too short");
  std::vector<uint8_t> act = act_bytes(tt.act, x);
  if (impl == "ref") return vec_dot_ref((GGMLType)type, n, w_row.data(), act.data());
  if (impl != "simd") throw std::invalid_argument("impl must be 'ref' or 'simd'");
  float out;
  engine_products((GGMLType)type, n, w_row.data(), rb, 1, act.data(), 1, &out);
  return out;
}

// x: [ncols, n] float32 → out[ncols], one weight row against every column
py::array_t<float> py_vec_dot_cols(uint32_t type, u8array w_row, f32array x) {
  const TypeTraits& tt = traits_or_throw(type);
  if (x.ndim() != 2) throw std::invalid_argument("x must be 2-D [ncols, n]");
  int64_t ncols = x.shape(0), n = x.shape(1);
  const size_t rb = row_size((GGMLType)type, n);
  if ((size_t)w_row.size() < rb) throw std::invalid_argument("weight row too short");
  std::vector<uint8_t> act = act_bytes(tt.act, x);
  py::array_t<float> out(ncols);
  engine_products((GGMLType)type, n, w_row.data(), rb, 1, act.data(), (int)ncols, out.mutable_data());
  return out;
}

// w_rows: [nrows, row_bytes] raw weight rows; x: [ncols, n] → [ncols, nrows]
py::array_t<float> py_vec_dot_tile(uint32_t type, u8array w_rows, f32array x) {
  const TypeTraits& tt = traits_or_throw(type);
  if (w_rows.ndim() != 2 || x.ndim() != 2) throw std::invalid_argument("w_rows and x must be 2-D");
  const int64_t nrows = w_rows.shape(0), ncols = x.shape(0), n = x.shape(1);
  const size_t rb = row_size((GGMLType)type, n);
  if ((size_t)w_rows.shape(1) != rb) throw std::invalid_argument("w_rows' second dimension must be the row size");
  std::vector<uint8_t> act = act_bytes(tt.act, x);
  py::array_t<float> out({ncols, nrows});
  engine_products((GGMLType)type, n, w_rows.data(), rb, nrows, act.data(), (int)ncols, out.mutable_data());
  return out;
}

// w_rows: [nrows, row_bytes]; x: [T, n] → y[T, nrows] through ops' matmul, with the rows packed (packed.h)
// when `pack` and the type allows, else through vec_dot_tile.
py::array_t<float> py_matmul(uint32_t type, u8array w_rows, f32array x, int threads, bool pack) {
  traits_or_throw(type);
  if (w_rows.ndim() != 2 || x.ndim() != 2) throw std::invalid_argument("w_rows and x must be 2-D");
  Weight W;
  W.type = (GGMLType)type;
  W.n_in = x.shape(1);
  W.n_out = w_rows.shape(0);
  W.row_bytes = row_size(W.type, W.n_in);
  if ((size_t)w_rows.shape(1) != W.row_bytes) throw std::invalid_argument("w_rows' second dimension must be the row size");
  W.data = w_rows.data();
  if (pack && packable(W.type)) W.packed = pack_weight(W.type, W.data, W.row_bytes, W.n_out, W.n_in);
  const int64_t T = x.shape(0);
  py::array_t<float> out({T, W.n_out});
  ThreadPool pool(threads);
  ActBuffer act;
  matmul(pool, W, x.data(), T, out.mutable_data(), act);
  return out;
}

// Round trip of an activation row through its quantized format (for tests of quantize_act_row).
py::array_t<float> py_act_roundtrip(uint32_t type, f32array x) {
  const TypeTraits& tt = traits_or_throw(type);
  int64_t n = x.size();
  std::vector<uint8_t> act = act_bytes(tt.act, x);
  py::array_t<float> out(n);
  float* o = out.mutable_data();
  if (tt.act == ActFormat::F32) {
    std::memcpy(o, act.data(), n * sizeof(float));
  } else if (tt.act == ActFormat::Q8_32) {
    auto* b = reinterpret_cast<const block_q8_32*>(act.data());
    for (int64_t i = 0; i < n; i++) o[i] = b[i / QK].d * b[i / QK].qs[i % QK];
  } else {
    auto* b = reinterpret_cast<const block_q8_K*>(act.data());
    for (int64_t i = 0; i < n; i++) o[i] = b[i / QK_K].d * b[i / QK_K].qs[i % QK_K];
  }
  return out;
}

}  // namespace

void bind_testing_kernels(py::module_& m) {
  m.def("dequantize", &py_dequantize, py::arg("type"), py::arg("raw"), py::arg("n"),
        "Dequantize n elements of GGML type id `type` from raw bytes.");
  // vec_dot / vec_dot_cols / vec_dot_tile: products through the SIMD path the engine runs for the type (the
  // packed kernels of a packable type, the per-row kernels otherwise; a scalar build: the reference).
  m.def("vec_dot", &py_vec_dot, py::arg("type"), py::arg("w_row"), py::arg("x"), py::arg("impl") = "simd",
        "Dot of one raw weight row with float x (quantized to the type's activation format first); "
        "impl='simd': the engine's kernel for the type (packed types: the row in a group of 8 with 7 zero "
        "rows), impl='ref': the scalar reference.");
  m.def("vec_dot_cols", &py_vec_dot_cols, py::arg("type"), py::arg("w_row"), py::arg("x"),
        "-> [ncols]: one raw weight row against every row of x [ncols, n]");
  m.def("vec_dot_tile", &py_vec_dot_tile, py::arg("type"), py::arg("w_rows"), py::arg("x"),
        "-> [ncols, nrows]: raw weight rows [nrows, row_bytes] against the rows of x [ncols, n]");
  m.def("matmul", &py_matmul, py::arg("type"), py::arg("w_rows"), py::arg("x"), py::arg("threads") = 1,
        py::arg("pack") = true);
  m.def("packable", [](uint32_t type) { return packable((GGMLType)type); });
  m.def("simd", [] {  // the x86 paths this build compiled in (simd.h); amx: the AMX kernels run here
    return py::dict(py::arg("avx2") = (bool)PS_AVX2, py::arg("avx512bw") = (bool)PS_AVX512BW,
                    py::arg("vnni") = (int)PS_VNNI, py::arg("amx") = amx_usable());
  });
  m.def("act_roundtrip", &py_act_roundtrip, py::arg("type"), py::arg("x"));
  m.def("type_info", [](uint32_t type) {
    const TypeTraits& tt = traits_or_throw(type);
    return py::dict(py::arg("name") = tt.name, py::arg("block_size") = tt.block_size,
                    py::arg("type_size") = tt.type_size);
  });
}

}  // namespace pyserve
