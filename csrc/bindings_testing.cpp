// bindings_testing: the engine's parts alone, as pyserve._engine.testing: the quantized kernels beside their
// scalar twins, the sampler on synthetic logits, the block manager over numbered tables, and the scheduler
// over a simulated model (SchedulerSim). Tests and benchmarks only; nothing in pyserve/ imports it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <map>
#include <memory>
#include <stdexcept>

#include "bindings.h"
#include "block_manager.h"
#include "grammar.h"
#include "attention.h"
#include "delta_rule.h"
#include "kv_rows.h"
#include "machine_limits.h"
#include "ops.h"
#include "packed.h"
#include "packed_amx.h"
#include "quant.h"
#include "sampler.h"
#include "scheduler.h"
#include "sequence.h"
#include "sequence_groups.h"
#include "simd.h"
#include "step_cost.h"
#include "threadpool.h"

namespace py = pybind11;

namespace pyserve {

namespace {

using u8array = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
using f32array = py::array_t<float, py::array::c_style | py::array::forcecast>;

const TypeTraits& traits_or_throw(uint32_t type) {
  const TypeTraits* tt = type_traits(type);
  if (!tt) throw std::invalid_argument("unsupported GGML type id " + std::to_string(type));
  return *tt;
}

// ---- quant (tests hold the SIMD paths to their scalar twins and the dequantizers to gguf's) ----

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

void bind_quant(py::module_& m) {
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

// ---- KV cache rows (kv_rows.h: each kernel against its scalar twin, the formats against llama.cpp's) ----

// x: [rows, n] → [rows, kv_row_bytes(dtype, n)] stored rows.
py::array_t<uint8_t> py_kv_write(const std::string& dtype, f32array x) {
  const KVDType t = kv_dtype_from_name(dtype);
  if (x.ndim() != 2) throw std::invalid_argument("x must be 2-D [rows, n]");
  const py::ssize_t rows = x.shape(0), n = x.shape(1), rb = (py::ssize_t)kv_row_bytes(t, n);
  if (n % kv_dtype_block(t)) throw std::invalid_argument("n is not a multiple of the dtype's block");
  py::array_t<uint8_t> out({rows, rb});
  for (py::ssize_t r = 0; r < rows; r++) kv_write_row(t, x.data() + r * n, out.mutable_data() + r * rb, n);
  return out;
}

// The row pointers of raw [len, row_bytes] stored rows, checked against a width of hd values.
std::vector<const uint8_t*> kv_rows_of(KVDType t, const u8array& raw, int hd) {
  if (raw.ndim() != 2 || (size_t)raw.shape(1) != kv_row_bytes(t, hd) || hd % kv_dtype_block(t))
    throw std::invalid_argument("rows must be 2-D [len, kv_row_bytes(dtype, hd)]");
  std::vector<const uint8_t*> rows(raw.shape(0));
  for (size_t j = 0; j < rows.size(); j++) rows[j] = raw.data() + j * raw.shape(1);
  return rows;
}

py::array_t<float> py_kv_read(const std::string& dtype, u8array raw, int n) {
  const KVDType t = kv_dtype_from_name(dtype);
  const std::vector<const uint8_t*> rows = kv_rows_of(t, raw, n);
  py::array_t<float> out({(py::ssize_t)rows.size(), (py::ssize_t)n});
  for (size_t j = 0; j < rows.size(); j++) kv_read_row(t, rows[j], out.mutable_data() + j * n, n);
  return out;
}

// q: [nh, hd], k: [len, row_bytes] → s[nh, len]; impl "simd" (the engine's) or "ref" (the scalar twin).
py::array_t<float> py_kv_scores(const std::string& dtype, f32array q, u8array k, const std::string& impl) {
  const KVDType t = kv_dtype_from_name(dtype);
  if (q.ndim() != 2) throw std::invalid_argument("q must be 2-D [nh, hd]");
  const int nh = (int)q.shape(0), hd = (int)q.shape(1);
  const std::vector<const uint8_t*> rows = kv_rows_of(t, k, hd);
  const int len = (int)rows.size();
  py::array_t<float> out({(py::ssize_t)nh, (py::ssize_t)len});
  if (impl == "ref") kv_scores_ref(t, q.data(), nh, hd, rows.data(), len, out.mutable_data());
  else if (impl == "simd") kv_scores(t, q.data(), nh, hd, rows.data(), len, out.mutable_data(), rows.data());
  else throw std::invalid_argument("impl must be 'ref' or 'simd'");
  return out;
}

// w: [nh, len], v: [len, row_bytes] → out[nh, hd].
py::array_t<float> py_kv_weighted_sum(const std::string& dtype, f32array w, u8array v, int hd, const std::string& impl) {
  const KVDType t = kv_dtype_from_name(dtype);
  if (w.ndim() != 2) throw std::invalid_argument("w must be 2-D [nh, len]");
  const std::vector<const uint8_t*> rows = kv_rows_of(t, v, hd);
  const int nh = (int)w.shape(0), len = (int)w.shape(1);
  if ((size_t)len != rows.size()) throw std::invalid_argument("w's second dimension must be v's rows");
  py::array_t<float> out({(py::ssize_t)nh, (py::ssize_t)hd});
  if (impl == "ref") kv_weighted_sum_ref(t, w.data(), nh, len, rows.data(), hd, out.mutable_data());
  else if (impl == "simd") kv_weighted_sum(t, w.data(), nh, len, rows.data(), hd, out.mutable_data());
  else throw std::invalid_argument("impl must be 'ref' or 'simd'");
  return out;
}

// One attention work item: q [group, hd] over stored k, v [len, row_bytes]; impl "online" (attend_online, the
// first tile `lead` rows, then `tile`), "parts" (its two parts of keys in two scratches, then combined, as a
// decode step's threads take them) or "ref" (attend_ref). sinks: [group] or empty.
py::array_t<float> py_attend(const std::string& dtype, f32array q, u8array k, u8array v, float scale, float softcap,
                             const std::vector<float>& sinks, int lead, int tile, const std::string& impl) {
  const KVDType t = kv_dtype_from_name(dtype);
  if (q.ndim() != 2) throw std::invalid_argument("q must be 2-D [group, hd]");
  const int G = (int)q.shape(0), hd = (int)q.shape(1);
  const std::vector<const uint8_t*> kr = kv_rows_of(t, k, hd), vr = kv_rows_of(t, v, hd);
  if (kr.size() != vr.size() || kr.empty() || lead < 1 || tile < 1 || (!sinks.empty() && (int)sinks.size() != G))
    throw std::invalid_argument("k and v need the same rows (at least one); lead, tile >= 1; sinks [group] or []");
  const AttnHead a{t, G, hd, scale, softcap, sinks.empty() ? nullptr : sinks.data()};
  py::array_t<float> out({(py::ssize_t)G, (py::ssize_t)hd});
  if (impl == "online") {
    AttnScratch sc;
    attend_online(a, q.data(), kr.data(), vr.data(), (int)kr.size(), lead, tile, sc, out.mutable_data());
  } else if (impl == "parts") {  // as a decode step's two threads: each part in its own scratch, then combined
    AttnScratch sc[2];
    for (int p = 0; p < 2; p++) attend_part(a, q.data(), kr.data(), vr.data(), (int)kr.size(), lead, tile, p, sc[p]);
    online_combine(a, sc[0].part[0], sc[1].part[1], out.mutable_data());
  } else if (impl == "ref") {
    std::vector<float> sc;
    attend_ref(a, q.data(), kr.data(), vr.data(), (int)kr.size(), sc, out.mutable_data());
  } else {
    throw std::invalid_argument("impl must be 'online', 'parts' or 'ref'");
  }
  return out;
}

// attend_run: queries q [n, group, hd] of one sequence, query i over the first lens[i] of the stored rows k, v
// -> [n, group, hd]. Each row must be attend's for that query alone (ref up to kAttnFullRows rows, else online).
py::array_t<float> py_attend_run(const std::string& dtype, f32array q, u8array k, u8array v, const std::vector<int>& lens,
                                 float scale, int lead, int tile) {
  const KVDType t = kv_dtype_from_name(dtype);
  if (q.ndim() != 3) throw std::invalid_argument("q must be 3-D [n, group, hd]");
  const int n = (int)q.shape(0), G = (int)q.shape(1), hd = (int)q.shape(2);
  const std::vector<const uint8_t*> kr = kv_rows_of(t, k, hd), vr = kv_rows_of(t, v, hd);
  bool ok = n >= 1 && n <= kAttnQueryRun && (int)lens.size() == n && kr.size() == vr.size() && lead >= 1 && tile >= 1;
  for (int l : lens) ok = ok && l >= 1 && l <= (int)kr.size();
  if (!ok) throw std::invalid_argument("1 <= n <= kAttnQueryRun queries, a length in [1, rows] each; lead, tile >= 1");
  py::array_t<float> out({(py::ssize_t)n, (py::ssize_t)G, (py::ssize_t)hd});
  static thread_local std::vector<AttnScratch> sc;  // kept between calls, as the engine keeps its scratch
  sc.resize(kAttnQueryRun);
  const AttnHead a{t, G, hd, scale, 0.f, nullptr};
  const QueryRun run{q.data(), (size_t)G * hd, lens.data(), n, out.mutable_data(), (size_t)G * hd};
  attend_run(a, run, kr.data(), vr.data(), lead, tile, sc.data());
  return out;
}

// One step of the tiled attention kernel (attention_tile.h) for q [rows, hd] over the stored rows k, v [nt, ..]
// (read in place, or widened first): the scores, the weights of the first n keys shifted by m [rows] and
// their denominators, o [rows, hd] rescaled by corr [rows] and accumulated. -> (k [ntp, hd], v [nt, hd] as
// the kernels read them, scores [rows, ntp], weights [rows, ntp], denominators [rows], o [rows, hd]); impl
// "simd" (the engine's) or "ref".
py::tuple py_attn_tile_step(const std::string& dtype, f32array q, u8array k, u8array v, int n, f32array m,
                            f32array corr, f32array o, bool widen, const std::string& impl) {
  const KVDType t = kv_dtype_from_name(dtype);
  const int rows = q.ndim() == 2 ? (int)q.shape(0) : 0, hd = rows ? (int)q.shape(1) : 0;
  const std::vector<const uint8_t*> kr = kv_rows_of(t, k, hd), vr = kv_rows_of(t, v, hd);
  const int nt = (int)kr.size();
  if (!rows || kr.size() != vr.size() || nt < 1 || n < 1 || n > nt || m.size() != rows || corr.size() != rows ||
      o.size() != (py::ssize_t)rows * hd || (impl != "simd" && impl != "ref"))
    throw std::invalid_argument("q [rows, hd]; k, v the same rows (>= 1); 1 <= n <= rows of k; m, corr [rows]; "
                                "o [rows, hd]; impl 'simd' or 'ref'");
  KVTile tile;
  tile_rows(t, kr.data(), vr.data(), nt, hd, widen, tile);
  const bool ref = impl == "ref";
  py::array_t<float> kw({tile.ntp, hd}), vw({nt, hd}), sc({rows, tile.ntp}), w({rows, tile.ntp}), l(rows), out({rows, hd});
  kv_widen_rows(tile.dtype, tile.k.data(), tile.ntp, hd, kw.mutable_data());
  kv_widen_rows(tile.dtype, tile.v.data(), nt, hd, vw.mutable_data());
  (ref ? tile_scores_ref : tile_scores)(q.data(), rows, tile, sc.mutable_data());
  std::copy_n(sc.data(), sc.size(), w.mutable_data());
  for (int r = 0; r < rows; r++)
    l.mutable_data()[r] = (ref ? tile_exp_sum_ref : tile_exp_sum)(w.mutable_data() + r * tile.ntp, n, tile.ntp, m.data()[r]);
  std::copy_n(o.data(), o.size(), out.mutable_data());
  (ref ? tile_accumulate_ref : tile_accumulate)(w.data(), rows, n, tile, corr.data(), out.mutable_data());
  return py::make_tuple(kw, vw, sc, w, l, out);
}

// One value head's gated delta rule over n tokens: q, k [n, head_k], v [n, head_v], decay, beta [n], M the
// state (head_k·head_v floats, delta_rule.h's panels) -> (o [n, head_v], M after, M after each token of snap_at).
py::tuple py_delta_rule(f32array q, f32array k, f32array v, f32array decay, f32array beta, f32array M, float scale,
                        const std::vector<int64_t>& snap_at, const std::string& impl) {
  const int64_t n = q.ndim() == 2 ? q.shape(0) : -1, Sk = n >= 0 ? q.shape(1) : 0, Sv = v.ndim() == 2 ? v.shape(1) : 0;
  if (n < 1 || Sk < 1 || Sv < 1 || k.ndim() != 2 || k.shape(0) != n || k.shape(1) != Sk || v.shape(0) != n ||
      decay.size() != n || beta.size() != n || M.size() != Sk * Sv)
    throw std::invalid_argument("q, k [n, head_k], v [n, head_v], decay and beta [n], M [head_k * head_v]; n >= 1");
  std::vector<float> x((size_t)(n * (2 * Sk + Sv)));  // each token's q, k then v, as the engine's qkv rows
  for (int64_t t = 0; t < n; t++) {
    std::memcpy(&x[t * (2 * Sk + Sv)], q.data() + t * Sk, Sk * sizeof(float));
    std::memcpy(&x[t * (2 * Sk + Sv) + Sk], k.data() + t * Sk, Sk * sizeof(float));
    std::memcpy(&x[t * (2 * Sk + Sv) + 2 * Sk], v.data() + t * Sv, Sv * sizeof(float));
  }
  py::array_t<float> o({(py::ssize_t)n, (py::ssize_t)Sv}), m_out((py::ssize_t)(Sk * Sv));
  py::array_t<float> snaps({(py::ssize_t)snap_at.size(), (py::ssize_t)(Sk * Sv)});
  std::vector<float*> snap((size_t)n, nullptr);
  for (size_t s = 0; s < snap_at.size(); s++) {
    if (snap_at[s] < 0 || snap_at[s] >= n) throw std::invalid_argument("snap_at: token indices in [0, n)");
    snap[(size_t)snap_at[s]] = snaps.mutable_data() + s * Sk * Sv;
  }
  std::memcpy(m_out.mutable_data(), M.data(), (size_t)(Sk * Sv) * sizeof(float));
  const DeltaRuleRun run{x.data(), x.data() + Sk, x.data() + 2 * Sk, 2 * Sk + Sv, decay.data(), beta.data(), 1,
                         o.mutable_data(), Sv, snap.data()};
  if (impl != "simd" && impl != "ref") throw std::invalid_argument("impl must be 'simd' or 'ref'");
  (impl == "simd" ? delta_rule : delta_rule_reference)(run, n, (int)Sk, (int)Sv, scale, m_out.mutable_data());
  return py::make_tuple(o, m_out, snaps);
}

void bind_kv_rows(py::module_& m) {
  m.def("delta_rule", &py_delta_rule, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("decay"), py::arg("beta"),
        py::arg("M"), py::arg("scale") = 1.f, py::arg("snap_at") = std::vector<int64_t>{}, py::arg("impl") = "simd");
  m.def("attend", &py_attend, py::arg("dtype"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale") = 1.f,
        py::arg("softcap") = 0.f, py::arg("sinks") = std::vector<float>{}, py::arg("lead") = 16, py::arg("tile") = 128,
        py::arg("impl") = "online");
  m.def("attend_run", &py_attend_run, py::arg("dtype"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("lens"),
        py::arg("scale") = 1.f, py::arg("lead") = 16, py::arg("tile") = 128);
  m.def("attn_tile_step", &py_attn_tile_step, py::arg("dtype"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("n"),
        py::arg("m"), py::arg("corr"), py::arg("o"), py::arg("widen") = false, py::arg("impl") = "simd");
  m.def("attn_full_rows", [] { return kAttnFullRows; });
  m.def("attn_split", &attn_split, py::arg("len"), py::arg("lead"), py::arg("tile"));
  m.def("kv_row_bytes", [](const std::string& d, int64_t n) { return kv_row_bytes(kv_dtype_from_name(d), n); });
  m.def("kv_write", &py_kv_write, py::arg("dtype"), py::arg("x"), "x [rows, n] f32 -> stored rows [rows, bytes]");
  m.def("kv_read", &py_kv_read, py::arg("dtype"), py::arg("raw"), py::arg("n"), "stored rows -> [rows, n] f32");
  m.def("kv_scores", &py_kv_scores, py::arg("dtype"), py::arg("q"), py::arg("k"), py::arg("impl") = "simd");
  m.def("kv_weighted_sum", &py_kv_weighted_sum, py::arg("dtype"), py::arg("w"), py::arg("v"), py::arg("hd"),
        py::arg("impl") = "simd");
}

// ---- sampler (unit-tested on synthetic logits) ----

class PySampler {
 public:
  PySampler(int n_vocab, const py::kwargs& kw) : s_(config_from_kwargs(kw), n_vocab), n_vocab_(n_vocab) {}
  void set_prompt(const std::vector<int32_t>& p) { s_.set_prompt(p); }
  void set_grammar(const std::shared_ptr<Matcher>& g) { s_.set_grammar(g ? g->clone() : nullptr); }
  py::tuple sample(f32array logits) {
    if (logits.size() != n_vocab_) throw std::invalid_argument("logits must have n_vocab elements");
    SampleResult r = s_.sample(logits.data());
    grammar_end_ = r.grammar_end;
    return py::make_tuple(r.token, r.logprob, r.top);
  }
  const std::string& grammar_end() const { return grammar_end_; }
 private:
  Sampler s_;
  int n_vocab_;
  std::string grammar_end_;  // of the last sample
};

// ---- block manager and scheduler without a model (unit tests) ----

class PyBlockManager {
 public:
  PyBlockManager(int num_blocks, int block_size, bool prefix_caching) : bm_(num_blocks, block_size, prefix_caching) {}
  BlockManager& bm() { return bm_; }
  BlockTable& table(int id) { return tables_[id]; }
  const BlockTable& table_or_throw(int id) const {
    auto it = tables_.find(id);
    if (it == tables_.end()) throw std::invalid_argument("no table " + std::to_string(id));
    return it->second;
  }
  // Admission with the cached prefix: -> hit tokens, or -1 (nothing changed) when blocks are short.
  int allocate(int id, const std::vector<int32_t>& tokens, int n_tokens) {
    std::vector<int32_t> prefix = bm_.lookup(tokens);
    if (!bm_.can_allocate(prefix, n_tokens)) return -1;
    return bm_.allocate(tables_[id], tokens, prefix, n_tokens);
  }
  py::object append(int id, int n_computed, int n_tokens) {
    std::vector<BlockCopy> copies;
    if (!bm_.append(tables_[id], n_computed, n_tokens, &copies)) return py::none();
    return py::cast(copies);
  }
  void fork(int src, int dst) { bm_.fork(table_or_throw(src), tables_[dst]); }
  void free(int id) {
    auto it = tables_.find(id);
    if (it == tables_.end()) return;
    bm_.free(it->second);
    tables_.erase(it);
  }
 private:
  BlockManager bm_;
  std::map<int, BlockTable> tables_;
};

// Drives the real Scheduler with fake sequences through the engine's own lifecycle (SequenceGroups: admission,
// the fork of n > 1 requests, finishes and aborts): a step marks the scheduled tokens computed and gives each
// sampling sequence a made-up token (1000 × (index + 1) + its generated count). Everything the engine does
// but the forward and the sampler.
class SchedulerSim {
 public:
  SchedulerSim(int num_blocks, int block_size, int max_num_seqs, int max_batched_tokens, bool prefix_caching,
               int spec_rows)
      : bm_(num_blocks, block_size, prefix_caching),
        sched_(SchedulerConfig{max_num_seqs, max_batched_tokens, block_size, 16, spec_rows}, bm_),
        groups_(sched_, [](const std::string&) {}),
        max_num_seqs_(max_num_seqs) {}

  // Plans against a fixed step-cost model: MACs per row / sampled row / context position, a floor (s) and a
  // rate (s per GMAC).
  void set_step_target(double seconds, const std::array<double, 3>& macs, double floor_s, double s_per_gmac) {
    cost_ = StepCostModel(StepMacs{macs[0], macs[1], macs[2]});
    cost_.set_weights(floor_s, s_per_gmac);
    sched_.set_step_target(seconds, &cost_);
  }
  // Prices drafted rows: seconds[r] is what a step of r rows takes (seconds[0] = 0).
  void set_row_costs(std::vector<double> seconds) {
    row_costs_.seconds = std::move(seconds);
    sched_.set_row_costs(&row_costs_);
  }

  void add(const std::string& id, std::vector<int32_t> tokens, int max_tokens, int n) {
    if (tokens.empty() || max_tokens < 1 || n < 1 || n > max_num_seqs_)
      throw std::invalid_argument("empty prompt, max_tokens < 1, or n outside [1, max_num_seqs]");
    if (groups_.contains(id)) throw std::invalid_argument("duplicate request id '" + id + "'");
    StopConfig stop;
    stop.max_tokens = max_tokens;
    groups_.admit(request_sequence(id, std::move(tokens), std::move(stop), n));
  }

  // Ends sample `index` of the request (< 0: all of them) at once, as the engine's next step would.
  void abort(const std::string& id, int index) { groups_.abort(id, index, [](const Sequence&, int) {}); }

  // drafts: {(id, index): tokens} proposed for decoding sequences this step (the engine's n-gram drafts); a
  // drafted token is accepted while it equals the made-up token the sim draws there.
  using Drafts = std::map<std::pair<std::string, int>, std::vector<int32_t>>;
  py::dict step(const Drafts& drafts) {
    for (Sequence* s : sched_.running()) {
      auto it = drafts.find({s->id, index_of(s)});
      s->draft = it != drafts.end() && s->n_pending() == 1 ? it->second : std::vector<int32_t>{};
      if (!s->draft.empty()) s->draft_policy.tick();
    }
    Schedule sc = sched_.schedule();
    py::list scheduled, finished, tokens;
    for (const ScheduledSeq& s : sc.seqs)
      scheduled.append(py::make_tuple(s.seq->id, index_of(s.seq), s.seq->n_computed, s.n_tokens, s.sample));
    for (const ScheduledSeq& s : sc.seqs)
      for (Sequence* d : groups_.computed(s)) draw(d, tokens, finished);
    return py::dict(py::arg("scheduled") = scheduled, py::arg("copies") = sc.copies, py::arg("tokens") = tokens,
                    py::arg("finished") = finished);
  }

  py::list running() const {
    py::list l;
    for (Sequence* s : sched_.running()) l.append(py::make_tuple(s->id, index_of(s)));
    return l;
  }
  py::list waiting() const {
    py::list l;
    for (Sequence* s : sched_.waiting()) l.append(py::make_tuple(s->id, index_of(s)));
    return l;
  }
  const Sequence& seq(const std::string& id, int index) const {
    if (const SequenceGroups::Group* g = groups_.find(id))
      for (auto& s : *g)
        if (index_of(s.get()) == index) return *s;
    throw std::invalid_argument("no live sequence '" + id + "' #" + std::to_string(index));
  }
  py::dict stats() const {
    return py::dict(py::arg("running") = sched_.num_running(), py::arg("waiting") = sched_.num_waiting(),
                    py::arg("preemptions") = sched_.num_preemptions(), py::arg("blocks_total") = bm_.num_blocks(),
                    py::arg("blocks_used") = bm_.num_used(), py::arg("blocks_cached") = bm_.num_cached(),
                    py::arg("blocks_free") = bm_.num_free(), py::arg("prefix_cache_queries") = bm_.queried_tokens(),
                    py::arg("prefix_cache_hits") = bm_.hit_tokens());
  }
  const BlockManager& bm() const { return bm_; }
  bool has_work() const { return !groups_.empty(); }

 private:
  // A sequence not forked yet answers to its first pending sample.
  static int index_of(const Sequence* s) { return s->pending_samples.empty() ? s->index : s->pending_samples[0]; }

  // d's made-up tokens: one, then one more per drafted token that matched, as the engine's verification.
  void draw(Sequence* d, py::list& tokens, py::list& finished) {
    bool done = false;
    for (size_t j = 0;; j++) {
      const int32_t tok = 1000 * (d->index + 1) + d->n_generated();
      d->tokens.push_back(tok);
      tokens.append(py::make_tuple(d->id, d->index, tok));
      done = d->n_generated() >= d->stop.max_tokens;
      if (done || j == d->draft.size() || tok != d->draft[j]) break;
    }
    if (done) finished.append(py::make_tuple(d->id, d->index));  // before drawn() ends d
    groups_.drawn(d, done);
  }

  BlockManager bm_;  // before sched_, which holds a reference to it
  Scheduler sched_;  // before groups_, likewise
  SequenceGroups groups_;
  StepCostModel cost_;
  RowCosts row_costs_;
  int max_num_seqs_;
};

// The team's chunks over `jobs` jobs of n_chunks each: how many times each chunk ran (each must run once
// per job, whichever thread claims it).
std::vector<int> pool_chunk_runs(int threads, int64_t n_chunks, int jobs) {
  ThreadPool pool(threads);
  std::vector<std::atomic<int>> runs(n_chunks);
  for (int j = 0; j < jobs; j++) pool.run_chunks(n_chunks, [&](int c, int) { runs[c].fetch_add(1); });
  std::vector<int> out;
  for (auto& r : runs) out.push_back(r.load());
  return out;
}

// A two-thread team whose worker stalls inside the first chunk it claims until every other chunk of the
// job is done (a thread the kernel descheduled), over `jobs` jobs: each still finishes, the caller running
// the rest. Returns (the most chunks the worker ran in one job, jobs it took part in, whether a stalled
// chunk gave up waiting after 10 s: a job that needed the stalled thread's share).
std::tuple<int, int, bool> pool_takeover(int64_t n_chunks, int jobs) {
  py::gil_scoped_release nogil;
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> gave_up{false};
  int most = 0, joined = 0;
  for (int j = 0; j < jobs; j++) {
    std::atomic<int> finished{0}, by_worker{0};
    pool.run_chunks(n_chunks, [&](int, int nc) {
      if (std::this_thread::get_id() != caller) {
        by_worker.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (finished.load() < nc - 1 && !gave_up.load())
          if (std::chrono::steady_clock::now() > until) gave_up = true;
      } else {  // some work, so that the worker, spinning between jobs, claims a chunk
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
        while (std::chrono::steady_clock::now() < until) {}
      }
      finished.fetch_add(1);
    });
    most = std::max(most, by_worker.load());
    joined += by_worker.load() > 0;
  }
  return {most, joined, gave_up.load()};
}

}  // namespace

void bind_testing(py::module_& m) {
  m.def("pool_chunk_runs", &pool_chunk_runs, py::arg("threads"), py::arg("n_chunks"), py::arg("jobs"));
  m.def("pool_takeover", &pool_takeover, py::arg("n_chunks"), py::arg("jobs"));
  m.def("read_bandwidth", [](int threads, int64_t mib, int rounds) {
    py::gil_scoped_release nogil;
    return read_bandwidth(threads, (size_t)mib << 20, rounds);
  }, py::arg("threads"), py::arg("mib") = 2048, py::arg("rounds") = 5,
     "bytes/s the threads read together (machine_limits.h); ValueError under 1 thread, 64 MiB or 1 round");
  m.def("int8_peak_macs", [](int threads, bool amx) {
    py::gil_scoped_release nogil;
    return int8_peak_macs(threads, amx);
  }, py::arg("threads"), py::arg("amx") = false,
     "int8 multiply-adds/s in registers: vpdpbusd (256-bit), or AMX TDPBSSD; 0 where this CPU/build has none");
  bind_quant(m);
  bind_kv_rows(m);
  py::class_<PySampler>(m, "Sampler", "the sampler alone, on logits given to it")
      .def(py::init<int, const py::kwargs&>(), py::arg("n_vocab"))
      .def("set_prompt", &PySampler::set_prompt)
      .def("set_grammar", &PySampler::set_grammar, py::arg("grammar"), "draws under a clone of `grammar` (None: free)")
      .def("sample", &PySampler::sample, "-> (token, logprob, [(id, logprob), ...])")
      .def_property_readonly("grammar_end", &PySampler::grammar_end,
                             "the last sample's: 'stop' when it completed the grammar, 'error: …', or ''");
  py::class_<PyBlockManager>(m, "BlockManager", "The engine's KV block manager over numbered tables, no model.")
      .def(py::init<int, int, bool>(), py::arg("num_blocks"), py::arg("block_size"), py::arg("prefix_caching") = true)
      .def_property_readonly("num_blocks", [](PyBlockManager& b) { return b.bm().num_blocks(); })
      .def_property_readonly("block_size", [](PyBlockManager& b) { return b.bm().block_size(); })
      .def_property_readonly("num_free", [](PyBlockManager& b) { return b.bm().num_free(); })
      .def_property_readonly("num_used", [](PyBlockManager& b) { return b.bm().num_used(); })
      .def_property_readonly("num_cached", [](PyBlockManager& b) { return b.bm().num_cached(); })
      .def_property_readonly("queried_tokens", [](PyBlockManager& b) { return b.bm().queried_tokens(); })
      .def_property_readonly("hit_tokens", [](PyBlockManager& b) { return b.bm().hit_tokens(); })
      .def("ref_count", [](PyBlockManager& b, int blk) { return b.bm().ref_count(blk); })
      .def("is_cached", [](PyBlockManager& b, int blk) { return b.bm().is_cached(blk); })
      .def("allocate_block", [](PyBlockManager& b) { return b.bm().allocate_block(); })
      .def("release", [](PyBlockManager& b, int blk) { return b.bm().release(blk); })
      .def("lookup", [](PyBlockManager& b, const std::vector<int32_t>& t) { return b.bm().lookup(t); },
           py::arg("tokens"), "-> the cached prefix's block ids (never the last token's block)")
      .def("can_allocate", [](PyBlockManager& b, const std::vector<int32_t>& tokens, int n_tokens) {
             return b.bm().can_allocate(b.bm().lookup(tokens), n_tokens);
           }, py::arg("tokens"), py::arg("n_tokens"))
      .def("allocate", &PyBlockManager::allocate, py::arg("table"), py::arg("tokens"), py::arg("n_tokens"),
           "-> hit tokens, or -1 when blocks are short")
      .def("append", &PyBlockManager::append, py::arg("table"), py::arg("n_computed"), py::arg("n_tokens"),
           "-> [(src, dst)] copies, or None when blocks are short")
      .def("commit", [](PyBlockManager& b, int id, const std::vector<int32_t>& tokens, int n_computed) {
             b.bm().commit(b.table(id), tokens, n_computed);
           }, py::arg("table"), py::arg("tokens"), py::arg("n_computed"))
      .def("fork", &PyBlockManager::fork, py::arg("src"), py::arg("dst"))
      .def("free", &PyBlockManager::free, py::arg("table"))
      .def("table", [](PyBlockManager& b, int id) { return b.table_or_throw(id).blocks; }, py::arg("table"))
      .def_static("hash_block", [](uint64_t parent, const std::vector<int32_t>& t) {
        return BlockManager::hash_block(parent, t.data(), (int)t.size());
      });

  py::class_<SchedulerSim>(m, "SchedulerSim", "The engine's scheduler over fake sequences, no model.")
      .def(py::init<int, int, int, int, bool, int>(), py::arg("num_blocks"), py::arg("block_size") = 16,
           py::arg("max_num_seqs") = 64, py::arg("max_batched_tokens") = 512, py::arg("prefix_caching") = true,
           py::arg("spec_rows") = 8)
      .def("add", &SchedulerSim::add, py::arg("request_id"), py::arg("tokens"), py::arg("max_tokens"),
           py::arg("n") = 1)
      .def("abort", &SchedulerSim::abort, py::arg("request_id"), py::arg("index") = -1,
           "ends sample `index` of the request (-1: every sample), its blocks back to the pool")
      .def("step", &SchedulerSim::step, py::arg("drafts") = SchedulerSim::Drafts{},
           "drafts {(id, index): tokens} for decoding sequences -> {scheduled: [(id, index, n_computed, "
           "n_tokens, sample)], copies: [(src, dst)], "
           "tokens: [(id, index, token)], finished: [(id, index)]}")
      .def("has_work", &SchedulerSim::has_work)
      .def("set_step_target", &SchedulerSim::set_step_target, py::arg("seconds"), py::arg("macs"),
           py::arg("floor_s"), py::arg("s_per_gmac"),
           "plan each step under `seconds` with a fixed cost model: macs = (per row, per sampled row, per "
           "context position), step time = floor_s + s_per_gmac × GMACs")
      .def("set_row_costs", &SchedulerSim::set_row_costs, py::arg("seconds"),
           "price drafted rows: seconds[r] a step of r rows takes (seconds[0] = 0)")
      .def("running", &SchedulerSim::running, "[(id, index)] in admission order")
      .def("waiting", &SchedulerSim::waiting, "[(id, index)], next first")
      .def("table", [](const SchedulerSim& s, const std::string& id, int i) { return s.seq(id, i).blocks.blocks; },
           py::arg("request_id"), py::arg("index") = 0)
      .def("n_computed", [](const SchedulerSim& s, const std::string& id, int i) { return s.seq(id, i).n_computed; },
           py::arg("request_id"), py::arg("index") = 0)
      .def("tokens", [](const SchedulerSim& s, const std::string& id, int i) { return s.seq(id, i).tokens; },
           py::arg("request_id"), py::arg("index") = 0)
      .def("ref_count", [](const SchedulerSim& s, int blk) { return s.bm().ref_count(blk); })
      .def("stats", &SchedulerSim::stats);
}

}  // namespace pyserve
