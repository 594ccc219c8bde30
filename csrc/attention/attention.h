// attention: one work item of causal attention — the `group` query heads that share one KV head (GQA), over
// `len` cached positions given as K and V row pointers (kv_rows.h: rows in the cache's dtype).
//
// attend_online: keys a tile at a time (whole paged blocks: tiles end where the cache's blocks do, so a tile
// never depends on the batch), a running max and denominator per head, the output rescaled as the max moves;
// no score vector longer than a tile. Each tile is taken as small matrix products (attention_tile.h), read in
// place or, where a run of queries reads it, widened to f32 once; each value's order of operations is fixed.
// attend_ref, its reference twin, is the kernel it grew from: all len scores, one softmax, one weighted sum.
// They agree within float rounding (tests/kernels/test_kv_dtype.py: 2e-6 on random rows), not bit for bit: the sums
// run in other orders. attend picks by length alone (so a token's result still depends on its position only,
// never its batch): up to kAttnFullRows keys the full kernel, whose bits the engine has always had (on the
// default model a 1e-7 change flips near-tied tokens: tests/models/test_golden.py), beyond it the tiled one, where a
// full score vector outgrows the L1/L2 caches.
#pragma once

#include <vector>

#include "attention/attention_tile.h"
#include "kv/kv_rows.h"

namespace pyserve {

struct AttnHead {
  KVDType dtype = KVDType::F16;
  int group = 1, hd = 0;          // query heads per KV head, values per head
  float scale = 1.f;              // scores × this, then
  float softcap = 0.f;            // > 0: c · tanh(score / c) (gemma2)
  const float* sinks = nullptr;   // [group] or null: gpt-oss's per-head sink logits (in the max and denominator)
};

// Keys past which attend goes online.
constexpr int kAttnFullRows = 1024;
// Keys per attend_online step (the engine rounds it up to whole blocks): a tile's scores stay in L1.
constexpr int kAttnTileRows = 128;

// One query's online softmax over some of its keys: per head the running max, denominator and sum.
struct OnlineState {
  std::vector<float> acc;         // [group × hd] the running sum
  std::vector<float> m, l, corr;  // [group] running max, denominator, this tile's rescale
};

// Scratch of one query, grown to the largest tile and kept.
struct AttnScratch {
  std::vector<float> s;           // [group × tile, padded] scores, then weights
  OnlineState part[2];            // the keys before attn_split, and from it
  KVTile tile;                    // the K/V tile widened (attend_run: sc[0]'s, for the whole run)
};

// An online query's keys are two parts, [0, split) and [split, len), each its own online softmax, the two
// combined at the end (online_combine): decode gives them to two threads where one KV head would leave a
// thread idle (Model::attention), and a prompt's rows take the same two parts in one thread, so a token's bits
// stay its position's alone. split: the first key of the middle tile (rounded up) of for_tiles(len, lead,
// tile), len if there is one tile.
int attn_split(int len, int lead, int tile);
// Part p (0 or 1) of attend_online's query into sc.part[p]. Does not throw.
void attend_part(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                 int lead, int tile, int p, AttnScratch& sc);
// out[group, hd] from the parts' states (s1 may have taken no key).
void online_combine(const AttnHead& a, const OnlineState& s0, const OnlineState& s1, float* out);

// out[group, hd] = softmax(scale · q·kᵀ) · v over the len rows. q: [group, hd]; k, v: len rows each.
// attend_online: the first tile holds `lead` rows (1 ≤ lead; the rest of the first paged block), the others
// `tile` rows; its two parts (attn_split) one after the other. Neither throws.
void attend_online(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                   int lead, int tile, AttnScratch& sc, float* out);
void attend_ref(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len,
                std::vector<float>& sc, float* out);
// Queries of one sequence over the same rows (consecutive positions of a prompt chunk or a draft): query i at
// q + i · q_stride attends over the first len[i] rows, its output at out + i · out_stride.
struct QueryRun {
  const float* q;
  size_t q_stride;
  const int* len;  // [n]
  int n;           // 1 <= n <= kAttnQueryRun
  float* out;
  size_t out_stride;
};
// Queries per QueryRun: their online states and a K/V tile together stay in L1/L2.
constexpr int kAttnQueryRun = 16;
// attend for each query of the run (sc: [n] scratches), bit for bit: the online queries go through the tiles
// together, so a K/V tile is read from memory once for all of them instead of once each (at 8k keys a query's
// rows of one KV head are 2 MB: streamed per query, long prefill was bound by the cache's bandwidth).
void attend_run(const AttnHead& a, const QueryRun& r, const uint8_t* const* k, const uint8_t* const* v, int lead,
                int tile, AttnScratch* sc);
// attend_ref for len <= kAttnFullRows (into sc.s), attend_online beyond.
void attend(const AttnHead& a, const float* q, const uint8_t* const* k, const uint8_t* const* v, int len, int lead,
            int tile, AttnScratch& sc, float* out);

}  // namespace pyserve
