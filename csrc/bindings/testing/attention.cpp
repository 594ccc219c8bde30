// attention: the KV row formats and the attention kernels beside their scalar twins (kv_rows.h,
// attention.h, attention_tile.h; the formats against llama.cpp's), and the gated delta rule (delta_rule.h).
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
#include "attention/attention.h"
#include "attention/attention_tile.h"
#include "kernels/delta_rule.h"
#include "kv/kv_rows.h"

namespace py = pybind11;

namespace pyserve {

namespace {

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

}  // namespace

void bind_testing_attention(py::module_& m) {
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

}  // namespace pyserve
