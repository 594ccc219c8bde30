// model: a decoder-only transformer read from a GGUF file — its hyper-parameters, its weights (pointers
// into the mapping), and its batched forward pass.
//
// Every architecture runs the same layer graph; what differs is in hparams.h (ArchSpec, HParams).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/hparams.h"
#include "attention/attention.h"
#include "kv/kv_cache.h"
#include "model/delta_net.h"
#include "model/moe.h"
#include "kernels/ops.h"
#include "gguf/packed_file.h"
#include "model/per_layer_embd.h"
#include "model/short_conv.h"
#include "base/threadpool.h"

namespace pyserve {

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;                 // [n_embd] (pre_norms) or empty
  std::vector<float> q_norm, k_norm;                      // [head_dim] (or the whole q / k: qk_norm_full) or empty
  std::vector<float> post_attn_norm, post_ffn_norm;       // [n_embd] (post_norms) or empty
  std::vector<float> bq, bk, bv, bo;                      // [n_head*hd], [kv_dim], [kv_dim], [n_embd] or empty
  std::vector<float> sinks;                               // [n_head] attention-sink logits (gpt-oss) or empty
  Weight wq, wk, wv, wo;                                  // [n_head*hd × n_embd], [kv_dim × n_embd] ×2, [n_embd × n_head*hd_v]
  Weight w_gate, w_up, w_down;                            // [n_ff × n_embd] ×2, [n_embd × n_ff] (dense layers)
  MoeWeights moe;                                         // MoE layers (hp.moe.moe_layer(il))
  std::vector<float> out_scale;                           // [1] layer_output_scale (gemma4) or empty
  DeltaNetWeights dn;                                     // Gated DeltaNet layers (hp.dn.recurrent(il)): no q/k/v/o
  ShortConvWeights sc;                                    // short-conv layers (hp.sc.conv_layer(il)): no q/k/v/o
};

// A multi-token-prediction (NextN) layer's own tensors, beside an ordinary layer's (llama.cpp's names,
// blk.<n_layer>.nextn.*; Qwen3.5's mtp.fc / pre_fc_norm_embedding / pre_fc_norm_hidden / norm, DeepSeek's and
// GLM's the same): the layer reads eh_proj · [enorm(embedding of token t+1) ; hnorm(target state at t)].
struct MtpWeights {
  Weight eh_proj;                    // [n_embd × 2·n_embd]
  std::vector<float> enorm, hnorm;   // [n_embd] each
  std::vector<float> head_norm;      // [n_embd] shared_head_norm (before the output head), or empty: output_norm
};

// One engine step's tokens, from any number of sequences.
struct Batch {
  std::vector<int32_t> tokens;                        // [T] token ids
  std::vector<int32_t> pos;                           // [T] position of each token in its sequence
  std::vector<const std::vector<int32_t>*> tables;    // [T] block table of each token's sequence
  std::vector<int32_t> logit_rows;                    // rows of [0, T) whose logits are wanted, in order
  std::vector<int32_t> hidden_rows;                   // rows whose final-norm hidden state is wanted, in order
  std::vector<int32_t> slots;                         // [T] recurrent state slot of each token's sequence (hybrids)
  // [T] or empty (none): a slot that takes a copy of the token's sequence state once the token is in it (-1:
  // none) — the state after each drafted row but the last, so a rejected draft rolls back (speculation)
  std::vector<int32_t> snapshots;
  size_t size() const { return tokens.size(); }
  void clear() {
    tokens.clear(), pos.clear(), tables.clear(), logit_rows.clear(), hidden_rows.clear(), slots.clear();
    snapshots.clear();
  }
};

class Model {
 public:
  // Reads hyper-parameters and weights from an open file. Throws ModelError (file, tensor, what) on a
  // missing tensor, a shape that disagrees with the metadata, or an unsupported architecture.
  // with_mtp: also the file's first MTP layer (draft_forward), or ModelError where it has none.
  // packed_path: a file of these weights packed (packed_file.h, save_packed) mapped instead of packing them,
  // when it fits them; any other file, or none there, and they are packed.
  explicit Model(std::shared_ptr<const GGUFFile> file, bool with_mtp = false, const std::string& packed_path = "");

  const HParams& hparams() const { return hp_; }
  // The context a sequence may reach (the engine's max model length): picks LongRoPE's long or short
  // frequency factors as llama.cpp does. Call before the first forward.
  void set_context(int n_ctx);
  const GGUFFile& file() const { return *file_; }
  // Whether the packed weights were mapped from packed_path (else packed at load); their bytes.
  bool packed_from_file() const { return packed_file_ != nullptr; }
  size_t packed_bytes();
  // Writes the packed weights to `path` for a later load's packed_path (packed_file.h: throws
  // std::runtime_error when a write fails). Reads them only: safe beside forwards.
  void save_packed(const std::string& path);

  // Runs the batch: writes K/V of every token into `kv` through its table (blocks must be allocated),
  // then fills logits[logit_rows.size() × n_vocab] and, when given, hidden[hidden_rows.size() × n_embd]
  // (the final-norm states: the output projection's input). Every token id must be in the vocabulary: the
  // engine checks them before (Engine::check for requests, prompt_logits for its tokens). A hybrid model
  // (hparams().n_recurrent() > 0) reads and advances each token's state slot (batch.slots) in `states`,
  // copying it into batch.snapshots' slots where given: without slots it throws std::logic_error. A
  // sequence's tokens are consecutive and in order in the batch.
  void forward(const Batch& batch, KVCache& kv, ThreadPool& pool, std::vector<float>& logits,
               std::vector<float>* hidden = nullptr, RecurrentStatePool* states = nullptr);
  // The MTP layer's forward (a with_mtp model), as vLLM's MTP proposer runs it: row t, at position b.pos[t],
  // joins the target's final-norm state there (target[t × n_embd]) with the embedding of the token that
  // followed it (b.tokens[t], at b.pos[t] + 1); its K/V go to kv's layer n_layer (a kv of kv_widths(true));
  // logits[logit_rows × n_vocab] guess the token at b.pos[t] + 2. No state slots: the layer is attention.
  void draft_forward(const Batch& b, const float* target, KVCache& kv, ThreadPool& pool, std::vector<float>& logits);
  bool has_mtp() const { return (int)layers_.size() > hp_.n_layer; }
  // The output projection of R final-norm states hidden[R × n_embd] into logits[R × n_vocab]: the same bits
  // as forward's logits of those rows (the matmul is batch-invariant). Call between forwards.
  void project(ThreadPool& pool, const float* hidden, int R, std::vector<float>& logits);
  // A reranker's relevance score of one final-norm state h[n_embd] (llama.cpp's RANK pooling, in double): the
  // classifier head's rows cls_out · h + cls_out_b; with two or more rows (Qwen3-Reranker's "yes", "no" rows
  // of its LM head) the softmax's first entry, P(yes); with one row its raw logit. Needs hparams().n_cls_out.
  double rank(const std::vector<double>& h) const;

 private:
  void load_weights(bool with_mtp);
  void load_layer(int il);
  void load_mtp();
  void prepare(const Batch& b, ThreadPool& pool);  // work buffers for b, its RoPE angles
  void embed(const Batch& b, ThreadPool& pool, float* x) const;  // x[T × n_embd]: the tokens' scaled embeddings
  // Re-lays every packable matrix for the matmul kernels (packed.h) and hands back its mapped pages, so
  // one copy of each weight stays resident. Throws ModelError when the copy does not fit in memory.
  void pack_weights(const std::string& packed_path);
  bool map_packed(const std::vector<Weight*>& ws, const std::string& path);
  std::vector<Weight*> matrices();  // the packable matrices, in a fixed order (the packed file's)
  Weight weight(const std::string& name, int64_t n_in, int64_t n_out) const;
  Weight rows(const Weight& w, int64_t r0, int64_t n) const;
  void load_qkv(const std::string& prefix, LayerWeights& L, int il);
  void load_gate_up(const std::string& prefix, LayerWeights& L, int64_t n_ff);
  // The n_expert matrices [n_out × n_in] of a 3-D expert tensor [n_in, n_out, n_expert].
  std::vector<Weight> experts(const std::string& name, int64_t n_in, int64_t n_out) const;
  void load_moe(int il, MoeWeights& w);
  void load_attention(const std::string& prefix, LayerWeights& L, int il);
  void load_delta_net(const std::string& prefix, DeltaNetWeights& w);
  void load_short_conv(const std::string& prefix, ShortConvWeights& w);
  // a recurrent layer: Gated DeltaNet (delta_net.h) or short conv (short_conv.h) mixer, then the FFN
  void recurrent_layer(int il, const Batch& b, ThreadPool& pool);
  void ffn_block(int il, const Batch& b, ThreadPool& pool);    // o_ of the mixer → residual, FFN, residual
  void ffn(int il, const Batch& b, ThreadPool& pool);  // o_ = the FFN (dense or MoE) of h_
  void dense_ffn(int il, int T, ThreadPool& pool);
  void moe_beside_dense(int il, const Batch& b, ThreadPool& pool);
  void block_input(const float* x, const std::vector<float>& norm, float* h) const;
  void residual_add(float* o, const std::vector<float>& post_norm, float* x) const;
  std::vector<float> vec(const std::string& name, int64_t n, bool optional = false) const;
  void attention(int layer, const Batch& b, KVCache& kv, ThreadPool& pool);
  void query_runs(const Batch& b, int most);
  void store_kv(int il, const Batch& b, KVCache& kv);
  static void head_rows(KVCache& kv, int src, const std::vector<int32_t>& tab, int lo, int n, size_t at,
                        std::vector<const uint8_t*>& krows, std::vector<const uint8_t*>& vrows);
  void layer(int il, const Batch& b, KVCache& kv, ThreadPool& pool);
  void v_norm(const float* k, float* v, bool k_as_v, int n_kv, int hd) const;
  void final_norm(const std::vector<int32_t>& rows, std::vector<float>& out) const;  // out[rows × n_embd]

  std::shared_ptr<const GGUFFile> file_;
  std::shared_ptr<const PackedFile> packed_file_;  // the packed weights' mapping, when they come from one
  const ArchSpec* spec_ = nullptr;
  HParams hp_;
  Weight tok_embd_, output_;
  std::vector<float> output_norm_;
  std::vector<float> cls_out_, cls_out_b_;  // [n_cls_out × n_embd], [n_cls_out] or empty: a reranker's head
  std::vector<LayerWeights> layers_;  // [n_layer], then the MTP layer where loaded
  MtpWeights mtp_;
  std::vector<float> mtp_in_;         // [T × 2·n_embd] the MTP layer's [embedding ; target state], normed
  RopeParams rope_global_, rope_local_;
  PerLayerEmbd ple_;         // gemma4's per-layer token embeddings (enabled() where the file has them)
  std::vector<float> ones_;  // [max head_dim] the weight of an unweighted RMS norm (gemma4's V)
  std::vector<float> rope_freqs_, rope_short_, rope_long_;  // [rope_dim / 2] frequency factors, or empty

  // Work buffers, [T × width], reused across steps.
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_, final_;
  std::vector<float> moe_in_, router_in_, moe_out_;  // gemma4's MoE layers: [T × n_embd] each
  std::vector<float> rope_cs_;  // [global, local][T][cs_stride()]: cos/sin of each token's position
  int cs_stride() const { return std::max(hp_.rope_dim, hp_.rope_dim_swa); }
  std::vector<AttnScratch> scratch_;  // [threads × kAttnQueryRun]: attend_run's buffers, a query's each
  std::vector<AttnScratch> parts_;    // [2 · decode items]: a decoded query's parts of keys, one per thread
  std::vector<int> run_first_;        // [runs + 1]: the step's query runs (query_runs), then T
  std::vector<std::vector<const uint8_t*>> krows_, vrows_;  // per thread: [context] the K / V rows attended (kv_rows.h)
  ActBuffer act_;
  MoeFfn moe_;
  DeltaNet delta_net_;
  ShortConv short_conv_;
  RecurrentStatePool* states_ = nullptr;  // the current forward's (hybrid models)
  std::vector<float> qg_, qgate_;         // ArchSpec::attn_gate: [T × 2·n_head·hd] the projection, [T × n_head·hd] its gates
};

}  // namespace pyserve
