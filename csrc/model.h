// model: a decoder-only transformer read from a GGUF file — its hyper-parameters, its weights (pointers
// into the mapping), and its batched forward pass.
//
// Supported architectures: gemma3, llama (Llama 2/3.x, Mistral, Mixtral, SmolLM2, TinyLlama), qwen2, qwen3,
// qwen3moe, smollm3, glm4moe. They share one layer graph; ArchSpec holds what differs (norms around the blocks, q/k
// norms, biases, RoPE layout, activation, embedding scale, sliding-window layers). Any of them may be a
// mixture of experts: a file with `<arch>.expert_count` runs the MoE block (moe.h) in place of the FFN.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf.h"
#include "kv_cache.h"
#include "moe.h"
#include "ops.h"
#include "threadpool.h"

namespace pyserve {

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ArchSpec {
  const char* name;
  bool neox_rope;        // RoPE pairs (i, i+d/2) rather than (2i, 2i+1)
  bool gelu;             // GELU-tanh gate (gemma) rather than SiLU
  bool embd_scale;       // multiply embeddings by sqrt(n_embd)
  bool qk_norm;          // per-head RMS norm on q and k
  bool post_norms;       // RMS norm after attention and after the FFN, before the residual add
  bool sliding_window;   // local layers attend to the last n_swa positions
  int no_rope_step = 0;  // > 0: every no_rope_step-th layer applies no RoPE (smollm3: 4, llama.cpp's constant)
  bool moe_norm = true;  // MoE: renormalise the chosen experts' weights unless the file says (expert_weights_norm)
  const char* ffn_norm = "ffn_norm";  // the FFN's input norm tensor (glm4moe: post_attention_norm)
};
// The spec of `arch`, or throws ModelError listing the supported architectures.
const ArchSpec& arch_spec(const std::string& arch);
std::vector<std::string> supported_architectures();

struct HParams {
  std::string arch;
  int n_vocab = 0;
  int n_embd = 0;        // model width
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;      // key/query width per head
  int head_dim_v = 0;    // value width per head
  int n_ff = 0;          // FFN inner width
  int n_ctx_train = 0;   // context length the model was trained for
  float eps = 1e-6f;     // RMS norm epsilon
  float rope_base = 10000.f, rope_base_local = 10000.f, rope_freq_scale = 1.f;
  int rope_dim = 0;
  int n_swa = 0;         // sliding window (tokens), 0 = none
  int swa_pattern = 0;   // every swa_pattern-th layer is global (gemma3: 6)
  int no_rope_step = 0;  // every no_rope_step-th layer is position-free (NoPE), 0 = none
  float attn_scale = 0.f;// multiplies q·k
  MoeParams moe;         // n_expert == 0: every layer dense
  int kv_dim() const { return n_head_kv * head_dim; }
  bool is_local(int layer) const { return n_swa > 0 && swa_pattern > 0 && (layer + 1) % swa_pattern != 0; }
  bool roped(int layer) const { return no_rope_step <= 0 || (layer + 1) % no_rope_step != 0; }
  // The FFN inner width a token runs through in layer il: the dense width, or its experts' and the shared.
  int64_t active_ff(int layer) const {
    return moe.moe_layer(layer) ? (int64_t)moe.n_used * moe.n_ff + moe.n_ff_shared : n_ff;
  }
};

// The hyper-parameters of an open file's model, from its metadata and tensor table alone (no weights read:
// cheap enough for listing a model before it loads). Throws ModelError for an unsupported architecture,
// GGUFError (file, key) for a missing or out-of-range value.
HParams read_hparams(const GGUFFile& f);

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;                 // [n_embd]
  std::vector<float> q_norm, k_norm;                      // [head_dim] (qk_norm)
  std::vector<float> post_attn_norm, post_ffn_norm;       // [n_embd] (post_norms)
  std::vector<float> bq, bk, bv;                          // [n_head*hd], [kv_dim], [kv_dim] or empty
  Weight wq, wk, wv, wo;                                  // [n_head*hd × n_embd], [kv_dim × n_embd] ×2, [n_embd × n_head*hd_v]
  Weight w_gate, w_up, w_down;                            // [n_ff × n_embd] ×2, [n_embd × n_ff] (dense layers)
  MoeWeights moe;                                         // MoE layers (hp.moe.moe_layer(il))
};

// One engine step's tokens, from any number of sequences.
struct Batch {
  std::vector<int32_t> tokens;                        // [T] token ids
  std::vector<int32_t> pos;                           // [T] position of each token in its sequence
  std::vector<const std::vector<int32_t>*> tables;    // [T] block table of each token's sequence
  std::vector<int32_t> logit_rows;                    // rows of [0, T) whose logits are wanted, in order
  std::vector<int32_t> hidden_rows;                   // rows whose final-norm hidden state is wanted, in order
  size_t size() const { return tokens.size(); }
  void clear() { tokens.clear(); pos.clear(); tables.clear(); logit_rows.clear(); hidden_rows.clear(); }
};

class Model {
 public:
  // Reads hyper-parameters and weights from an open file. Throws ModelError (file, tensor, what) on a
  // missing tensor, a shape that disagrees with the metadata, or an unsupported architecture.
  explicit Model(std::shared_ptr<const GGUFFile> file);

  const HParams& hparams() const { return hp_; }
  const GGUFFile& file() const { return *file_; }

  // Runs the batch: writes K/V of every token into `kv` through its table (blocks must be allocated),
  // then fills logits[logit_rows.size() × n_vocab] and, when given, hidden[hidden_rows.size() × n_embd]
  // (the final-norm states: the output projection's input). Every token id must be in the vocabulary: the
  // engine checks them before (Engine::check for requests, prompt_logits for its tokens).
  void forward(const Batch& batch, KVCache& kv, ThreadPool& pool, std::vector<float>& logits,
               std::vector<float>* hidden = nullptr);
  // The output projection of R final-norm states hidden[R × n_embd] into logits[R × n_vocab]: the same bits
  // as forward's logits of those rows (the matmul is batch-invariant). Call between forwards.
  void project(ThreadPool& pool, const float* hidden, int R, std::vector<float>& logits);

 private:
  void load_weights();
  // Re-lays every packable matrix for the matmul kernels (packed.h) and hands back its mapped pages, so
  // one copy of each weight stays resident. Throws ModelError when the copy does not fit in memory.
  void pack_weights();
  Weight weight(const std::string& name, int64_t n_in, int64_t n_out) const;
  // The n_expert matrices [n_out × n_in] of a 3-D expert tensor [n_in, n_out, n_expert].
  std::vector<Weight> experts(const std::string& name, int64_t n_in, int64_t n_out) const;
  void load_moe(int il, MoeWeights& w);
  void ffn(int il, const Batch& b, ThreadPool& pool);  // o_ = the FFN (dense or MoE) of h_
  std::vector<float> vec(const std::string& name, int64_t n, bool optional = false) const;
  void attention(int layer, const Batch& b, KVCache& kv, ThreadPool& pool);
  void layer(int il, const Batch& b, KVCache& kv, ThreadPool& pool);
  void final_norm(const std::vector<int32_t>& rows, std::vector<float>& out) const;  // out[rows × n_embd]

  std::shared_ptr<const GGUFFile> file_;
  const ArchSpec* spec_ = nullptr;
  HParams hp_;
  Weight tok_embd_, output_;
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
  RopeParams rope_global_, rope_local_;

  // Work buffers, [T × width], reused across steps.
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_, final_;
  std::vector<float> rope_cs_;  // [global, local][T][rope_dim]: cos/sin of each token's position
  std::vector<std::vector<float>> scores_;  // per thread: [group × context] attention weights
  std::vector<std::vector<const uint16_t*>> krows_, vrows_;  // per thread: [context] the K / V rows attended
  ActBuffer act_;
  MoeFfn moe_;
};

}  // namespace pyserve
