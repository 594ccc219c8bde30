// hparams: what an architecture does differently in the one layer graph (ArchSpec), and a file's
// hyper-parameters (HParams) read from its metadata — everything a model's shape and numerics depend on.
//
// Supported architectures: gemma2, gemma3, gemma4 (dense and MoE, per-layer embeddings, shared KV), glm4moe,
// granite, lfm2, lfm2moe, llama (Llama 2/3.x, Mistral, Mixtral, SmolLM2, TinyLlama), gpt-oss, mistral3, olmo2,
// phi3, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, smollm3. Any of them may be a mixture of experts: a file
// with `<arch>.expert_count` runs the MoE block (moe.h) in place of the FFN. RoPE scaling as the file declares
// it (linear, YaRN, LongRoPE factors), for any of them. The hybrids keep a recurrent state per sequence:
// qwen35's Gated DeltaNet layers (delta_net.h) and lfm2's gated short-conv layers (short_conv.h) between
// their attention ones.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/delta_net.h"
#include "gguf/gguf.h"
#include "model/moe.h"
#include "model/short_conv.h"

namespace pyserve {

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Each architecture is llama's spec with what it changes (hparams.cpp states each as a diff of its parent).
struct ArchSpec {
  const char* name = "llama";
  bool neox_rope = false;       // RoPE pairs (i, i+d/2) rather than (2i, 2i+1)
  bool gelu = false;            // GELU-tanh gate (gemma) rather than SiLU
  bool embd_scale = false;      // multiply embeddings by sqrt(n_embd)
  bool qk_norm = false;         // q and k RMS-normed (required; any arch uses them where the file has them)
  bool qk_norm_full = false;    // ... over the whole projection (olmo2) rather than per head
  bool pre_norms = true;        // RMS norm before attention and before the FFN (olmo2: none)
  bool post_norms = false;      // RMS norm after attention and after the FFN, before the residual add
  bool sliding_window = false;  // local layers attend to the last n_swa positions
  int swa_pattern = 0;          // every swa_pattern-th layer is global unless the file says (gemma3: 6, gemma2: 2)
  int swa_window = 0;           // the window when the file gives none (gemma2: 4096)
  float swa_rope_base = 0.f;    // local layers' RoPE base unless the file says (0: the global one; gemma3: 10000)
  float attn_softcap = 0.f;     // scores → c·tanh(s / c) unless the file says (gemma2: 50; 0 = none)
  float final_softcap = 0.f;    // logits → c·tanh(l / c) unless the file says (gemma2: 30)
  int no_rope_step = 0;         // > 0: every no_rope_step-th layer applies no RoPE (smollm3: 4, llama.cpp's constant)
  bool swa_rope_scaled = false; // local layers' RoPE stretched as the global ones (gemma2, gpt-oss; gemma3: never)
  bool moe_only = false;        // every file is a MoE: expert_count is required (qwen3moe, glm4moe, gpt-oss, …)
  bool moe_norm = true;         // MoE: renormalise the chosen experts' weights unless the file says
  Gating moe_gating = Gating::Softmax;  // MoE routing unless the file says (gpt-oss: softmax over the chosen)
  bool moe_oai_glu = false;     // MoE experts' clamped SwiGLU (gpt-oss) rather than SiLU(gate) · up
  bool moe_gelu = false;        // ... GELU-tanh(gate) · up; the experts beside a dense FFN, their own router input (gemma4)
  const char* ffn_norm = "ffn_norm";  // the FFN's input norm tensor (glm4moe: post_attention_norm)
  float attn_scale = 0.f;       // q·k multiplier whatever the file says (gemma4: 1; 0: attention.scale or 1/sqrt(hd))
  bool layer_shapes = false;    // gemma4: per-layer head widths / KV heads / FFN widths, shared-KV layers,
                                // V RMS-normed (unweighted), K as V where attn_v is absent, rope_freqs on
                                // global layers only, per-layer token embeddings, layer_output_scale
  int moe_shared = 0;           // MoE: shared experts unless the file says (qwen35moe: 1, sigmoid-gated where it has the gate)
  bool delta_net = false;       // layers the file's ssm.* / full_attention_interval keys say are Gated DeltaNet (qwen35)
  bool attn_gate = false;       // attn_q gives per head the query then a gate: output × sigmoid(gate) (qwen35)
  bool short_conv = false;      // the layers with 0 KV heads (attention.head_count_kv array) are gated short convs (lfm2)
  const char* output_norm = "output_norm";  // the final norm tensor (lfm2: token_embd_norm, llama.cpp's name for it)
};
// The spec of `arch`, or throws ModelError listing the supported architectures.
const ArchSpec& arch_spec(const std::string& arch);
std::vector<std::string> supported_architectures();

struct HParams {
  std::string arch;
  int n_vocab = 0;
  int n_embd = 0;        // model width
  int n_layer = 0;       // the layers the forward runs (the file's blocks less its MTP layers)
  int n_mtp = 0;         // nextn_predict_layers: MTP (NextN) layers closing the block list, blk.n_layer …
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;      // key/query width per head
  int head_dim_v = 0;    // value width per head
  int n_ff = 0;          // FFN inner width
  int n_ctx_train = 0;   // context length the model was trained for
  float eps = 1e-6f;     // RMS norm epsilon
  float rope_base = 10000.f, rope_base_local = 10000.f;
  RopeScaling rope_scaling;  // the global layers' (and the local ones' where ArchSpec::swa_rope_scaled)
  int rope_dim = 0;
  int n_swa = 0;         // sliding window (tokens), 0 = none
  int swa_pattern = 0;   // every swa_pattern-th layer is global (gemma3: 6)
  int no_rope_step = 0;  // every no_rope_step-th layer is position-free (NoPE), 0 = none
  float attn_scale = 0.f;     // multiplies q·k (attention.scale, else 1/sqrt(head_dim))
  float attn_softcap = 0.f;   // attention scores soft-capped at ±c (0 = none)
  float final_softcap = 0.f;  // logits soft-capped at ±c (0 = none)
  float embd_mult = 1.f;      // multiplies the embeddings (gemma: sqrt(n_embd); granite: embedding_scale)
  float residual_mult = 1.f;  // multiplies each block's output before the residual add (granite)
  float logit_mult = 1.f;     // multiplies the logits (granite: 1 / logit_scale)
  float attn_temp_scale = 0.f;  // q × 1 + s·ln(⌊pos / attn_temp_floor⌋ + 1) (mistral3, llama4); 0 = none
  int attn_temp_floor = 0;
  MoeParams moe;              // n_expert == 0: every layer dense
  DeltaNetParams dn;          // the recurrent layers (ArchSpec::delta_net), none otherwise
  ShortConvParams sc;         // the short-conv layers (ArchSpec::short_conv), none otherwise
  int pooling_type = -1;      // <arch>.pooling_type (llama.cpp's enum: 1 mean, 3 last, 4 rank), -1 = unset
  int n_cls_out = 0;          // rows of the classifier head cls.output.weight (a reranker's), 0 = none
  // gemma4's per-layer shapes (empty / 0: every layer as the scalars above; n_head_kv, n_ff are then the maxima)
  std::vector<uint8_t> swa_layers;   // [n_layer] 1 = sliding-window layer (attention.sliding_window_pattern array)
  std::vector<int> n_head_kv_layer;  // [n_layer] KV heads (attention.head_count_kv array)
  std::vector<int> n_ff_layer;       // [n_layer] FFN widths (feed_forward_length array)
  int head_dim_swa = 0;              // local layers' q/k/v head width (attention.key_length_swa)
  int rope_dim_swa = 0;              // local layers' rotated dims (rope.dimension_count_swa)
  int n_layer_kv = 0;                // layers [0, n_layer_kv) own K/V, later ones read an earlier layer's (0: all)
  int n_embd_per_layer = 0;          // per-layer token embedding width (embedding_length_per_layer_input), 0 = none
  int kv_dim() const { return n_head_kv * head_dim; }
  int layer_head_dim(int il) const { return head_dim_swa > 0 && is_local(il) ? head_dim_swa : head_dim; }
  int layer_rope_dim(int il) const { return rope_dim_swa > 0 && is_local(il) ? rope_dim_swa : rope_dim; }
  int layer_n_head_kv(int il) const { return n_head_kv_layer.empty() ? n_head_kv : n_head_kv_layer[il]; }
  int layer_ff(int il) const { return n_ff_layer.empty() ? n_ff : n_ff_layer[il]; }
  int layer_kv_dim(int il) const { return layer_n_head_kv(il) * layer_head_dim(il); }
  // The layer whose K/V layer il attends over: itself, or (a shared-KV layer) the last owning layer of its kind.
  int kv_layer(int il) const { return n_layer_kv <= 0 || il < n_layer_kv ? il : n_layer_kv - (is_local(il) ? 2 : 1); }
  // [n_layer] K (and V) floats per token slot of each layer, 0: shared or recurrent; with_mtp: then the first MTP
  // layer's (the drafter's own K/V, beside the target's in the same blocks)
  std::vector<int> kv_widths(bool with_mtp = false) const;
  // The recurrent layers (DeltaNet or short conv: a model has one kind) and their state, per layer and slot:
  // conv inputs, then matrices (RecurrentStatePool's layout).
  bool recurrent(int il) const { return dn.recurrent(il) || sc.conv_layer(il); }
  int recurrent_index(int il) const { return dn.recurrent(il) ? dn.index[il] : sc.conv_layer(il) ? sc.index[il] : -1; }
  int n_recurrent() const { return dn.n_recurrent() + sc.n_conv(); }
  int64_t state_conv_floats() const { return sc.n_conv() > 0 ? sc.state_floats() : dn.conv_floats(); }
  int64_t state_mat_floats() const { return dn.mat_floats(); }
  int max_head_dim() const { return std::max(head_dim, head_dim_swa); }
  float attn_temperature(int pos) const {
    return attn_temp_scale == 0.f ? 1.f : 1.f + attn_temp_scale * std::log(std::floor((float)pos / attn_temp_floor) + 1.f);
  }
  bool is_local(int layer) const {
    if (!swa_layers.empty()) return n_swa > 0 && swa_layers[layer];
    return n_swa > 0 && swa_pattern > 0 && (layer + 1) % swa_pattern != 0;
  }
  bool roped(int layer) const { return no_rope_step <= 0 || (layer + 1) % no_rope_step != 0; }
  // The FFN inner width a token runs through in layer il: the dense width, or its experts' and the shared.
  int64_t active_ff(int layer) const {
    return moe.moe_layer(layer) ? (int64_t)moe.n_used * moe.n_ff + moe.n_ff_shared : layer_ff(layer);
  }
};

// The hyper-parameters of an open file's model, from its metadata and tensor table alone (no weights read:
// cheap enough for listing a model before it loads). Throws ModelError for an unsupported architecture,
// GGUFError (file, key) for a missing or out-of-range value.
HParams read_hparams(const GGUFFile& f);

}  // namespace pyserve
