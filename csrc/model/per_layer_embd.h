// per_layer_embd: gemma4's per-layer token embeddings (the E2B / E4B variants; llama.cpp:
// src/models/gemma4.cpp, build_inp_per_layer / project_per_layer_inputs and the block after the FFN).
//
// Every token has, beside its embedding, a vector of n_embd_per_layer (P) values for each layer: its row of
// per_layer_token_embd [n_layer·P × n_vocab] × sqrt(P), plus a projection of the scaled embedding
// (per_layer_model_proj / sqrt(n_embd), RMS-normed per layer with per_layer_proj_norm), the sum × 1/sqrt(2).
// After each layer's FFN residual: x += post_norm(proj · (GELU(inp_gate · x) ⊙ that layer's vector)).
// load() throws ModelError (through the file) naming a missing tensor or one of the wrong shape.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/hparams.h"
#include "kernels/ops.h"
#include "base/threadpool.h"

namespace pyserve {

using WeightLoader = std::function<Weight(const std::string& name, int64_t n_in, int64_t n_out)>;
using VecLoader = std::function<std::vector<float>(const std::string& name, int64_t n)>;

class PerLayerEmbd {
 public:
  bool enabled() const { return P_ > 0; }
  void load(const HParams& hp, const WeightLoader& weight, const VecLoader& vec);
  std::vector<Weight*> matrices();  // the projections, for packing (not the embedding table: rows are looked up)
  // From the batch's tokens and their scaled embeddings x[T × n_embd]: every layer's input vectors.
  void inputs(ThreadPool& pool, const int32_t* tokens, const float* x, int T, ActBuffer& act);
  // x[T × n_embd] += layer il's per-layer embedding block (after the layer's FFN residual).
  void apply(int il, ThreadPool& pool, float* x, int T, ActBuffer& act);

 private:
  struct Layer {
    Weight inp_gate, proj;          // [P × n_embd], [n_embd × P]
    std::vector<float> post_norm;   // [n_embd]
  };
  int P_ = 0, L_ = 0, E_ = 0;
  float eps_ = 1e-6f;
  Weight tok_, model_proj_;          // [n_layer·P × n_vocab] (rows by token), [n_layer·P × n_embd]
  std::vector<float> proj_norm_;     // [P]
  std::vector<Layer> layers_;
  std::vector<float> inp_;           // [T × n_layer·P] every layer's input vectors
  std::vector<float> g_, y_;         // [T × P], [T × n_embd]
};

}  // namespace pyserve
