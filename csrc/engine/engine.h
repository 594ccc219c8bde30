// engine: add / step / abort over a model, its KV cache and the scheduler.
//
// add() and abort() may be called from any thread: they only enqueue, and step() applies them first,
// so a request aborted between two steps has its blocks back in the pool before the next step runs.
// step() itself runs on one thread at a time (the engine thread, or the caller of LLM.generate).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/block_manager.h"
#include "scheduler/disk_blocks.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "scheduler/scheduler.h"
#include "scheduler/sequence_groups.h"
#include "scheduler/step_cost.h"
#include "base/threadpool.h"

namespace pyserve {

// The engine's options: pyserve/engine/options.py (EngineOptions) is their one definition for Python — the
// same names and defaults, held to these by tests/engine/test_engine_options.py; bindings/engine.cpp binds every field
// through PYSERVE_ENGINE_CONFIG_FIELDS.
struct EngineConfig {
  int n_threads = 0;              // <= 0: one per core
  int n_ctx = 0;                  // max tokens per sequence; <= 0: min(model's, 8192)
  int num_kv_blocks = 0;          // > 0 wins over kv_cache_memory
  size_t kv_cache_memory = 0;     // bytes; 0 with num_kv_blocks 0: 512 MiB, and at least n_ctx tokens
  int block_size = 16;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;  // tokens per step at most
  bool enable_prefix_caching = true;
  // > 0 (seconds): each step beside decodes takes only the prompt tokens that keep its predicted time under
  // this (scheduler.h); the predictor is calibrated at load and refitted on every step. 0: the token budget.
  double target_itl = 0.0;
  // > 0: speculative decoding by prompt lookup (ngram_draft.h), up to this many drafted tokens per sequence
  // and step, verified in the step's own forward; 0: off. Outputs are the same either way, bit for bit.
  int speculative_ngram = 0;
  // With speculation: drafted rows priced on the forward times measured at load (scheduler.h: a draft only
  // as long as it pays for itself); false: every match is drafted.
  bool speculative_price_drafts = true;
  // Where drafts come from: "ngram" (prompt lookup, ngram_draft.h) or "mtp" (the file's multi-token-prediction
  // layer, Model::draft_forward: one token ahead a step, so at most one drafted token whatever the K).
  std::string speculative_method = "ngram";
  // How a KV cache slot stores K and V (kv_rows.h): "f16" (llama.cpp's default), "f32", "bf16", "q8_0" (34
  // bytes per 32 values: ~1.9× the tokens of f16 in the same memory).
  std::string kv_cache_dtype = "f16";
  // The prefix cache's disk tier (disk_blocks.h): full prompt blocks the pool evicts (and those cached at
  // persist_kv_cache) are kept as files in this directory ("": off), read back instead of recomputed — across
  // restarts, and by other servers of the same model file and layout on the same directory. At most
  // kv_cache_disk bytes (0: 16 GiB), the least recently used dropped.
  std::string kv_cache_dir;
  size_t kv_cache_disk = 0;
};

// What the engine makes of a model and a config before it allocates anything: the context and the KV pool.
struct KVGeometry {
  int n_ctx = 0;               // tokens a sequence may hold at most (the config's, or min(model's, 8192))
  int num_kv_blocks = 0;       // blocks in the pool
  int block_size = 0;          // token slots per block
  size_t bytes_per_block = 0;  // K and V of every layer, in kv_cache_dtype
  // Hybrid models' recurrent state (0 without recurrent layers): a slot per seat (+ spec_rows - 1 with
  // speculation: the state after each drafted row) and, with prefix caching, checkpoints at block boundaries.
  int state_slots = 0;
  int state_checkpoints = 0;
  int64_t state_slot_bytes = 0;  // one slot or checkpoint: every recurrent layer's conv inputs and matrices
  int max_model_len() const;   // min(n_ctx, the pool's tokens): what one sequence can really reach
  int64_t state_bytes() const { return (int64_t)(state_slots + state_checkpoints) * state_slot_bytes; }
};
// A request longer than one sequence can be: prompt + max_tokens > max_len (KVGeometry::max_model_len). A
// std::invalid_argument (a ValueError) whose message names the bound it passed (the context or the KV
// pool); its numbers let the layer above say it in its own protocol's words (_engine.ContextLengthError).
struct ContextLengthError : std::invalid_argument {
  ContextLengthError(const std::string& what, int max_len, int n_prompt, int max_tokens)
      : std::invalid_argument(what), max_len(max_len), n_prompt(n_prompt), max_tokens(max_tokens) {}
  int max_len, n_prompt, max_tokens;
};

// Throws std::invalid_argument naming the first field no engine accepts (negative sizes; block_size,
// max_num_seqs or max_num_batched_tokens not positive; target_itl negative or not finite; speculative_ngram < 0;
// kv_cache_dtype not one of f32, f16, bf16, q8_0; speculative_method not ngram or mtp).
void check_config(const EngineConfig& c);
// Speculation on, its drafts from the model's MTP layer.
inline bool drafts_by_mtp(const EngineConfig& c) { return c.speculative_ngram > 0 && c.speculative_method == "mtp"; }
// The one rule for it (Engine uses it; Python lists a model with it before loading). Throws as check_config,
// std::invalid_argument naming the layer and its head width where a q8_0 cache cannot hold it, and one
// saying so where MTP drafts are asked of a file without MTP layers.
KVGeometry kv_geometry(const HParams& hp, const EngineConfig& c);

#define PYSERVE_ENGINE_CONFIG_FIELDS(X)                                                                      \
  X(n_threads) X(n_ctx) X(num_kv_blocks) X(kv_cache_memory) X(block_size) X(max_num_seqs)                    \
  X(max_num_batched_tokens) X(enable_prefix_caching) X(target_itl) X(speculative_ngram)                      \
  X(speculative_price_drafts) X(speculative_method) X(kv_cache_dtype) X(kv_cache_dir) X(kv_cache_disk)

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingConfig sampling;
  StopConfig stop;
  int n = 1;  // samples of the prompt: prefilled once, then forked (the prompt's blocks shared, copy on write)
  // >= 0: score the prompt too, this many alternatives per position (raw logprobs, as `logprobs`); then
  // max_tokens may be 0 (the prompt alone: prefill only, nothing drawn)
  int prompt_logprobs = -1;
  // An embedding request (pooling != NONE; n 1, max_tokens 0, no prompt_logprobs): prefill only, its one
  // output carries the pooled final-norm state, L2-normalised when `normalize`.
  Pooling pooling = Pooling::NONE;
  bool normalize = true;
  // A constraint in its initial state (compiled beforehand, off the engine thread): each sample draws under
  // its own clone; the request never advances this one, so one compiled grammar serves many requests.
  std::shared_ptr<const Matcher> grammar;
  // Requests with different salts share no cached block (BlockManager::salted_root); "" is the shared cache.
  std::string cache_salt;
  int priority = 0;              // lower is served first (scheduler.h)
  bool return_progress = false;  // a progress output (StepOutput::progress) after each step computing its prompt
  bool write_through = false;    // with a disk tier: the prompt's full blocks are saved once computed
};

struct StepOutput {
  std::string id;
  int32_t token = -1;                              // the token drawn this step (-1: none, e.g. aborted)
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;
  std::string finish_reason;                       // "", "stop", "length" or "abort"
  int n_prompt = 0;
  int index = 0;                                   // which of the request's n samples
  // CLOCK_MONOTONIC seconds (Python's time.monotonic()): the start of the step that first scheduled the
  // sequence (0: never scheduled), and the end of the forward pass of the step that produced this output.
  double scheduled_ts = 0.0;
  double step_ts = 0.0;
  int n_cached = 0;                                // prompt tokens served from the prefix cache
  std::vector<float> embedding;                    // an embedding request's output: the pooled vector [n_embd]
                                                   // (RANK: [1], the relevance score, Model::rank)
  // On a request's first output (one per request, not per sample): the prompt's positions 1 … n_prompt - 1,
  // each the prompt token's logprob and its top alternatives (SampleResult's fields)
  std::shared_ptr<const std::vector<SampleResult>> prompt_logprobs;
  // A progress output (Request::return_progress; no token, no finish): the prompt tokens computed so far, the
  // cached ones included, after a step that computed some of them (n_prompt once the prompt is done). Else 0.
  int progress = 0;
};

struct EngineStats {
  int running = 0, waiting = 0;
  int blocks_total = 0, blocks_used = 0;
  uint64_t preemptions = 0, steps = 0, tokens_computed = 0;
  uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // tokens looked up at admission, tokens found
  int blocks_cached = 0;                                      // cached blocks no sequence holds (reusable)
  int state_slots_total = 0, state_slots_used = 0;            // hybrid models' recurrent state slots (else 0)
  int64_t state_slot_bytes = 0;                               // one slot's memory (every recurrent layer's state)
  int64_t kv_cache_bytes = 0;                                 // the KV pool: blocks_total × bytes per block (its dtype)
  int64_t state_bytes = 0;                                    // the recurrent state: its slots and checkpoints
  int state_checkpoints = 0, state_checkpoints_total = 0;     // checkpoints held, room for (hybrid prefix cache)
  uint64_t state_checkpoint_restores = 0;                     // admissions that resumed from one
  int64_t grammar_matchers = 0;                               // live matchers in the process (Matcher::live)
  std::array<double, 2> step_cost{};                          // StepCostModel's floor (s) and rate (s per GMAC)
  double last_step_s = 0.0;                                   // wall time of the last step
  // every step's wall time (schedule → forward → sampling), cumulative per bucket ≤ kStepBuckets[i] (s)
  std::array<uint64_t, 14> step_buckets{};
  double step_seconds_sum = 0.0;
  // speculative decoding: drafts verified, tokens they held, and of those the ones the model agreed with
  uint64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;
  uint64_t mtp_guesses = 0;                                   // MTP drafting: guesses made (output-head rows)
  std::vector<double> row_costs;                              // RowCosts::seconds (empty: speculation off)
  DiskTierStats disk;                                         // the disk tier's (zeros without one)
};

// Upper bounds (seconds) of the step-time histogram's buckets; one more, +inf, is `steps`.
constexpr std::array<double, 14> kStepBuckets = {0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03,
                                                 0.04,  0.05,   0.075, 0.1,  0.15,  0.25, 0.5};

class Engine {
 public:
  // Loads the model. Throws GGUFError / ModelError with the file and what is wrong. calibrate=false leaves
  // the step-cost calibration (a second of scratch forwards) to a later calibrate(): a loader can then do
  // other work beside the weights' load without that work skewing (and slowing) the timed forwards.
  // packed_path: a packed-weights file to map (Model's packed_path; "": pack them).
  Engine(const std::string& path, const EngineConfig& cfg, bool calibrate = true, const std::string& packed_path = "");
  // The load's timed scratch forwards (target_itl > 0: the step-cost model; speculative_ngram > 0: the row
  // costs). The constructor runs it unless told not to; once, before the first step (no-op afterwards).
  void calibrate_costs();
  // Instead of calibrate_costs: the figures a past calibration of the same model, options and machine gave
  // (calibration()), refitted on every step as measured ones are. Throws std::invalid_argument (nothing set)
  // when they do not fit these options: step_weights [floor s, s per GMAC] (target_itl > 0, else empty),
  // row_costs as RowCosts::seconds (speculative_ngram > 0, else empty).
  void seed_costs(const std::vector<double>& step_weights, const std::vector<double>& row_costs);
  // What calibrate_costs measured (or seed_costs set): {step_weights, row_costs}, each empty where off.
  std::pair<std::vector<double>, std::vector<double>> calibration() const;
  ~Engine();

  const HParams& hparams() const { return model_->hparams(); }
  const GGUFFile& file() const { return *file_; }
  const EngineConfig& config() const { return cfg_; }
  Model& model() { return *model_; }  // for its packed weights (packed_from_file, save_packed): fixed at load
  std::vector<int32_t> eos_ids() const { return eos_ids_; }
  void set_eos_ids(std::vector<int32_t> ids) { eos_ids_ = std::move(ids); }

  // Every rule a request must pass: a non-empty prompt of ids in the vocabulary, max_tokens >= 1 (>= 0 with
  // prompt_logprobs; 0 for an embedding), n in [1, max_num_seqs] (1 for an embedding), prompt_logprobs <=
  // n_vocab (none for an embedding), a grammar compiled for this vocabulary (none for an embedding), prompt + max_tokens within n_ctx, prompt + n × max_tokens within the KV
  // pool, the sampling parameters (check_sampling), stop_token_ids in the vocabulary. Throws std::invalid_argument
  // whose message starts with the field's name ("prompt: token id 300000 is outside the vocabulary …").
  // Thread-safe (reads only what is fixed at construction); queues nothing.
  void check(const Request& req) const;
  // check(), then enqueues; throws std::invalid_argument as check() does, and for an id already live.
  void add(Request req);
  // Removes the request (index < 0: all its samples; else that sample) wherever it is; its blocks are free
  // before the next step. Unknown ids: no-op.
  void abort(const std::string& id, int index = -1);
  // One schedule → forward → sample step. Returns one output per request that drew a token or finished.
  std::vector<StepOutput> step();
  bool has_work();  // thread-safe
  // With a disk tier: saves every cached block no request holds and waits for the writes (a server's
  // shutdown; the destructor does it too). Call between steps. No-op without one.
  void persist_kv_cache();
  // Ends every request with finish_reason "error: <what>" and frees its blocks (after a failed step).
  std::vector<StepOutput> fail_all(const std::string& what);
  EngineStats stats();  // thread-safe: a snapshot taken at the end of the last step
  // With speculation: whether drafted rows are priced on the measured forward times (the default), or every
  // row that fits is taken (drafting then depends on the tokens alone, not on timings: for tests). Call
  // between steps.
  void set_price_drafts(bool on) { scheduler_->set_row_costs(on && cfg_.speculative_ngram > 0 ? &row_costs_ : nullptr); }
  // With speculation: drafted rows priced on these forward times, [r] = seconds of r rows (seconds[0] = 0,
  // non-decreasing, at most spec_rows + 1 entries), held fixed instead of followed — a fixed cost model, so what
  // is drafted depends on the tokens alone (for tests of the pricing). Throws std::invalid_argument otherwise.
  void set_row_costs(const std::vector<double>& seconds);

  // Logits of positions `rows` (all when empty) of a fresh sequence, for scoring and tests:
  // [rows × n_vocab]. Uses free blocks without going through the scheduler; call between steps. Throws
  // std::invalid_argument for a token id outside the vocabulary ("tokens: token id …") or a bad row.
  std::vector<float> prompt_logits(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows);
  // MTP drafting: the MTP layer's logits over a fresh sequence, row t (t = 0 … T - 2) joining the target's
  // state at t with tokens[t + 1] — [(T - 1) × n_vocab], each a guess at tokens[t + 2]. For tests; throws as
  // prompt_logits, and std::invalid_argument where the engine does not draft by MTP.
  std::vector<float> mtp_logits(const std::vector<int32_t>& tokens);

 private:
  void apply_pending(std::vector<StepOutput>& out);
  void abort_now(const std::string& id, int index, const std::string& reason, std::vector<StepOutput>& out);
  // Why seq ends once `token` is its next token and it holds n_tokens tokens ("" if it goes on): reads only
  // what is fixed while it runs, so the verification of a draft may call it on the pool.
  std::string finish_reason(const Sequence& seq, int32_t token, int n_tokens, const std::string& grammar_end) const;
  void propose_drafts();
  void propose_draft(Sequence* seq);
  // MTP drafting: after the draws, the MTP layer runs over this step's rows whose next token is known (its
  // K/V for every position, as the target's) and guesses each decoding sequence's token after its pending one.
  struct MtpRows {
    Sequence* seq;
    int pos0, n, row0;  // positions [pos0, pos0 + n) of this step, at rows [row0, row0 + n) of the forward
  };
  void draft_by_mtp();
  bool mtp_guess_worth(const Sequence& d) const;
  std::vector<float> scratch_logits(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows, bool mtp);
  void scratch_mtp(const Batch& target, std::vector<float>& logits);
  std::vector<SampleResult> verify(Sequence* seq, const float* logits) const;
  void apply_draw(Sequence* seq, std::vector<SampleResult>& results, double t_step, std::vector<StepOutput>& out);
  void check_kind(const Request& req) const;  // the rules that differ between generation, scoring, embedding
  void check_size(const Request& req) const;  // context length and KV pool
  void build_batch(const Schedule& sched);
  void init_recurrent(const HParams& hp, const KVGeometry& geo);  // the state pool of a hybrid model
  void init_disk(const std::string& path);    // the disk tier (kv_cache_dir), keyed by the file and the layout
  void record_rows(const Schedule& sched);    // what the prompt rows of this forward give (embeddings, scores)
  std::vector<std::pair<Sequence*, const float*>> computed(const Schedule& sched, double t_step,
                                                           std::vector<StepOutput>& out);
  void score_rows(Sequence* seq, const float* hidden, int first, int end);
  void end_prefill(Sequence* seq, double t_step, std::vector<StepOutput>& out);
  void sample_draws(std::vector<std::pair<Sequence*, const float*>>& draws, double t_step, std::vector<StepOutput>& out);
  void snapshot_stats();
  void calibrate();                           // a few scratch forwards seed the step-cost model
  void calibrate_rows();                      // and measure the row costs drafted rows are priced on
  StepShape shape_of(const Schedule& sched) const;

  EngineConfig cfg_;
  std::shared_ptr<GGUFFile> file_;
  std::unique_ptr<Model> model_;
  std::shared_ptr<ThreadPool> pool_;  // shared with the process's other engines of its size
  std::unique_ptr<KVCache> kv_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<RecurrentStatePool> states_;  // hybrid models: a state slot per seat (max_num_seqs), else null
  std::unique_ptr<StateCheckpoints> checkpoints_;  // hybrid models with prefix caching: states at block boundaries
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<DiskBlocks> disk_;           // the prefix cache's disk tier (kv_cache_dir), else null
  std::vector<int32_t> eos_ids_;
  std::unique_ptr<SequenceGroups> groups_;  // the live requests' sequences; owned by the step thread

  std::mutex mu_;                              // guards the two inboxes and the id set below
  std::vector<std::unique_ptr<Sequence>> inbox_add_;
  std::vector<std::pair<std::string, int>> inbox_abort_;
  std::map<std::string, int> live_ids_;        // ids added and not yet finished
  EngineStats stats_;

  Batch batch_;
  std::vector<float> logits_;
  std::vector<float> hidden_;                  // [batch_.hidden_rows × n_embd] of the last forward
  // MTP drafting: every row's final-norm state follows the recorded rows in hidden_, from row mtp_hidden0_
  size_t mtp_hidden0_ = 0;
  std::vector<MtpRows> mtp_rows_;              // this step's, of sequences still running after the draws
  Batch mtp_batch_;
  std::vector<float> mtp_target_, mtp_logits_;  // [rows × n_embd] its target states, [drafts × n_vocab]
  std::vector<float> score_logits_;            // [≤ kScoreRows × n_vocab]: prompt rows' logits, a slice at a time
  std::vector<ScoreScratch> score_scratch_;    // per thread
  uint64_t steps_ = 0, tokens_computed_ = 0;
  StepCostModel cost_;
  bool calibrated_ = false;                    // calibrate_costs ran (or the constructor ran it)
  bool follow_row_costs_ = true;               // false once set_row_costs fixed them
  RowCosts row_costs_;                         // with speculative decoding: what steps of 1 … 8 rows take
  double last_step_s_ = 0.0;
  std::array<uint64_t, 14> step_buckets_{};  // as EngineStats::step_buckets
  double step_seconds_sum_ = 0.0;
  uint64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;
  uint64_t mtp_guesses_ = 0;
};

}  // namespace pyserve
