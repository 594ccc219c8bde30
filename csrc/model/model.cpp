#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pyserve {

Model::Model(std::shared_ptr<const GGUFFile> file, bool with_mtp, const std::string& packed_path)
    : file_(std::move(file)) {
  hp_ = read_hparams(*file_);
  spec_ = &arch_spec(hp_.arch);
  load_weights(with_mtp);
  pack_weights(packed_path);
}

Weight Model::weight(const std::string& name, int64_t n_in, int64_t n_out) const {
  const GGUFTensor* t = file_->find(name);
  if (!t) file_->fail("missing tensor '" + name + "'");
  if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out)
    file_->fail("tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                "], expected [" + std::to_string(n_in) + ", " + std::to_string(n_out) + "]");
  Weight w;
  w.type = t->type;
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_bytes = row_size(t->type, n_in);
  w.data = t->data;
  return w;
}

std::vector<Weight> Model::experts(const std::string& name, int64_t n_in, int64_t n_out) const {
  const GGUFTensor* t = file_->find(name);
  const int64_t n = hp_.moe.n_expert;
  if (!t) file_->fail("missing tensor '" + name + "'");
  if (t->n_dims != 3 || t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n)
    file_->fail("tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) +
                ", " + std::to_string(t->ne[2]) + "], expected [" + std::to_string(n_in) + ", " +
                std::to_string(n_out) + ", " + std::to_string(n) + "]");
  std::vector<Weight> ws(n);
  for (int64_t e = 0; e < n; e++) {
    Weight& w = ws[e];
    w.type = t->type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = row_size(t->type, n_in);
    w.data = t->data + e * n_out * w.row_bytes;  // expert e's rows follow expert e - 1's
  }
  return ws;
}

std::vector<Weight*> Model::matrices() {
  std::vector<Weight*> ws = {&output_, &mtp_.eh_proj};
  for (LayerWeights& L : layers_) {
    for (Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) ws.push_back(w);
    for (Weight* w : {&L.dn.qkv, &L.dn.gate, &L.dn.beta, &L.dn.alpha, &L.dn.out, &L.sc.in_proj, &L.sc.out_proj})
      ws.push_back(w);
    for (Weight* w : {&L.moe.sh_gate, &L.moe.sh_up, &L.moe.sh_down}) ws.push_back(w);
    for (std::vector<Weight>* es : {&L.moe.gate, &L.moe.up, &L.moe.down})
      for (Weight& w : *es) ws.push_back(&w);
  }
  for (Weight* w : ple_.matrices()) ws.push_back(w);
  ws.erase(std::remove_if(ws.begin(), ws.end(), [](const Weight* w) { return !w->data || !packable(w->type); }),
           ws.end());
  return ws;
}

void Model::pack_weights(const std::string& packed_path) {
  const std::vector<Weight*> ws = matrices();
  if (!packed_path.empty() && map_packed(ws, packed_path)) return;
  for (Weight* w : ws) {
    try {
      w->packed = pack_weight(w->type, w->data, w->row_bytes, w->n_out, w->n_in);
    } catch (const std::bad_alloc&) {
      throw ModelError(file_->path() + ": out of memory packing a " + std::to_string(w->n_out) + " x " +
                       std::to_string(w->n_in) + " matrix");
    }
    file_->drop_pages(w->data, w->row_bytes * (size_t)w->n_out);
  }
}

// The packed weights from the file at `path`, when it holds these (the GGUF's rows are then never read).
bool Model::map_packed(const std::vector<Weight*>& ws, const std::string& path) {
  std::vector<PackedWeight> shapes;
  for (const Weight* w : ws) shapes.push_back(packed_shape(w->type, w->n_out, w->n_in));
  packed_file_ = PackedFile::open(path, shapes);
  if (!packed_file_) return false;
  for (size_t i = 0; i < ws.size(); i++) ws[i]->packed = PackedFile::weight(packed_file_, i, shapes[i]);
  return true;
}

size_t Model::packed_bytes() {
  size_t n = 0;
  for (const Weight* w : matrices()) n += (size_t)w->packed->n_groups * w->packed->group_bytes;
  return n;
}

void Model::save_packed(const std::string& path) {
  std::vector<const PackedWeight*> ps;
  for (const Weight* w : matrices()) ps.push_back(w->packed.get());
  write_packed_file(path, ps);
}

std::vector<float> Model::vec(const std::string& name, int64_t n, bool optional) const {
  const GGUFTensor* t = file_->find(name);
  if (!t) {
    if (optional) return {};
    file_->fail("missing tensor '" + name + "'");
  }
  if (t->nelements() != n)
    file_->fail("tensor '" + name + "' has " + std::to_string(t->nelements()) + " elements, expected " + std::to_string(n));
  std::vector<float> out(n);
  dequantize_row(t->type, t->data, out.data(), n);
  return out;
}

void Model::load_weights(bool with_mtp) {
  const int E = hp_.n_embd;
  tok_embd_ = weight("token_embd.weight", E, hp_.n_vocab);
  output_ = file_->find("output.weight") ? weight("output.weight", E, hp_.n_vocab) : tok_embd_;
  output_norm_ = vec(std::string(spec_->output_norm) + ".weight", E);
  cls_out_ = vec("cls.output.weight", (int64_t)hp_.n_cls_out * E, true);
  cls_out_b_ = vec("cls.output.bias", hp_.n_cls_out, true);
  layers_.resize(hp_.n_layer + (with_mtp ? 1 : 0));
  for (int il = 0; il < hp_.n_layer; il++) load_layer(il);
  if (with_mtp) load_mtp();
  ple_.load(hp_, [this](const std::string& n, int64_t i, int64_t o) { return weight(n, i, o); },
            [this](const std::string& n, int64_t len) { return vec(n, len); });
  ones_.assign(hp_.max_head_dim(), 1.f);
  rope_freqs_ = vec("rope_freqs.weight", hp_.rope_dim / 2, true);
  rope_short_ = vec("rope_factors_short.weight", hp_.rope_dim / 2, true);
  rope_long_ = vec("rope_factors_long.weight", hp_.rope_dim / 2, true);
  set_context(hp_.rope_scaling.n_ctx_orig);
}

void Model::load_layer(int il) {
  const int E = hp_.n_embd;
  LayerWeights& L = layers_[il];
  const std::string p = "blk." + std::to_string(il) + ".";
  if (spec_->pre_norms) {
    L.attn_norm = vec(p + "attn_norm.weight", E);
    L.ffn_norm = vec(p + spec_->ffn_norm + ".weight", E);
  }
  if (hp_.dn.recurrent(il)) load_delta_net(p, L.dn);
  else if (hp_.sc.conv_layer(il)) load_short_conv(p, L.sc);
  else load_attention(p, L, il);
  if (hp_.moe.moe_layer(il)) load_moe(il, L.moe);
  if (!hp_.moe.moe_layer(il) || spec_->moe_gelu) {  // gemma4: its experts run beside the dense FFN
    load_gate_up(p, L, hp_.layer_ff(il));
    L.w_down = weight(p + "ffn_down.weight", hp_.layer_ff(il), E);
  }
  if (spec_->post_norms) {
    L.post_attn_norm = vec(p + "post_attention_norm.weight", E);
    L.post_ffn_norm = vec(p + "post_ffw_norm.weight", E);
  }
  L.out_scale = vec(p + "layer_output_scale.weight", 1, true);
}

// The first MTP layer, blk.<n_layer>: an attention layer of the model's own kind (index n_layer is neither
// recurrent nor shared-KV), then its nextn tensors.
void Model::load_mtp() {
  if (hp_.n_mtp == 0)
    throw ModelError(file_->path() + ": the model has no MTP (NextN) layers (" + hp_.arch +
                     ".nextn_predict_layers is 0), so it cannot draft by MTP");
  const int E = hp_.n_embd;
  const std::string p = "blk." + std::to_string(hp_.n_layer) + ".nextn.";
  load_layer(hp_.n_layer);
  mtp_.eh_proj = weight(p + "eh_proj.weight", 2 * (int64_t)E, E);
  mtp_.enorm = vec(p + "enorm.weight", E);
  mtp_.hnorm = vec(p + "hnorm.weight", E);
  mtp_.head_norm = vec(p + "shared_head_norm.weight", E, true);
}

void Model::load_attention(const std::string& p, LayerWeights& L, int il) {
  const int E = hp_.n_embd, hd = hp_.layer_head_dim(il), qd = hp_.n_head * hd, kvd = hp_.layer_kv_dim(il);
  load_qkv(p, L, il);
  L.wo = weight(p + "attn_output.weight", qd, E);
  L.bq = vec(p + "attn_q.bias", qd, true);
  L.bk = vec(p + "attn_k.bias", kvd, true);
  L.bv = vec(p + "attn_v.bias", kvd, true);
  L.bo = vec(p + "attn_output.bias", E, true);
  L.sinks = vec(p + "attn_sinks.weight", hp_.n_head, true);
  // required where the architecture has them, used wherever the file has them
  L.q_norm = vec(p + "attn_q_norm.weight", spec_->qk_norm_full ? qd : hd, !spec_->qk_norm);
  L.k_norm = vec(p + "attn_k_norm.weight", spec_->qk_norm_full ? kvd : hd, !spec_->qk_norm || !L.wk.data);
}

// llama.cpp's names (src/models/qwen35.cpp): attn_qkv, attn_gate, ssm_conv1d, ssm_dt.bias, ssm_a, ssm_beta,
// ssm_alpha, ssm_norm, ssm_out.
void Model::load_delta_net(const std::string& p, DeltaNetWeights& w) {
  const DeltaNetParams& d = hp_.dn;
  const int E = hp_.n_embd;
  w.qkv = weight(p + "attn_qkv.weight", E, d.conv_dim());
  w.gate = weight(p + "attn_gate.weight", E, d.value_dim());
  w.beta = weight(p + "ssm_beta.weight", E, d.n_v_heads);
  w.alpha = weight(p + "ssm_alpha.weight", E, d.n_v_heads);
  w.out = weight(p + "ssm_out.weight", d.value_dim(), E);
  w.conv = conv_taps_major(vec(p + "ssm_conv1d.weight", d.conv_dim() * d.d_conv), d.conv_dim(), d.d_conv);
  w.dt = vec(p + "ssm_dt.bias", d.n_v_heads);
  w.a = vec(p + "ssm_a", d.n_v_heads);
  w.norm = vec(p + "ssm_norm.weight", d.head_v);
}

// llama.cpp's names (src/models/lfm2.cpp): shortconv.in_proj, shortconv.conv, shortconv.out_proj.
void Model::load_short_conv(const std::string& p, ShortConvWeights& w) {
  const int E = hp_.n_embd;
  w.in_proj = weight(p + "shortconv.in_proj.weight", E, 3 * (int64_t)E);
  w.out_proj = weight(p + "shortconv.out_proj.weight", E, E);
  w.conv = conv_taps_major(vec(p + "shortconv.conv.weight", (int64_t)E * hp_.sc.l_cache), E, hp_.sc.l_cache);
}

// llama.cpp's get_rope_factors: rope_freqs where the file has them, else LongRoPE's long factors for a
// context past the original one and its short factors within it.
void Model::set_context(int n_ctx) {
  const int hd = hp_.head_dim;
  const std::vector<float>& f = !rope_freqs_.empty() ? rope_freqs_
                                : n_ctx > hp_.rope_scaling.n_ctx_orig && !rope_long_.empty() ? rope_long_ : rope_short_;
  const float* ff = f.empty() ? nullptr : f.data();
  rope_global_ = make_rope(hd, hp_.rope_dim, spec_->neox_rope, hp_.rope_base, hp_.rope_scaling, ff);
  const RopeScaling local = spec_->swa_rope_scaled ? hp_.rope_scaling : RopeScaling{};
  const int hd_local = hp_.head_dim_swa > 0 ? hp_.head_dim_swa : hd;  // gemma4: its own width, no factors
  const int rd_local = hp_.rope_dim_swa > 0 ? hp_.rope_dim_swa : hp_.rope_dim;
  rope_local_ = make_rope(hd_local, rd_local, spec_->neox_rope, hp_.rope_base_local, local,
                          spec_->layer_shapes ? nullptr : ff);
}

// Rows [r0, r0 + n) of a matrix: one part of a fused tensor, read in place.
Weight Model::rows(const Weight& w, int64_t r0, int64_t n) const {
  Weight part = w;
  part.n_out = n;
  part.data = w.data + r0 * w.row_bytes;
  return part;
}

// q, k and v: their own tensors, or the row ranges of a fused attn_qkv (phi3).
// gemma4: a shared-KV layer has only q; a layer without attn_v uses K as V.
void Model::load_qkv(const std::string& p, LayerWeights& L, int il) {
  const int E = hp_.n_embd, qd = hp_.n_head * hp_.layer_head_dim(il), kvd = hp_.layer_kv_dim(il);
  if (!file_->find(p + "attn_qkv.weight")) {
    L.wq = weight(p + "attn_q.weight", E, spec_->attn_gate ? 2 * qd : qd);  // qwen35: each head's query, then gate
    if (hp_.kv_layer(il) != il) return;
    L.wk = weight(p + "attn_k.weight", E, kvd);
    if (!spec_->layer_shapes || file_->find(p + "attn_v.weight")) L.wv = weight(p + "attn_v.weight", E, kvd);
    return;
  }
  const Weight qkv = weight(p + "attn_qkv.weight", E, qd + 2 * kvd);
  L.wq = rows(qkv, 0, qd);
  L.wk = rows(qkv, qd, kvd);
  L.wv = rows(qkv, qd + kvd, kvd);
}

// gate and up: their own tensors, or the halves of an ffn_up twice as tall (phi3's SwiGLU: gate first).
void Model::load_gate_up(const std::string& p, LayerWeights& L, int64_t F) {
  const int E = hp_.n_embd;
  if (file_->find(p + "ffn_gate.weight")) {
    L.w_gate = weight(p + "ffn_gate.weight", E, F);
    L.w_up = weight(p + "ffn_up.weight", E, F);
    return;
  }
  const Weight fused = weight(p + "ffn_up.weight", E, 2 * (int64_t)F);
  L.w_gate = rows(fused, 0, F);
  L.w_up = rows(fused, F, F);
}

// llama.cpp's tensor names: ffn_gate_inp (the router, its bias), ffn_{gate,up,down}_exps (their biases),
// exp_probs_b (the choosing bias), ffn_{gate,up,down}_shexp.
void Model::load_moe(int il, MoeWeights& w) {
  const MoeParams& m = hp_.moe;
  const int E = hp_.n_embd;
  const std::string p = "blk." + std::to_string(il) + ".";
  w.router = weight(p + "ffn_gate_inp.weight", E, m.n_expert);
  w.select_bias = vec(p + "exp_probs_b.bias", m.n_expert, true);
  w.router_bias = vec(p + "ffn_gate_inp.bias", m.n_expert, true);
  w.gate_b = vec(p + "ffn_gate_exps.bias", (int64_t)m.n_expert * m.n_ff, true);
  w.up_b = vec(p + "ffn_up_exps.bias", (int64_t)m.n_expert * m.n_ff, true);
  w.down_b = vec(p + "ffn_down_exps.bias", (int64_t)m.n_expert * E, true);
  if (file_->find(p + "ffn_gate_up_exps.weight")) {  // gemma4's fused gate and up: the gate's rows first
    for (const Weight& gu : experts(p + "ffn_gate_up_exps.weight", E, 2 * (int64_t)m.n_ff)) {
      w.gate.push_back(rows(gu, 0, m.n_ff));
      w.up.push_back(rows(gu, m.n_ff, m.n_ff));
    }
  } else {
    w.gate = experts(p + "ffn_gate_exps.weight", E, m.n_ff);
    w.up = experts(p + "ffn_up_exps.weight", E, m.n_ff);
  }
  w.down = experts(p + "ffn_down_exps.weight", m.n_ff, E);
  w.down_scale = vec(p + "ffn_down_exps.scale", m.n_expert, true);
  if (spec_->moe_gelu) {
    w.router_scale = vec(p + "ffn_gate_inp.scale", E);
    w.in_norm = vec(p + "pre_ffw_norm_2.weight", E);
    w.dense_out_norm = vec(p + "post_ffw_norm_1.weight", E);
    w.out_norm = vec(p + "post_ffw_norm_2.weight", E);
  }
  if (m.n_ff_shared > 0) {
    w.sh_gate = weight(p + "ffn_gate_shexp.weight", E, m.n_ff_shared);
    w.sh_up = weight(p + "ffn_up_shexp.weight", E, m.n_ff_shared);
    w.sh_down = weight(p + "ffn_down_shexp.weight", m.n_ff_shared, E);
    w.sh_gate_inp = vec(p + "ffn_gate_inp_shexp.weight", E, true);
  }
}

namespace {

// x[i] = c · tanh(x[i] / c): gemma2's soft-capping of attention scores and logits.
void softcap(float* x, size_t n, float c) {
  for (size_t i = 0; i < n; i++) x[i] = c * std::tanh(x[i] / c);
}

void add_bias(float* y, const std::vector<float>& b) {
  for (size_t i = 0; i < b.size(); i++) y[i] += b[i];
}

}  // namespace

// Causal attention of every batch token over its own sequence's K/V, after writing the batch's K/V.
// A work item is (query run, KV head): a run is up to kAttnQueryRun consecutive tokens of one sequence (one
// token where the layer has a window: each reads other rows), each cached K/V row is loaded once for all the
// query heads that share it (GQA) and, tile by tile, for all the run's tokens (attend_run). Items go
// round-robin to threads, since later tokens of a prompt attend over more positions. A decode step with fewer
// items than threads splits each item in its two parts of keys (attn_split) instead.
void Model::attention(int il, const Batch& b, KVCache& kv, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int src = hp_.kv_layer(il), n_kv = hp_.layer_n_head_kv(il);  // src: the layer whose K/V il reads
  const int T = (int)b.size(), hd = hp_.layer_head_dim(il), bs = kv.block_size();
  const int group = hp_.n_head / n_kv, qd = hp_.n_head * hd;
  const int window = hp_.is_local(il) ? hp_.n_swa : 0;
  const KVDType dt = kv.dtype();
  const size_t head_bytes = kv_row_bytes(dt, hd);  // one KV head's part of a slot's row
  const int tile = (kAttnTileRows + bs - 1) / bs * bs;  // keys per online-softmax step: whole blocks
  if (src == il) store_kv(il, b, kv);
  query_runs(b, window > 0 ? 1 : kAttnQueryRun);
  const int runs = (int)run_first_.size() - 1;
  const int64_t items = (int64_t)runs * n_kv;
  // Decode with fewer KV heads than threads (Gemma 3's one): each online query's two parts of keys
  // (attn_split) on two threads, combined once both are done. A prompt's runs take the parts in one thread.
  const int split = runs == T && items < pool.size() ? 1 : 0;
  if (parts_.size() < (size_t)(items << split)) parts_.resize((size_t)(items << split));
  struct Item {
    AttnHead head;
    QueryRun run;
    int t0, lo, n_rows, g;  // the run's first token; the rows [lo, lo + n_rows) of KV head g
  };
  auto item = [&](int64_t w, int* len) {  // run r's queries on KV head g (w = r · n_kv + g); len[] filled
    const int r = (int)(w / n_kv), g = (int)(w % n_kv), t0 = run_first_[r], n = run_first_[r + 1] - t0;
    const int last = b.pos[t0 + n - 1], lo = window > 0 ? std::max(0, last - window + 1) : 0;
    for (int i = 0; i < n; i++) len[i] = b.pos[t0 + i] - lo + 1;
    const size_t at = (size_t)t0 * qd + (size_t)g * group * hd;
    const float* sinks = L.sinks.empty() ? nullptr : &L.sinks[g * group];
    return Item{{dt, group, hd, hp_.attn_scale, hp_.attn_softcap, sinks},
                {q_.data() + at, (size_t)qd, len, n, attn_.data() + at, (size_t)qd}, t0, lo, last - lo + 1, g};
  };
  auto work = [&](int ith, int nth) {
    for (int64_t w = ith; w < items << split; w += nth) {
      int len[kAttnQueryRun];
      const Item it = item(w >> split, len);
      if (split && (w & 1) && len[0] <= kAttnFullRows) continue;  // a full-kernel query is its even item's alone
      head_rows(kv, src, *b.tables[it.t0], it.lo, it.n_rows, it.g * head_bytes, krows_[ith], vrows_[ith]);
      const uint8_t *const *k = krows_[ith].data(), *const *v = vrows_[ith].data();
      const int lead = bs - it.lo % bs;
      if (!split) attend_run(it.head, it.run, k, v, lead, tile, &scratch_[(size_t)ith * kAttnQueryRun]);
      else if (len[0] > kAttnFullRows) attend_part(it.head, it.run.q, k, v, len[0], lead, tile, (int)(w & 1), parts_[w]);
      else attend_ref(it.head, it.run.q, k, v, len[0], parts_[w].s, it.run.out);
    }
  };
  if ((items << split) <= 1) work(0, 1);
  else pool.run(work);
  for (int64_t w = 0; split && w < items; w++) {
    int len[kAttnQueryRun];
    const Item it = item(w, len);
    if (len[0] > kAttnFullRows) online_combine(it.head, parts_[2 * w].part[0], parts_[2 * w + 1].part[1], it.run.out);
  }
}

// The batch's K and V rows (k_, v_) into their slots of layer il.
void Model::store_kv(int il, const Batch& b, KVCache& kv) {
  const int kvd = hp_.layer_kv_dim(il), bs = kv.block_size();
  for (int t = 0; t < (int)b.size(); t++) {
    const std::vector<int32_t>& tab = *b.tables[t];
    const int p = b.pos[t];
    kv_write_row(kv.dtype(), k_.data() + (size_t)t * kvd, kv.k(il, tab[p / bs], p % bs), kvd);
    kv_write_row(kv.dtype(), v_.data() + (size_t)t * kvd, kv.v(il, tab[p / bs], p % bs), kvd);
  }
}

// K and V rows [lo, lo + n) of a sequence (block table tab) in layer src, at byte offset `at` of each row (a
// KV head's part).
void Model::head_rows(KVCache& kv, int src, const std::vector<int32_t>& tab, int lo, int n, size_t at,
                      std::vector<const uint8_t*>& krows, std::vector<const uint8_t*>& vrows) {
  const int bs = kv.block_size();
  krows.resize(n);
  vrows.resize(n);
  for (int j = 0; j < n; j++) {
    const int blk = tab[(lo + j) / bs], slot = (lo + j) % bs;
    krows[j] = kv.k(src, blk, slot) + at;
    vrows[j] = kv.v(src, blk, slot) + at;
  }
}

// run_first_ ← where each query run starts, then T: consecutive tokens of one sequence at consecutive
// positions, at most `most` a run.
void Model::query_runs(const Batch& b, int most) {
  run_first_.clear();
  const int T = (int)b.size();
  for (int t = 0; t < T; t++)
    if (t == 0 || t - run_first_.back() == most || b.tables[t] != b.tables[t - 1] || b.pos[t] != b.pos[t - 1] + 1)
      run_first_.push_back(t);
  run_first_.push_back(T);
}

void Model::layer(int il, const Batch& b, KVCache& kv, ThreadPool& pool) {
  if (hp_.recurrent(il)) return recurrent_layer(il, b, pool);
  const LayerWeights& L = layers_[il];
  const int T = (int)b.size(), E = hp_.n_embd, hd = hp_.layer_head_dim(il), kvd = hp_.layer_kv_dim(il);
  const int qd = hp_.n_head * hd, n_kv = hp_.layer_n_head_kv(il);
  const bool own_kv = L.wk.data != nullptr;  // gemma4's shared-KV layers read an earlier layer's
  const RopeParams& rp = hp_.is_local(il) ? rope_local_ : rope_global_;
  const float eps = hp_.eps;

  pool.parallel_for(T, [&](int64_t t) { block_input(&x_[t * E], L.attn_norm, &h_[t * E]); }, INLINE_ROWS);
  act_invalidate(act_);
  std::vector<MatmulOut> qkv = {{&L.wq, spec_->attn_gate ? qg_.data() : q_.data()}};
  if (own_kv) qkv.push_back({&L.wk, k_.data()});
  if (L.wv.data) qkv.push_back({&L.wv, v_.data()});
  matmul_group(pool, qkv, h_.data(), T, act_);
  pool.parallel_for(T, [&](int64_t t) {
    float* q = &q_[t * qd];
    float* k = &k_[t * kvd];
    if (spec_->attn_gate)  // per head [query | gate] → q_ and qgate_
      for (int h = 0; h < hp_.n_head; h++) {
        const float* src = &qg_[(size_t)t * 2 * qd + (size_t)h * 2 * hd];
        std::copy(src, src + hd, q + h * hd);
        std::copy(src + hd, src + 2 * hd, &qgate_[(size_t)t * qd + h * hd]);
      }
    add_bias(q, L.bq);
    add_bias(k, L.bk);
    add_bias(&v_[t * kvd], L.bv);
    if (own_kv && spec_->layer_shapes) v_norm(k, &v_[t * kvd], !L.wv.data, n_kv, hd);
    if (spec_->qk_norm_full) {
      rmsnorm(q, L.q_norm.data(), q, qd, eps);
      rmsnorm(k, L.k_norm.data(), k, kvd, eps);
    } else if (!L.q_norm.empty()) {
      rmsnorm_heads(q, L.q_norm.data(), hp_.n_head, hd, eps);
      if (own_kv) rmsnorm_heads(k, L.k_norm.data(), n_kv, hd, eps);
    }
    if (hp_.roped(il)) {
      const float* cs = &rope_cs_[((size_t)hp_.is_local(il) * T + t) * cs_stride()];
      rope(q, hp_.n_head, cs, rp);
      if (own_kv) rope(k, n_kv, cs, rp);
    }
    const float temp = hp_.attn_temperature(b.pos[t]);  // mistral3: long positions attend more sharply
    if (temp != 1.f)
      for (int i = 0; i < qd; i++) q[i] *= temp;
  }, INLINE_ROWS);
  attention(il, b, kv, pool);
  if (spec_->attn_gate)
    pool.parallel_for(T, [&](int64_t t) {
      for (int i = 0; i < qd; i++) attn_[t * qd + i] /= 1.0f + std::exp(-qgate_[t * qd + i]);
    }, INLINE_ROWS);
  act_invalidate(act_);
  matmul(pool, L.wo, attn_.data(), T, o_.data(), act_);
  if (!L.bo.empty()) pool.parallel_for(T, [&](int64_t t) { add_bias(&o_[t * E], L.bo); }, INLINE_ROWS);
  ffn_block(il, b, pool);
}

void Model::recurrent_layer(int il, const Batch& b, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int T = (int)b.size(), E = hp_.n_embd, rl = hp_.recurrent_index(il);
  if (!states_ || b.slots.size() != b.size())
    throw std::logic_error("a hybrid model's forward needs a recurrent state slot for every token");
  pool.parallel_for(T, [&](int64_t t) { block_input(&x_[t * E], L.attn_norm, &h_[t * E]); }, INLINE_ROWS);
  if (!b.snapshots.empty() && b.snapshots.size() != b.size())
    throw std::logic_error("a batch's snapshots must name a slot (or -1) for every token");
  const StateSlots slots{b.slots, b.snapshots};
  if (hp_.sc.conv_layer(il))
    short_conv_.forward(pool, hp_.sc, L.sc, h_.data(), T, slots, *states_, rl, o_.data(), act_);
  else
    delta_net_.forward(pool, hp_.dn, L.dn, hp_.eps, h_.data(), T, slots, *states_, rl, o_.data(), act_);
  ffn_block(il, b, pool);
}

// x += the mixer's o_ (post-normed where the architecture has it); the FFN of its norm; x += that.
void Model::ffn_block(int il, const Batch& b, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int T = (int)b.size(), E = hp_.n_embd;
  pool.parallel_for(T, [&](int64_t t) {
    residual_add(&o_[t * E], L.post_attn_norm, &x_[t * E]);
    block_input(&x_[t * E], L.ffn_norm, &h_[t * E]);
  }, INLINE_ROWS);
  ffn(il, b, pool);
  pool.parallel_for(T, [&](int64_t t) { residual_add(&o_[t * E], L.post_ffn_norm, &x_[t * E]); }, INLINE_ROWS);
  if (ple_.enabled()) ple_.apply(il, pool, x_.data(), T, act_);
  if (!L.out_scale.empty())
    for (size_t i = 0; i < (size_t)T * E; i++) x_[i] *= L.out_scale[0];
}

// gemma4's V: RMS-normed per head without a weight; where the layer has no attn_v, K (before its norm) as V.
void Model::v_norm(const float* k, float* v, bool k_as_v, int n_kv, int hd) const {
  if (k_as_v) std::copy(k, k + (size_t)n_kv * hd, v);
  rmsnorm_heads(v, ones_.data(), n_kv, hd, hp_.eps);
}

// A block's input: x RMS-normed by `norm`, or x itself where the architecture has no pre-norms (olmo2).
void Model::block_input(const float* x, const std::vector<float>& norm, float* h) const {
  const int E = hp_.n_embd;
  if (norm.empty()) std::copy(x, x + E, h);
  else rmsnorm(x, norm.data(), h, E, hp_.eps);
}

// x += residual_mult · post_norm(o) (the post-norm where the architecture has one).
void Model::residual_add(float* o, const std::vector<float>& post_norm, float* x) const {
  const int E = hp_.n_embd;
  if (!post_norm.empty()) rmsnorm(o, post_norm.data(), o, E, hp_.eps);
  const float m = hp_.residual_mult;
  for (int i = 0; i < E; i++) x[i] += m * o[i];
}

void Model::ffn(int il, const Batch& b, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int T = (int)b.size();
  act_invalidate(act_);
  if (hp_.moe.moe_layer(il) && spec_->moe_gelu) return moe_beside_dense(il, b, pool);
  if (hp_.moe.moe_layer(il)) {
    moe_.forward(pool, hp_.moe, L.moe, h_.data(), T, o_.data(), act_);
    return;
  }
  dense_ffn(il, T, pool);
}

void Model::dense_ffn(int il, int T, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int64_t F = hp_.layer_ff(il);
  matmul_group(pool, {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}}, h_.data(), T, act_);
  pool.parallel_for(T, [&](int64_t t) {
    if (spec_->gelu) gelu_mul(&gate_[t * F], &up_[t * F], F);
    else silu_mul(&gate_[t * F], &up_[t * F], F);
  }, INLINE_ROWS);
  act_invalidate(act_);
  matmul(pool, L.w_down, gate_.data(), T, o_.data(), act_);
}

// gemma4's MoE layer: o = dense_out_norm(FFN(h)) + out_norm(experts(in_norm(x))), the router reading
// rmsnorm(x) / sqrt(n_embd) × router_scale (x: the residual after attention, h: its ffn_norm).
void Model::moe_beside_dense(int il, const Batch& b, ThreadPool& pool) {
  const MoeWeights& w = layers_[il].moe;
  const int T = (int)b.size(), E = hp_.n_embd;
  dense_ffn(il, T, pool);
  grow(moe_in_, (size_t)T * E);
  grow(router_in_, (size_t)T * E);
  grow(moe_out_, (size_t)T * E);
  const float inv_sqrt = 1.f / std::sqrt((float)E);
  pool.parallel_for(T, [&](int64_t t) {
    rmsnorm(&x_[t * E], w.in_norm.data(), &moe_in_[t * E], E, hp_.eps);
    rmsnorm(&x_[t * E], w.router_scale.data(), &router_in_[t * E], E, hp_.eps);
    for (int i = 0; i < E; i++) router_in_[t * E + i] *= inv_sqrt;
  }, INLINE_ROWS);
  act_invalidate(act_);
  moe_.forward(pool, hp_.moe, w, moe_in_.data(), T, moe_out_.data(), act_, router_in_.data());
  pool.parallel_for(T, [&](int64_t t) {
    float* o = &o_[t * E];
    float* m = &moe_out_[t * E];
    rmsnorm(o, w.dense_out_norm.data(), o, E, hp_.eps);
    rmsnorm(m, w.out_norm.data(), m, E, hp_.eps);
    for (int i = 0; i < E; i++) o[i] += m[i];
  }, INLINE_ROWS);
}

void Model::prepare(const Batch& b, ThreadPool& pool) {
  const int T = (int)b.size(), E = hp_.n_embd, qd = hp_.n_head * hp_.max_head_dim();
  int kvd = 0;  // the widest layer's K (and V) row
  for (int il = 0; il < (int)layers_.size(); il++) kvd = std::max(kvd, hp_.layer_kv_dim(il));
  if (spec_->attn_gate) grow(qg_, (size_t)T * 2 * qd), grow(qgate_, (size_t)T * qd);
  grow(x_, (size_t)T * E);
  grow(h_, (size_t)T * E);
  grow(o_, (size_t)T * E);
  grow(q_, (size_t)T * qd);
  grow(attn_, (size_t)T * qd);
  grow(k_, (size_t)T * kvd);
  grow(v_, (size_t)T * kvd);
  grow(gate_, (size_t)T * hp_.n_ff);
  grow(up_, (size_t)T * hp_.n_ff);
  scratch_.resize((size_t)pool.size() * kAttnQueryRun);
  krows_.resize(pool.size());
  vrows_.resize(pool.size());

  const int cs = cs_stride();
  grow(rope_cs_, (size_t)2 * T * cs);
  pool.parallel_for(T, [&](int64_t t) {
    rope_angles(b.pos[t], rope_global_, &rope_cs_[(size_t)t * cs]);
    if (hp_.n_swa > 0) rope_angles(b.pos[t], rope_local_, &rope_cs_[(size_t)(T + t) * cs]);
  }, INLINE_ROWS);
}

void Model::embed(const Batch& b, ThreadPool& pool, float* out) const {
  const int E = hp_.n_embd;
  const float scale = hp_.embd_mult;
  pool.parallel_for((int64_t)b.size(), [&](int64_t t) {
    float* x = &out[t * E];
    dequantize_row(tok_embd_.type, tok_embd_.row(b.tokens[t]), x, E);
    if (scale != 1.0f)
      for (int i = 0; i < E; i++) x[i] *= scale;
  }, INLINE_ROWS);
}

void Model::forward(const Batch& b, KVCache& kv, ThreadPool& pool, std::vector<float>& logits,
                    std::vector<float>* hidden, RecurrentStatePool* states) {
  const int T = (int)b.size();
  if (T == 0) return;
  states_ = states;
  prepare(b, pool);
  embed(b, pool, x_.data());
  if (ple_.enabled()) ple_.inputs(pool, b.tokens.data(), x_.data(), T, act_);
  for (int il = 0; il < hp_.n_layer; il++) layer(il, b, kv, pool);

  final_norm(b.logit_rows, final_);
  project(pool, final_.data(), (int)b.logit_rows.size(), logits);
  if (hidden) final_norm(b.hidden_rows, *hidden);
}

void Model::draft_forward(const Batch& b, const float* target, KVCache& kv, ThreadPool& pool,
                          std::vector<float>& logits) {
  const int T = (int)b.size(), E = hp_.n_embd, il = hp_.n_layer;
  if (!has_mtp()) throw std::logic_error("draft_forward: the model was loaded without its MTP layer");
  if (T == 0) return logits.clear();
  prepare(b, pool);
  grow(mtp_in_, (size_t)T * 2 * E);
  embed(b, pool, h_.data());
  pool.parallel_for(T, [&](int64_t t) {
    rmsnorm(&h_[t * E], mtp_.enorm.data(), &mtp_in_[t * 2 * E], E, hp_.eps);
    rmsnorm(&target[t * E], mtp_.hnorm.data(), &mtp_in_[t * 2 * E + E], E, hp_.eps);
  }, INLINE_ROWS);
  act_invalidate(act_);
  matmul(pool, mtp_.eh_proj, mtp_in_.data(), T, x_.data(), act_);
  layer(il, b, kv, pool);
  const std::vector<float>& norm = mtp_.head_norm.empty() ? output_norm_ : mtp_.head_norm;
  grow(final_, b.logit_rows.size() * E);
  for (size_t r = 0; r < b.logit_rows.size(); r++)
    rmsnorm(&x_[(size_t)b.logit_rows[r] * E], norm.data(), &final_[r * E], E, hp_.eps);
  project(pool, final_.data(), (int)b.logit_rows.size(), logits);
}

void Model::final_norm(const std::vector<int32_t>& rows, std::vector<float>& out) const {
  const int E = hp_.n_embd;
  grow(out, rows.size() * E);
  for (size_t r = 0; r < rows.size(); r++)
    rmsnorm(&x_[(size_t)rows[r] * E], output_norm_.data(), &out[r * E], E, hp_.eps);
}

void Model::project(ThreadPool& pool, const float* hidden, int R, std::vector<float>& logits) {
  logits.resize((size_t)R * hp_.n_vocab);
  act_invalidate(act_);
  matmul(pool, output_, hidden, R, logits.data(), act_);
  const float mult = hp_.logit_mult, cap = hp_.final_softcap;
  if (mult == 1.f && cap == 0.f) return;
  pool.parallel_for(R, [&](int64_t r) {  // granite's logit scale, gemma2's soft-cap
    float* l = &logits[r * hp_.n_vocab];
    for (int i = 0; i < hp_.n_vocab; i++) l[i] *= mult;
    if (cap > 0.f) softcap(l, hp_.n_vocab, cap);
  }, INLINE_ROWS);
}

double Model::rank(const std::vector<double>& h) const {
  const int E = hp_.n_embd, n = hp_.n_cls_out;
  std::vector<double> z(n);
  for (int r = 0; r < n; r++) {
    double acc = cls_out_b_.empty() ? 0.0 : cls_out_b_[r];
    for (int i = 0; i < E; i++) acc += (double)cls_out_[(size_t)r * E + i] * h[i];
    z[r] = acc;
  }
  if (n == 1) return z[0];
  const double top = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double v : z) sum += std::exp(v - top);
  return std::exp(z[0] - top) / sum;
}

}  // namespace pyserve
