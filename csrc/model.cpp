#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pyserve {

namespace {

const ArchSpec ARCHS[] = {
    // name     neox   gelu   embd_scale qk_norm post_norms sliding_window [no_rope_step moe_norm ffn_norm]
    {"gemma3", true, true, true, true, true, true},
    {"llama", false, false, false, false, false, false},
    {"qwen2", true, false, false, false, false, false},
    {"qwen3", true, false, false, true, false, false},  // qwen2 without biases, q/k normed per head before RoPE
    {"qwen3moe", true, false, false, true, false, false},  // qwen3 with MoE layers (softmax top-k, renormalised)
    {"smollm3", false, false, false, false, false, false, 4},  // llama with every 4th layer position-free
    // GLM-4.5/4.6/4.7 MoE: q/k/v biases, q/k norms where the file has them, partial NeoX RoPE, the FFN's norm
    // named post_attention_norm, leading dense layers, sigmoid routing + choosing bias, a shared expert; the
    // NextN (MTP) layers at the end of block_count are not run
    {"glm4moe", true, false, false, false, false, false, 0, true, "post_attention_norm"},
};

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const ArchSpec& a : ARCHS) names.push_back(a.name);
  return names;
}

const ArchSpec& arch_spec(const std::string& arch) {
  for (const ArchSpec& a : ARCHS)
    if (arch == a.name) return a;
  std::string list;
  for (const std::string& n : supported_architectures()) list += (list.empty() ? "" : ", ") + n;
  throw ModelError("unsupported architecture '" + printable(arch) + "' (supported: " + list + ")");
}

Model::Model(std::shared_ptr<const GGUFFile> file) : file_(std::move(file)) {
  hp_ = read_hparams(*file_);
  spec_ = &arch_spec(hp_.arch);
  load_weights();
  pack_weights();
}

namespace {

constexpr int64_t MAX_DIM = 1 << 20;

// Integers are read as int64 and range-checked before they become ints: a damaged file must not wrap
// around into a plausible value, nor size an allocation (block_count sizes the layer table and the KV
// cache before any tensor is looked at, so it is bounded by the tensor count: >= 9 tensors a layer).
int ranged(const GGUFFile& f, const std::string& key, int64_t lo, int64_t hi, const int64_t* def) {
  int64_t v = def ? f.get_int(key, *def) : f.get_int(key);
  if (v < lo || v > hi)
    f.fail("metadata key '" + key + "' is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
  return (int)v;
}

// The MoE keys (llama.cpp's names) of a file with `<arch>.expert_count` > 0. A Mixtral-style file has no
// expert width of its own: its experts are feed_forward_length wide.
MoeParams read_moe(const GGUFFile& f, const std::string& a, const ArchSpec& spec, int n_ff, int n_layer) {
  MoeParams m;
  const int64_t zero = 0, softmax = (int64_t)Gating::Softmax, norm = spec.moe_norm, ff = n_ff;
  m.n_expert = ranged(f, a + "expert_count", 0, 1 << 12, &zero);
  if (m.n_expert == 0) return m;
  m.n_used = ranged(f, a + "expert_used_count", 1, m.n_expert, nullptr);
  m.n_ff = ranged(f, a + "expert_feed_forward_length", 1, MAX_DIM, n_ff > 0 ? &ff : nullptr);
  const int64_t n_shared = ranged(f, a + "expert_shared_count", 0, 64, &zero), ff_exp = m.n_ff;
  m.n_ff_shared = (int)n_shared * ranged(f, a + "expert_shared_feed_forward_length", 1, MAX_DIM, &ff_exp);
  m.n_dense_lead = ranged(f, a + "leading_dense_block_count", 0, n_layer, &zero);
  m.gating = (Gating)ranged(f, a + "expert_gating_func", 1, 3, &softmax);
  m.norm_weights = ranged(f, a + "expert_weights_norm", 0, 1, &norm) != 0;
  const double scale = f.get_float(a + "expert_weights_scale", 1.0);
  m.weights_scale = scale == 0.0 ? 1.0f : (float)scale;  // llama.cpp: 0 means unscaled
  return m;
}

}  // namespace

HParams read_hparams(const GGUFFile& f) {
  HParams hp_;
  hp_.arch = f.get_str("general.architecture");
  const ArchSpec* spec_ = &arch_spec(hp_.arch);
  const std::string a = hp_.arch + ".";
  auto ranged = [&](const std::string& key, int64_t lo, int64_t hi, const int64_t* def) -> int {
    return pyserve::ranged(f, key, lo, hi, def);
  };
  const int64_t max_dim = MAX_DIM, max_heads = 1 << 12, no_ff = 0;
  hp_.n_embd = ranged(a + "embedding_length", 1, max_dim, nullptr);
  hp_.n_layer = ranged(a + "block_count", 1, std::max<int64_t>(1, (int64_t)f.tensors().size() / 9), nullptr);
  const int64_t no_mtp = 0;  // NextN / MTP layers close the block list; the forward stops before them
  hp_.n_layer -= ranged(a + "nextn_predict_layers", 0, hp_.n_layer - 1, &no_mtp);
  // An all-MoE model may have no dense width; read_moe then needs the experts' own.
  const bool moe = f.get_int(a + "expert_count", 0) > 0;
  hp_.n_ff = ranged(a + "feed_forward_length", moe ? 0 : 1, max_dim, moe ? &no_ff : nullptr);
  hp_.moe = read_moe(f, a, *spec_, hp_.n_ff, hp_.n_layer);
  if (hp_.moe.n_dense_lead > 0 && hp_.n_ff == 0) f.fail("missing metadata key '" + a + "feed_forward_length'");
  hp_.n_head = ranged(a + "attention.head_count", 1, max_heads, nullptr);
  const int64_t n_head = hp_.n_head;
  hp_.n_head_kv = ranged(a + "attention.head_count_kv", 1, max_heads, &n_head);
  if (hp_.n_head % hp_.n_head_kv || hp_.n_head / hp_.n_head_kv > 64)
    f.fail("inconsistent hyper-parameters (embedding_length, block_count, head counts, feed_forward_length)");
  const int64_t hd_def = hp_.n_embd / hp_.n_head;
  hp_.head_dim = ranged(a + "attention.key_length", 1, 4096, &hd_def);
  const int64_t hdv_def = hp_.head_dim;
  hp_.head_dim_v = ranged(a + "attention.value_length", 1, 4096, &hdv_def);
  if (hp_.head_dim_v != hp_.head_dim || hp_.head_dim % 2)
    f.fail("unsupported head dimensions (key_length " + std::to_string(hp_.head_dim) + ", value_length " +
           std::to_string(hp_.head_dim_v) + ")");
  const int64_t ctx_def = 4096;
  hp_.n_ctx_train = ranged(a + "context_length", 1, 1 << 24, &ctx_def);
  hp_.eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
  hp_.rope_base = (float)f.get_float(a + "rope.freq_base", 10000.0);
  const int64_t rope_def = hp_.head_dim;
  hp_.rope_dim = ranged(a + "rope.dimension_count", 1, hp_.head_dim, &rope_def);
  if (hp_.rope_dim <= 0 || hp_.rope_dim > hp_.head_dim || hp_.rope_dim % 2) f.fail("bad rope.dimension_count");
  std::string scaling = f.get_str(a + "rope.scaling.type", "none");
  if (scaling == "linear") hp_.rope_freq_scale = 1.0f / (float)f.get_float(a + "rope.scaling.factor", 1.0);
  else if (scaling != "none") f.fail("unsupported rope.scaling.type '" + scaling + "'");
  hp_.attn_scale = 1.0f / std::sqrt((float)hp_.head_dim);
  hp_.no_rope_step = spec_->no_rope_step;
  if (spec_->sliding_window) {
    const int64_t swa_def = 0, pattern_def = 6;
    hp_.n_swa = ranged(a + "attention.sliding_window", 0, 1 << 24, &swa_def);
    hp_.swa_pattern = ranged(a + "attention.sliding_window_pattern", 0, 1 << 16, &pattern_def);
    hp_.rope_base_local = 10000.f;  // gemma3's local layers use their own base (llama.cpp: rope_freq_base_train_swa)
  }
  const GGUFTensor* emb = f.find("token_embd.weight");
  if (!emb) f.fail("missing tensor 'token_embd.weight'");
  hp_.n_vocab = (int)emb->ne[1];
  return hp_;
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

void Model::pack_weights() {
  std::vector<Weight*> ws = {&output_};
  for (LayerWeights& L : layers_) {
    for (Weight* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) ws.push_back(w);
    for (Weight* w : {&L.moe.sh_gate, &L.moe.sh_up, &L.moe.sh_down}) ws.push_back(w);
    for (std::vector<Weight>* es : {&L.moe.gate, &L.moe.up, &L.moe.down})
      for (Weight& w : *es) ws.push_back(&w);
  }
  for (Weight* w : ws) {
    if (!w->data || !packable(w->type)) continue;
    try {
      w->packed = pack_weight(w->type, w->data, w->row_bytes, w->n_out, w->n_in);
    } catch (const std::bad_alloc&) {
      throw ModelError(file_->path() + ": out of memory packing a " + std::to_string(w->n_out) + " x " +
                       std::to_string(w->n_in) + " matrix");
    }
    file_->drop_pages(w->data, w->row_bytes * (size_t)w->n_out);
  }
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

void Model::load_weights() {
  const int E = hp_.n_embd, hd = hp_.head_dim, qd = hp_.n_head * hd, kvd = hp_.kv_dim();
  tok_embd_ = weight("token_embd.weight", E, hp_.n_vocab);
  output_ = file_->find("output.weight") ? weight("output.weight", E, hp_.n_vocab) : tok_embd_;
  output_norm_ = vec("output_norm.weight", E);
  layers_.resize(hp_.n_layer);
  for (int il = 0; il < hp_.n_layer; il++) {
    LayerWeights& L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    L.attn_norm = vec(p + "attn_norm.weight", E);
    L.ffn_norm = vec(p + spec_->ffn_norm + ".weight", E);
    L.wq = weight(p + "attn_q.weight", E, qd);
    L.wk = weight(p + "attn_k.weight", E, kvd);
    L.wv = weight(p + "attn_v.weight", E, kvd);
    L.wo = weight(p + "attn_output.weight", qd, E);
    L.bq = vec(p + "attn_q.bias", qd, true);
    L.bk = vec(p + "attn_k.bias", kvd, true);
    L.bv = vec(p + "attn_v.bias", kvd, true);
    if (hp_.moe.moe_layer(il)) {
      load_moe(il, L.moe);
    } else {
      L.w_gate = weight(p + "ffn_gate.weight", E, hp_.n_ff);
      L.w_up = weight(p + "ffn_up.weight", E, hp_.n_ff);
      L.w_down = weight(p + "ffn_down.weight", hp_.n_ff, E);
    }
    {  // required where the architecture has them, used wherever the file has them
      L.q_norm = vec(p + "attn_q_norm.weight", hd, !spec_->qk_norm);
      L.k_norm = vec(p + "attn_k_norm.weight", hd, !spec_->qk_norm);
    }
    if (spec_->post_norms) {
      L.post_attn_norm = vec(p + "post_attention_norm.weight", E);
      L.post_ffn_norm = vec(p + "post_ffw_norm.weight", E);
    }
  }
  std::vector<float> factors = vec("rope_freqs.weight", hp_.rope_dim / 2, true);
  const float* ff = factors.empty() ? nullptr : factors.data();
  rope_global_ = make_rope(hd, hp_.rope_dim, spec_->neox_rope, hp_.rope_base, hp_.rope_freq_scale, ff);
  rope_local_ = make_rope(hd, hp_.rope_dim, spec_->neox_rope, hp_.rope_base_local, 1.0f, ff);
}

// llama.cpp's tensor names: ffn_gate_inp (the router), ffn_{gate,up,down}_exps, exp_probs_b (the choosing
// bias), ffn_{gate,up,down}_shexp.
void Model::load_moe(int il, MoeWeights& w) {
  const MoeParams& m = hp_.moe;
  const int E = hp_.n_embd;
  const std::string p = "blk." + std::to_string(il) + ".";
  w.router = weight(p + "ffn_gate_inp.weight", E, m.n_expert);
  w.select_bias = vec(p + "exp_probs_b.bias", m.n_expert, true);
  w.gate = experts(p + "ffn_gate_exps.weight", E, m.n_ff);
  w.up = experts(p + "ffn_up_exps.weight", E, m.n_ff);
  w.down = experts(p + "ffn_down_exps.weight", m.n_ff, E);
  if (m.n_ff_shared > 0) {
    w.sh_gate = weight(p + "ffn_gate_shexp.weight", E, m.n_ff_shared);
    w.sh_up = weight(p + "ffn_up_shexp.weight", E, m.n_ff_shared);
    w.sh_down = weight(p + "ffn_down_shexp.weight", m.n_ff_shared, E);
  }
}

namespace {

void add_bias(float* y, const std::vector<float>& b) {
  for (size_t i = 0; i < b.size(); i++) y[i] += b[i];
}

void grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

// Causal attention of every batch token over its own sequence's K/V, after writing the batch's K/V.
// A work item is (token, KV head): each cached K/V row is loaded once for all the query heads that share
// it (GQA). Items go round-robin to threads, since later tokens of a prompt attend over more positions.
void Model::attention(int il, const Batch& b, KVCache& kv, ThreadPool& pool) {
  const int T = (int)b.size(), hd = hp_.head_dim, kvd = hp_.kv_dim(), bs = kv.block_size();
  const int group = hp_.n_head / hp_.n_head_kv, qd = hp_.n_head * hd;
  const int window = hp_.is_local(il) ? hp_.n_swa : 0;
  for (int t = 0; t < T; t++) {
    const std::vector<int32_t>& tab = *b.tables[t];
    int p = b.pos[t];
    to_f16(k_.data() + (size_t)t * kvd, kv.k(il, tab[p / bs], p % bs), kvd);
    to_f16(v_.data() + (size_t)t * kvd, kv.v(il, tab[p / bs], p % bs), kvd);
  }
  const int64_t items = (int64_t)T * hp_.n_head_kv;
  auto work = [&](int ith, int nth) {
    std::vector<float>& sc = scores_[ith];
    for (int64_t w = ith; w < items; w += nth) {
      const int t = (int)(w / hp_.n_head_kv), g = (int)(w % hp_.n_head_kv);
      const std::vector<int32_t>& tab = *b.tables[t];
      const int p = b.pos[t], lo = window > 0 ? std::max(0, p - window + 1) : 0, len = p - lo + 1;
      grow(sc, (size_t)len * group);
      const float* q = q_.data() + (size_t)t * qd + (size_t)g * group * hd;
      std::vector<const uint16_t*>& krows = krows_[ith];
      std::vector<const uint16_t*>& vrows = vrows_[ith];
      krows.resize(len);
      vrows.resize(len);
      for (int j = 0; j < len; j++) {
        const int blk = tab[(lo + j) / bs], slot = (lo + j) % bs;
        krows[j] = kv.k(il, blk, slot) + g * hd;
        vrows[j] = kv.v(il, blk, slot) + g * hd;
      }
      attention_scores_f16(q, group, hd, krows.data(), len, sc.data(), vrows.data());
      for (size_t i = 0; i < (size_t)len * group; i++) sc[i] *= hp_.attn_scale;
      float inv[64];  // 1 / softmax denominator per head of the group
      for (int h = 0; h < group; h++) {
        float* s = &sc[(size_t)h * len];
        inv[h] = 1.0f / exp_shift_sum(s, len, *std::max_element(s, s + len));
      }
      for (int h = 0; h < group; h++)
        for (int j = 0; j < len; j++) sc[(size_t)h * len + j] *= inv[h];
      weighted_sum_f16(sc.data(), group, len, vrows.data(), hd, attn_.data() + (size_t)t * qd + (size_t)g * group * hd);
    }
  };
  if (items <= 1) work(0, 1);
  else pool.run(work);
}

void Model::layer(int il, const Batch& b, KVCache& kv, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int T = (int)b.size(), E = hp_.n_embd, hd = hp_.head_dim, kvd = hp_.kv_dim(), qd = hp_.n_head * hd;
  const RopeParams& rp = hp_.is_local(il) ? rope_local_ : rope_global_;
  const float eps = hp_.eps;

  pool.parallel_for(T, [&](int64_t t) { rmsnorm(&x_[t * E], L.attn_norm.data(), &h_[t * E], E, eps); }, INLINE_ROWS);
  act_invalidate(act_);
  matmul_group(pool, {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}}, h_.data(), T, act_);
  pool.parallel_for(T, [&](int64_t t) {
    float* q = &q_[t * qd];
    float* k = &k_[t * kvd];
    add_bias(q, L.bq);
    add_bias(k, L.bk);
    add_bias(&v_[t * kvd], L.bv);
    if (!L.q_norm.empty()) {
      rmsnorm_heads(q, L.q_norm.data(), hp_.n_head, hd, eps);
      rmsnorm_heads(k, L.k_norm.data(), hp_.n_head_kv, hd, eps);
    }
    if (!hp_.roped(il)) return;
    const float* cs = &rope_cs_[((size_t)hp_.is_local(il) * T + t) * hp_.rope_dim];
    rope(q, hp_.n_head, cs, rp);
    rope(k, hp_.n_head_kv, cs, rp);
  }, INLINE_ROWS);
  attention(il, b, kv, pool);
  act_invalidate(act_);
  matmul(pool, L.wo, attn_.data(), T, o_.data(), act_);

  pool.parallel_for(T, [&](int64_t t) {
    float* o = &o_[t * E];
    if (spec_->post_norms) rmsnorm(o, L.post_attn_norm.data(), o, E, eps);
    for (int i = 0; i < E; i++) x_[t * E + i] += o[i];
    rmsnorm(&x_[t * E], L.ffn_norm.data(), &h_[t * E], E, eps);
  }, INLINE_ROWS);
  ffn(il, b, pool);
  pool.parallel_for(T, [&](int64_t t) {
    float* o = &o_[t * E];
    if (spec_->post_norms) rmsnorm(o, L.post_ffn_norm.data(), o, E, eps);
    for (int i = 0; i < E; i++) x_[t * E + i] += o[i];
  }, INLINE_ROWS);
}

void Model::ffn(int il, const Batch& b, ThreadPool& pool) {
  const LayerWeights& L = layers_[il];
  const int T = (int)b.size();
  act_invalidate(act_);
  if (hp_.moe.moe_layer(il)) {
    moe_.forward(pool, hp_.moe, L.moe, h_.data(), T, o_.data(), act_);
    return;
  }
  const int64_t F = hp_.n_ff;
  matmul_group(pool, {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}}, h_.data(), T, act_);
  pool.parallel_for(T, [&](int64_t t) {
    if (spec_->gelu) gelu_mul(&gate_[t * F], &up_[t * F], F);
    else silu_mul(&gate_[t * F], &up_[t * F], F);
  }, INLINE_ROWS);
  act_invalidate(act_);
  matmul(pool, L.w_down, gate_.data(), T, o_.data(), act_);
}

void Model::forward(const Batch& b, KVCache& kv, ThreadPool& pool, std::vector<float>& logits,
                    std::vector<float>* hidden) {
  const int T = (int)b.size(), E = hp_.n_embd, qd = hp_.n_head * hp_.head_dim;
  if (T == 0) return;
  grow(x_, (size_t)T * E);
  grow(h_, (size_t)T * E);
  grow(o_, (size_t)T * E);
  grow(q_, (size_t)T * qd);
  grow(attn_, (size_t)T * qd);
  grow(k_, (size_t)T * hp_.kv_dim());
  grow(v_, (size_t)T * hp_.kv_dim());
  grow(gate_, (size_t)T * hp_.n_ff);
  grow(up_, (size_t)T * hp_.n_ff);
  scores_.resize(pool.size());
  krows_.resize(pool.size());
  vrows_.resize(pool.size());

  grow(rope_cs_, (size_t)2 * T * hp_.rope_dim);
  pool.parallel_for(T, [&](int64_t t) {
    rope_angles(b.pos[t], rope_global_, &rope_cs_[(size_t)t * hp_.rope_dim]);
    if (hp_.n_swa > 0) rope_angles(b.pos[t], rope_local_, &rope_cs_[(size_t)(T + t) * hp_.rope_dim]);
  }, INLINE_ROWS);
  const float scale = spec_->embd_scale ? std::sqrt((float)E) : 1.0f;
  pool.parallel_for(T, [&](int64_t t) {
    float* x = &x_[t * E];
    dequantize_row(tok_embd_.type, tok_embd_.row(b.tokens[t]), x, E);
    if (scale != 1.0f)
      for (int i = 0; i < E; i++) x[i] *= scale;
  }, INLINE_ROWS);
  for (int il = 0; il < hp_.n_layer; il++) layer(il, b, kv, pool);

  final_norm(b.logit_rows, final_);
  project(pool, final_.data(), (int)b.logit_rows.size(), logits);
  if (hidden) final_norm(b.hidden_rows, *hidden);
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
}

}  // namespace pyserve
