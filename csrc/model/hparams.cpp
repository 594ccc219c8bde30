#include "model/hparams.h"

#include <algorithm>
#include <cmath>

namespace pyserve {

namespace {

// ---- the architectures, each as what it changes of its parent (llama.cpp: src/models/<arch>.cpp) ----

ArchSpec based(ArchSpec parent, const char* name) {
  parent.name = name;
  return parent;
}

ArchSpec qwen2() {  // q/k/v biases (loaded where the file has them), NeoX RoPE
  ArchSpec s = based(ArchSpec{}, "qwen2");
  s.neox_rope = true;
  return s;
}

ArchSpec qwen3() {  // qwen2 without biases, q/k RMS-normed per head before RoPE
  ArchSpec s = based(qwen2(), "qwen3");
  s.qk_norm = true;
  return s;
}

ArchSpec smollm3() {  // llama with every 4th layer position-free
  ArchSpec s = based(ArchSpec{}, "smollm3");
  s.no_rope_step = 4;
  return s;
}

ArchSpec gemma2() {  // embeddings × sqrt(n_embd), GELU, post-norms, local/global alternation, soft-capping
  ArchSpec s = based(qwen2(), "gemma2");
  s.gelu = s.embd_scale = s.post_norms = s.sliding_window = true;
  s.swa_pattern = 2;
  s.swa_window = 4096;
  s.attn_softcap = 50.f;
  s.final_softcap = 30.f;
  s.swa_rope_scaled = true;
  return s;
}

ArchSpec gemma3() {  // gemma2 with q/k norms, a 5:1 pattern, local RoPE base 10000 and no soft-capping
  ArchSpec s = based(gemma2(), "gemma3");
  s.qk_norm = true;
  s.swa_pattern = 6;
  s.swa_window = 0;
  s.swa_rope_base = 10000.f;
  s.attn_softcap = s.final_softcap = 0.f;
  s.swa_rope_scaled = false;
  return s;
}

// gemma3 with per-layer shapes (hparams.h: layer_shapes), the local/global pattern from a per-layer array,
// attention scale 1, the final soft-cap read in its sliding-window graph too (llama.cpp: src/models/gemma4.cpp)
ArchSpec gemma4() {
  ArchSpec s = based(gemma3(), "gemma4");
  s.layer_shapes = s.moe_gelu = true;
  s.attn_scale = 1.f;
  s.swa_pattern = 0;
  return s;
}

ArchSpec olmo2() {  // no pre-norms: post-norms only; q and k normed over the whole projection
  ArchSpec s = based(qwen2(), "olmo2");
  s.pre_norms = false;
  s.post_norms = s.qk_norm = s.qk_norm_full = true;
  return s;
}

// gpt-oss: q/k/v and output biases, attention sinks (tensors), even layers local (the window from the file),
// YaRN on every layer, the FFN's norm named post_attention_norm; MoE with router and expert biases, chosen by
// logit and weighted by a softmax over the chosen, the experts' clamped SwiGLU
ArchSpec gpt_oss() {
  ArchSpec s = based(qwen2(), "gpt-oss");
  s.sliding_window = s.swa_rope_scaled = s.moe_oai_glu = true;
  s.swa_pattern = 2;
  s.ffn_norm = "post_attention_norm";
  s.moe_norm = false;
  s.moe_only = true;
  s.moe_gating = Gating::SoftmaxWeight;
  return s;
}

ArchSpec phi3() {  // NeoX RoPE (partial in Phi-4-mini), fused qkv and gate/up, LongRoPE factors from tensors;
  // llama.cpp runs its files' sliding window as full attention, and so does this
  return based(qwen2(), "phi3");
}

ArchSpec mistral3() {  // llama with YaRN and the attention temperature (both from the file)
  return based(ArchSpec{}, "mistral3");
}

ArchSpec glm4moe() {  // qwen2's attention (partial RoPE from the file), the FFN's norm named post_attention_norm
  ArchSpec s = based(qwen2(), "glm4moe");
  s.ffn_norm = "post_attention_norm";
  s.moe_only = true;
  return s;
}

// qwen35: qwen3's attention (per-head q/k norms, NeoX RoPE, partial from the file) with the output gated,
// the FFN's norm named post_attention_norm, three of four layers Gated DeltaNet
ArchSpec qwen35() {
  ArchSpec s = based(qwen3(), "qwen35");
  s.ffn_norm = "post_attention_norm";
  s.delta_net = s.attn_gate = true;
  return s;
}

ArchSpec qwen35moe() {  // qwen35 with a MoE FFN and one shared expert (its output sigmoid-gated)
  ArchSpec s = based(qwen35(), "qwen35moe");
  s.moe_shared = 1;
  s.moe_only = true;
  return s;
}

// lfm2: qwen3's attention (per-head q/k norms, NeoX RoPE) in the layers with KV heads, gated short convs in
// the others, the final norm named token_embd_norm; where the file gives a window, every attention layer
// slides (the global RoPE on all) (llama.cpp: src/models/lfm2.cpp)
ArchSpec lfm2() {
  ArchSpec s = based(qwen3(), "lfm2");
  s.short_conv = s.sliding_window = s.swa_rope_scaled = true;
  s.output_norm = "token_embd_norm";
  return s;
}

ArchSpec lfm2moe() {  // lfm2 with MoE FFNs after the leading dense layers: sigmoid routing, a choosing bias
  ArchSpec s = based(lfm2(), "lfm2moe");
  s.moe_gating = Gating::Sigmoid;
  s.moe_only = true;
  return s;
}

ArchSpec qwen3moe() {  // qwen3 with MoE FFNs: softmax top-k routing, no shared expert
  ArchSpec s = based(qwen3(), "qwen3moe");
  s.moe_only = true;
  return s;
}

const std::vector<ArchSpec>& archs() {
  static const std::vector<ArchSpec> all = {
      gemma2(), gemma3(), gemma4(), glm4moe(), gpt_oss(), based(ArchSpec{}, "granite"), lfm2(), lfm2moe(), ArchSpec{},
      mistral3(), olmo2(), phi3(), qwen2(), qwen3(), qwen3moe(), qwen35(), qwen35moe(), smollm3()};
  return all;
}

// ---- reading the metadata ----

constexpr int64_t MAX_DIM = 1 << 20, MAX_HEADS = 1 << 12;

// A per-layer array (llama.cpp's get_key_or_arr: feed_forward_length, head counts) reads as its largest entry.
int64_t int_or_max(const GGUFFile& f, const std::string& key, const int64_t* def) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end() || it->second.type != GGUFType::ARRAY) return def ? f.get_int(key, *def) : f.get_int(key);
  if (it->second.ai.empty()) f.fail("metadata key '" + key + "' is an empty or non-integer array");
  return *std::max_element(it->second.ai.begin(), it->second.ai.end());
}

// Integers are read as int64 and range-checked before they become ints: a damaged file must not wrap
// around into a plausible value, nor size an allocation (block_count sizes the layer table and the KV
// cache before any tensor is looked at, so it is bounded by the tensor count: >= 5 tensors a layer, phi3 6).
int ranged(const GGUFFile& f, const std::string& key, int64_t lo, int64_t hi, const int64_t* def) {
  int64_t v = int_or_max(f, key, def);
  if (v < lo || v > hi)
    f.fail("metadata key '" + key + "' is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
  return (int)v;
}

// The MoE keys (llama.cpp's names) of a file with `<arch>.expert_count` > 0. A Mixtral-style file has no
// expert width of its own: its experts are feed_forward_length wide.
MoeParams read_moe(const GGUFFile& f, const std::string& a, const ArchSpec& spec, int n_ff, int n_layer) {
  MoeParams m;
  const int64_t zero = 0, gating = (int64_t)spec.moe_gating, norm = spec.moe_norm, ff = n_ff;
  m.n_expert = ranged(f, a + "expert_count", spec.moe_only ? 1 : 0, 1 << 12, spec.moe_only ? nullptr : &zero);
  if (m.n_expert == 0) return m;
  m.n_used = ranged(f, a + "expert_used_count", 1, m.n_expert, nullptr);
  m.n_ff = ranged(f, a + "expert_feed_forward_length", 1, MAX_DIM, n_ff > 0 ? &ff : nullptr);
  const int64_t shared = spec.moe_shared;
  const int64_t n_shared = ranged(f, a + "expert_shared_count", 0, 64, &shared), ff_exp = m.n_ff;
  m.n_ff_shared = (int)n_shared * ranged(f, a + "expert_shared_feed_forward_length", 1, MAX_DIM, &ff_exp);
  m.n_dense_lead = ranged(f, a + "leading_dense_block_count", 0, n_layer, &zero);
  m.gating = (Gating)ranged(f, a + "expert_gating_func", 1, 3, &gating);
  m.oai_glu = spec.moe_oai_glu;
  m.gelu = spec.moe_gelu;
  m.norm_weights = ranged(f, a + "expert_weights_norm", 0, 1, &norm) != 0;
  const double scale = f.get_float(a + "expert_weights_scale", 1.0);
  m.weights_scale = scale == 0.0 ? 1.0f : (float)scale;  // llama.cpp: 0 means unscaled
  return m;
}

// Widths, layer count (less the NextN / MTP layers that close the block list: the forward stops before
// them) and the FFN (an all-MoE model may have no dense width).
void read_shape(const GGUFFile& f, const std::string& a, const ArchSpec& spec, HParams& hp) {
  const int64_t no_ff = 0, no_mtp = 0;
  hp.n_embd = ranged(f, a + "embedding_length", 1, MAX_DIM, nullptr);
  hp.n_layer = ranged(f, a + "block_count", 1, std::max<int64_t>(1, (int64_t)f.tensors().size() / 5), nullptr);
  hp.n_mtp = ranged(f, a + "nextn_predict_layers", 0, hp.n_layer - 1, &no_mtp);
  hp.n_layer -= hp.n_mtp;
  const bool moe = spec.moe_only || f.get_int(a + "expert_count", 0) > 0;
  hp.n_ff = ranged(f, a + "feed_forward_length", moe ? 0 : 1, MAX_DIM, moe ? &no_ff : nullptr);
  hp.moe = read_moe(f, a, spec, hp.n_ff, hp.n_layer);
  if (hp.moe.n_dense_lead > 0 && hp.n_ff == 0) f.fail("missing metadata key '" + a + "feed_forward_length'");
  const int64_t ctx_def = 4096;
  hp.n_ctx_train = ranged(f, a + "context_length", 1, 1 << 24, &ctx_def);
  const GGUFTensor* emb = f.find("token_embd.weight");
  if (!emb) f.fail("missing tensor 'token_embd.weight'");
  hp.n_vocab = (int)emb->ne[1];
}

void read_attention(const GGUFFile& f, const std::string& a, const ArchSpec& spec, HParams& hp) {
  hp.n_head = ranged(f, a + "attention.head_count", 1, MAX_HEADS, nullptr);
  const int64_t n_head = hp.n_head;
  hp.n_head_kv = ranged(f, a + "attention.head_count_kv", 1, MAX_HEADS, &n_head);
  if (hp.n_head % hp.n_head_kv || hp.n_head / hp.n_head_kv > 64)
    f.fail("inconsistent hyper-parameters (embedding_length, block_count, head counts, feed_forward_length)");
  const int64_t hd_def = hp.n_embd / hp.n_head;
  hp.head_dim = ranged(f, a + "attention.key_length", 1, 4096, &hd_def);
  const int64_t hdv_def = hp.head_dim;
  hp.head_dim_v = ranged(f, a + "attention.value_length", 1, 4096, &hdv_def);
  if (hp.head_dim_v != hp.head_dim || hp.head_dim % 2)
    f.fail("unsupported head dimensions (key_length " + std::to_string(hp.head_dim) + ", value_length " +
           std::to_string(hp.head_dim_v) + ")");
  hp.eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
  const double scale = f.get_float(a + "attention.scale", 0.0);
  hp.attn_scale = scale != 0.0 ? (float)scale : 1.0f / std::sqrt((float)hp.head_dim);
  if (spec.attn_scale > 0.f) hp.attn_scale = spec.attn_scale;
  hp.attn_softcap = (float)f.get_float(a + "attn_logit_softcapping", spec.attn_softcap);
  hp.attn_temp_scale = (float)f.get_float(a + "attention.temperature_scale", 0.0);
  if (spec.sliding_window) {
    const int64_t swa_def = spec.swa_window, pattern_def = spec.swa_pattern;
    hp.n_swa = ranged(f, a + "attention.sliding_window", 0, 1 << 24, &swa_def);
    if (!spec.layer_shapes) hp.swa_pattern = ranged(f, a + "attention.sliding_window_pattern", 0, 1 << 16, &pattern_def);
  }
}

// rope.scaling.* as llama.cpp's context turns them into rope_ext's parameters (llama-context.cpp): linear
// interpolation (or the older rope.scale_linear), YaRN (the ramp from the original context and the betas; its
// magnitude: 1 + 0.1·ln(factor), over 1 + 0.1·L·ln(factor) with yarn_log_multiplier L), LongRoPE (factors
// from tensors, the magnitude from rope.scaling.attn_factor).
RopeScaling read_rope_scaling(const GGUFFile& f, const std::string& a, int n_ctx_train) {
  RopeScaling s;
  const double legacy = f.get_float(a + "rope.scale_linear", 0.0);
  const std::string type = f.get_str(a + "rope.scaling.type", legacy > 0 ? "linear" : "none");
  if (type != "none" && type != "linear" && type != "yarn" && type != "longrope")
    f.fail("unsupported rope.scaling.type '" + printable(type) + "' (supported: none, linear, yarn, longrope)");
  const double factor = f.get_float(a + "rope.scaling.factor", legacy > 0 ? legacy : 1.0);
  if (!(factor > 0)) f.fail("metadata key '" + a + "rope.scaling.factor' is not positive");
  s.freq_scale = type == "linear" || type == "yarn" ? 1.0 / factor : 1.0;
  s.attn_factor = f.get_float(a + "rope.scaling.attn_factor", 1.0);
  const int64_t ctx = n_ctx_train;
  s.n_ctx_orig = ranged(f, a + "rope.scaling.original_context_length", 1, 1 << 24, &ctx);
  if (type != "yarn") return s;
  s.ext_factor = 1.0;
  s.beta_fast = f.get_float(a + "rope.scaling.yarn_beta_fast", 32.0);
  s.beta_slow = f.get_float(a + "rope.scaling.yarn_beta_slow", 1.0);
  auto mscale = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  const double log_mul = f.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0);
  const double a_yarn = log_mul != 0.0 ? mscale(1.0) / mscale(log_mul) : mscale(1.0);
  s.attn_factor *= a_yarn / (1.0 + 0.1 * std::log(factor));  // make_rope multiplies that back in
  return s;
}

void read_rope(const GGUFFile& f, const std::string& a, const ArchSpec& spec, HParams& hp) {
  hp.rope_base = (float)f.get_float(a + "rope.freq_base", 10000.0);
  const double local = spec.swa_rope_base > 0.f ? spec.swa_rope_base : hp.rope_base;
  hp.rope_base_local = (float)f.get_float(a + "rope.freq_base_swa", local);
  const int64_t rope_def = hp.head_dim;
  hp.rope_dim = ranged(f, a + "rope.dimension_count", 1, hp.head_dim, &rope_def);
  if (hp.rope_dim <= 0 || hp.rope_dim > hp.head_dim || hp.rope_dim % 2) f.fail("bad rope.dimension_count");
  hp.rope_scaling = read_rope_scaling(f, a, hp.n_ctx_train);
  hp.attn_temp_floor = hp.rope_scaling.n_ctx_orig;  // llama.cpp: the floor scale is the original context
  hp.no_rope_step = spec.no_rope_step;
}

// Multipliers: gemma's sqrt(n_embd) on the embeddings; granite's embedding / residual / logit scales (read
// for every architecture: a file that has them means them); the final soft-cap.
void read_multipliers(const GGUFFile& f, const std::string& a, const ArchSpec& spec, HParams& hp) {
  const double embd = spec.embd_scale ? std::sqrt((double)hp.n_embd) : 1.0;
  hp.embd_mult = (float)f.get_float(a + "embedding_scale", embd);
  hp.residual_mult = (float)f.get_float(a + "residual_scale", 1.0);
  const double logit_scale = f.get_float(a + "logit_scale", 1.0);
  if (logit_scale == 0.0) f.fail("metadata key '" + a + "logit_scale' is 0");
  hp.logit_mult = (float)(1.0 / logit_scale);
  // gemma3's sliding-window graph ignores the key (llama.cpp soft-caps only its non-iSWA graph)
  if (spec.final_softcap > 0.f || hp.n_swa == 0 || spec.layer_shapes)
    hp.final_softcap = (float)f.get_float(a + "final_logit_softcapping", spec.final_softcap);
}

// The [n_layer] integer array `key` (each in [lo, hi]), or empty where the key is a scalar or absent.
std::vector<int> layer_array(const GGUFFile& f, const std::string& key, int n_layer, int64_t lo, int64_t hi) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end() || it->second.type != GGUFType::ARRAY) return {};
  const std::vector<int64_t>& v = it->second.ai;
  if ((int)v.size() != n_layer)
    f.fail("metadata key '" + key + "' has " + std::to_string(it->second.size()) + " entries, expected " +
           std::to_string(n_layer) + " (block_count)");
  std::vector<int> out;
  for (int64_t x : v) {
    if (x < lo || x > hi) f.fail("metadata key '" + key + "' has an entry " + std::to_string(x) + " outside [" +
                                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back((int)x);
  }
  return out;
}

// Architectures without per-layer shapes run per-layer arrays only where every layer has the same value.
void check_uniform(const GGUFFile& f, const std::string& a, int n_layer,
                   std::initializer_list<const char*> keys = {"feed_forward_length", "attention.head_count",
                                                              "attention.head_count_kv"}) {
  for (const char* k : keys) {
    const std::vector<int> v = layer_array(f, a + k, n_layer, 0, MAX_DIM);
    if (!v.empty() && std::count(v.begin(), v.end(), v[0]) != (int)v.size())
      f.fail("metadata key '" + a + k + "' differs between layers (unsupported for this architecture)");
  }
}

// gemma4 (llama.cpp: llama_model_gemma4::load_arch_hparams): the local/global pattern as a per-layer array,
// the local layers' head width and rotated dims, shared-KV layers, per-layer embeddings, per-layer KV heads
// and FFN widths.
void read_layer_shapes(const GGUFFile& f, const std::string& a, HParams& hp) {
  check_uniform(f, a, hp.n_layer, {"attention.head_count"});
  const std::string pat = a + "attention.sliding_window_pattern";
  if (!f.has(pat)) f.fail("missing metadata key '" + pat + "'");
  for (int v : layer_array(f, pat, hp.n_layer, 0, 1)) hp.swa_layers.push_back((uint8_t)v);
  if (hp.swa_layers.empty()) f.fail("metadata key '" + pat + "' is not a per-layer array");
  if (!f.has(a + "attention.sliding_window")) f.fail("missing metadata key '" + a + "attention.sliding_window'");
  hp.head_dim_swa = ranged(f, a + "attention.key_length_swa", 2, 4096, nullptr);
  if (ranged(f, a + "attention.value_length_swa", 1, 4096, nullptr) != hp.head_dim_swa || hp.head_dim_swa % 2)
    f.fail("unsupported head dimensions (key_length_swa, value_length_swa)");
  const int64_t rope_def = hp.head_dim_swa, zero = 0;
  hp.rope_dim_swa = ranged(f, a + "rope.dimension_count_swa", 2, hp.head_dim_swa, &rope_def);
  if (hp.rope_dim_swa % 2) f.fail("bad rope.dimension_count_swa");
  hp.n_embd_per_layer = ranged(f, a + "embedding_length_per_layer_input", 0, MAX_DIM, nullptr);
  const int shared = ranged(f, a + "attention.shared_kv_layers", 0, hp.n_layer - 1, &zero);
  hp.n_layer_kv = shared > 0 ? hp.n_layer - shared : 0;
  hp.n_head_kv_layer = layer_array(f, a + "attention.head_count_kv", hp.n_layer, 1, MAX_HEADS);
  hp.n_ff_layer = layer_array(f, a + "feed_forward_length", hp.n_layer, 1, MAX_DIM);
  for (int il = 0; il < hp.n_layer; il++) {
    if (hp.n_head % hp.layer_n_head_kv(il)) f.fail("attention.head_count_kv does not divide attention.head_count");
    if (hp.kv_layer(il) < 0 || hp.is_local(hp.kv_layer(il)) != hp.is_local(il))
      f.fail("attention.shared_kv_layers " + std::to_string(shared) +
             ": no earlier layer of the same kind to share K/V with (the last two owning layers must be local, global)");
  }
}

// An integer (or bool) array key's values; empty when the file has no such key.
std::vector<int64_t> int_array(const GGUFFile& f, const std::string& key) {
  const auto it = f.metadata().find(key);
  if (it == f.metadata().end()) return {};
  if (it->second.type != GGUFType::ARRAY || it->second.ai.size() != it->second.size())
    f.fail("metadata key '" + key + "' is not an array of integers");
  return it->second.ai;
}

// ggml's interleaved M-RoPE gives rotated pair i the position of section (i mod Σ) % 3 while that stays within
// 3·sections[that]; the rest take the 4th position, 0 for text. Every pair on a text position: plain RoPE.
bool text_mrope_is_rope(const std::vector<int64_t>& sec, int rope_dim) {
  int64_t total = 0;
  for (int64_t v : sec) total += v;
  for (int i = 0; total > 0 && i < rope_dim / 2; i++) {
    const int64_t s = i % total, which = s % 3;
    if (which >= (int64_t)sec.size() || s >= 3 * sec[which]) return false;
  }
  return true;
}

// The DeltaNet keys (llama.cpp's names) and which layers are recurrent: attention.recurrent_layers where the
// file has it, else all but every full_attention_interval-th (default 4).
void read_delta_net(const GGUFFile& f, const std::string& a, HParams& hp) {
  DeltaNetParams& d = hp.dn;
  d.d_conv = ranged(f, a + "ssm.conv_kernel", 1, 64, nullptr);
  d.n_k_heads = ranged(f, a + "ssm.group_count", 1, MAX_HEADS, nullptr);
  d.n_v_heads = ranged(f, a + "ssm.time_step_rank", 1, MAX_HEADS, nullptr);
  d.head_k = ranged(f, a + "ssm.state_size", 1, 4096, nullptr);
  const int inner = ranged(f, a + "ssm.inner_size", 1, MAX_DIM, nullptr);
  d.head_v = inner / d.n_v_heads;
  if (d.n_v_heads % d.n_k_heads || inner % d.n_v_heads || d.head_v != d.head_k)
    f.fail("inconsistent ssm.* keys (inner_size, state_size, time_step_rank, group_count)");
  const int64_t four = 4;
  const int interval = ranged(f, a + "full_attention_interval", 1, 1 << 16, &four);
  const std::vector<int64_t> rec = int_array(f, a + "attention.recurrent_layers");
  d.index.assign(hp.n_layer, -1);
  for (int il = 0, n = 0; il < hp.n_layer; il++) {
    const bool r = rec.empty() ? (il + 1) % interval != 0 : il < (int)rec.size() && rec[il] != 0;
    if (r) d.index[il] = n++;
  }
  const std::vector<int64_t> sections = int_array(f, a + "rope.dimension_sections");
  if (!text_mrope_is_rope(sections, hp.rope_dim))
    f.fail("unsupported rope.dimension_sections: some rotated dimensions would not take a text position");
}

// lfm2 (llama.cpp: llama_model_lfm2::load_arch_hparams): the conv width, and which layers are convs: those whose
// attention.head_count_kv entry is 0 (the others must agree on their count); with a window, the attention layers
// are the sliding ones. lfm2moe's files name the routing; its graph always renormalises, never scales.
void read_short_conv(const GGUFFile& f, const std::string& a, HParams& hp) {
  ShortConvParams& c = hp.sc;
  if (f.get_int(a + "attention.causal", 1) == 0)
    f.fail("metadata key '" + a + "attention.causal' is false: a bidirectional encoder (LFM2-ColBERT style), "
           "which pyserve does not run");
  c.l_cache = ranged(f, a + "shortconv.l_cache", 2, 64, nullptr);
  c.n_embd = hp.n_embd;
  const std::string kv_key = a + "attention.head_count_kv";
  const std::vector<int> kv = layer_array(f, kv_key, hp.n_layer, 0, MAX_HEADS);
  c.index.assign(hp.n_layer, -1);
  for (int il = 0, n = 0; il < (int)kv.size(); il++) {
    if (kv[il] == 0) c.index[il] = n++;
    else if (kv[il] != hp.n_head_kv)
      f.fail("metadata key '" + kv_key + "' differs between attention layers (unsupported for this architecture)");
  }
  if (hp.n_swa > 0)
    for (int il = 0; il < hp.n_layer; il++) hp.swa_layers.push_back(!c.conv_layer(il));
  hp.rope_base_local = hp.rope_base;
  if (hp.moe.n_expert > 0 && !f.has(a + "expert_gating_func"))
    f.fail("missing metadata key '" + a + "expert_gating_func'");
  hp.moe.norm_weights = true;
  hp.moe.weights_scale = 1.f;
}

}  // namespace

std::vector<int> HParams::kv_widths(bool with_mtp) const {
  std::vector<int> w(n_layer);
  for (int il = 0; il < n_layer; il++)  // a shared-KV layer reads another's; a recurrent layer keeps no K/V
    w[il] = kv_layer(il) == il && !recurrent(il) ? layer_kv_dim(il) : 0;
  if (with_mtp) w.push_back(kv_dim());  // an attention layer of the model's global shape
  return w;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const ArchSpec& a : archs()) names.push_back(a.name);
  return names;
}

const ArchSpec& arch_spec(const std::string& arch) {
  for (const ArchSpec& a : archs())
    if (arch == a.name) return a;
  std::string list;
  for (const std::string& n : supported_architectures()) list += (list.empty() ? "" : ", ") + n;
  // BGE / Jina-style rerankers and embedders are BERT encoders (bidirectional, a classifier over the CLS row)
  const bool encoder = arch == "bert" || arch == "roberta" || arch == "xlm-roberta" || arch == "nomic-bert" ||
                       arch == "jina-bert-v2" || arch == "modern-bert" || arch == "neo-bert";
  throw ModelError("unsupported architecture '" + printable(arch) + "'" +
                   (encoder ? ": a BERT-style encoder (such as a BGE reranker); pyserve runs decoder-only models" : "") +
                   " (supported: " + list + ")");
}

HParams read_hparams(const GGUFFile& f) {
  HParams hp;
  hp.arch = f.get_str("general.architecture");
  const ArchSpec& spec = arch_spec(hp.arch);
  const std::string a = hp.arch + ".";
  read_shape(f, a, spec, hp);
  read_attention(f, a, spec, hp);
  read_rope(f, a, spec, hp);
  read_multipliers(f, a, spec, hp);
  if (spec.layer_shapes) read_layer_shapes(f, a, hp);
  else if (spec.short_conv) check_uniform(f, a, hp.n_layer, {"feed_forward_length", "attention.head_count"});
  else check_uniform(f, a, hp.n_layer);
  if (spec.delta_net) read_delta_net(f, a, hp);
  if (spec.short_conv) read_short_conv(f, a, hp);
  const int64_t unset = -1;
  hp.pooling_type = ranged(f, a + "pooling_type", -1, 1 << 16, &unset);  // read, not used: any value loads
  const GGUFTensor* cls = f.find("cls.output.weight");
  if (cls && (cls->ne[0] != hp.n_embd || cls->ne[1] < 1 || cls->ne[1] > 64))
    f.fail("tensor 'cls.output.weight' has shape [" + std::to_string(cls->ne[0]) + ", " + std::to_string(cls->ne[1]) +
           "], expected [" + std::to_string(hp.n_embd) + ", 1..64]");
  hp.n_cls_out = cls ? (int)cls->ne[1] : 0;
  return hp;
}

}  // namespace pyserve
