// kv_rows: the formats a KV cache slot can hold its K (or V) row in, and attention's kernels over them.
//
// A row of n values is stored as f32 (4n bytes), f16 or bf16 (2n bytes: llama.cpp's default f16), q8_0
// (n/32 blocks of llama.cpp's block_q8_0: an fp16 scale d and 32 int8, 34 bytes: d·q). (q4_0 was tried and
// left out: docs/BENCHMARKS.md, 2026-12-02, measures its cost.) The query and the weights stay f32;
// each stored value is widened to f32 exactly (d·q is exact in f32) before its multiply-add, so every kernel
// has one reduction order per output, the same in its SIMD version and its scalar twin (`*_ref`: bit for bit,
// tests/kernels/test_kv_dtype.py), whatever the batch, the number of rows or where a row falls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyserve {

enum class KVDType { F32, F16, BF16, Q8_0 };

// "f32" | "f16" | "bf16" | "q8_0" → the type. Throws std::invalid_argument naming kv_cache_dtype,
// the value and the allowed ones.
KVDType kv_dtype_from_name(const std::string& name);
const char* kv_dtype_name(KVDType t);
// Values per block of the type (32 for q8_0, else 1): a row's width must be a multiple of it.
int kv_dtype_block(KVDType t);
// Bytes of a row of n values (n a multiple of kv_dtype_block(t); not checked here: KV geometry checks widths).
size_t kv_row_bytes(KVDType t, int64_t n);

// x[n] f32 → one stored row at dst (q8_0: per 32, d = amax / 127, codes round to nearest, as llama.cpp's
// quantize_row_q8_0_ref).
void kv_write_row(KVDType t, const float* x, uint8_t* dst, int64_t n);
// x[n] back from a stored row (tests and references).
void kv_read_row(KVDType t, const uint8_t* src, float* x, int64_t n);

// Rows x[0, n) (hd values each, stored as t) widened to f32 exactly: out[j·hd + i].
void kv_widen_rows(KVDType t, const uint8_t* const* x, int n, int hd, float* out);

// Attention scores of the nh query heads q[nh, hd] that share K rows (GQA): s[h·len + j] = q_h · k[j] for
// j < len, each K row (hd values in type t) loaded once for all heads. next (or null): len rows (the V rows)
// brought into cache meanwhile.
void kv_scores(KVDType t, const float* q, int nh, int hd, const uint8_t* const* k, int len, float* s,
               const uint8_t* const* next = nullptr);
// out[h·hd + i] = Σ_j w[h·len + j] · v[j][i], j in order, for h < nh: attention's weighted sum of V rows.
void kv_weighted_sum(KVDType t, const float* w, int nh, int len, const uint8_t* const* v, int hd, float* out);
// The scalar twins: the same reduction orders, one value at a time.
void kv_scores_ref(KVDType t, const float* q, int nh, int hd, const uint8_t* const* k, int len, float* s);
void kv_weighted_sum_ref(KVDType t, const float* w, int nh, int len, const uint8_t* const* v, int hd, float* out);

}  // namespace pyserve
