#include "engine/engine.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

namespace pyserve {

namespace {

// steady_clock is CLOCK_MONOTONIC on Linux: the clock of Python's time.monotonic().
double monotonic_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int kScoreRows = 32;  // prompt rows projected at a time: bounds score_logits_ to 32 × n_vocab floats


// An embedding's vector: the last row, or the mean of the rows; L2-normalised when asked (in double).
std::vector<float> pooled_vector(const Sequence& s) {
  const double n = s.pooling == Pooling::MEAN ? s.n_prompt : 1;
  std::vector<double> v = s.pooled;
  double ss = 0;
  for (double& x : v) {
    x /= n;
    ss += x * x;
  }
  const double scale = s.normalize && ss > 0 ? 1.0 / std::sqrt(ss) : 1.0;
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = (float)(v[i] * scale);
  return out;
}

// An output of seq's sample `index` at time t: no token, no finish reason yet.
StepOutput output_of(const Sequence& s, int index, double t) {
  StepOutput o;
  o.id = s.id;
  o.n_prompt = s.n_prompt;
  o.index = index;
  o.scheduled_ts = s.first_scheduled;
  o.step_ts = t;
  o.n_cached = std::max(0, s.n_cached);
  return o;
}

// The model's multiply-adds per row, per sampled row and per position of attended context.
StepMacs step_macs(const HParams& hp) {
  StepMacs m;
  const std::vector<int> kv = hp.kv_widths();  // per layer (gemma4: its own head width, 0 for shared-KV layers)
  for (int il = 0; il < hp.n_layer; il++) {  // the FFN a token runs: its experts' (and the router) in a MoE layer
    const double qd = (double)hp.n_head * hp.layer_head_dim(il);
    m.per_row += (double)hp.n_embd * (qd + 2.0 * kv[il] + 3.0 * hp.active_ff(il) +
                                      (hp.moe.moe_layer(il) ? hp.moe.n_expert : 0)) + qd * hp.n_embd;
    m.per_context += 2.0 * qd;  // q·k, then weights·v
  }
  m.per_logit = (double)hp.n_embd * hp.n_vocab;
  return m;
}

}  // namespace

void check_config(const EngineConfig& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  need(c.n_threads >= 0, "n_threads must be an integer >= 0 (0: one per core), got " + std::to_string(c.n_threads));
  need(c.n_ctx >= 0, "n_ctx must be an integer >= 0 (0: the model's, at most 8192), got " + std::to_string(c.n_ctx));
  need(c.num_kv_blocks >= 0, "num_kv_blocks must be an integer >= 0 (0: from kv_cache_memory), got " +
                                 std::to_string(c.num_kv_blocks));
  need(c.block_size > 0, "block_size must be positive, got " + std::to_string(c.block_size));
  need(c.max_num_seqs > 0, "max_num_seqs must be positive, got " + std::to_string(c.max_num_seqs));
  need(c.max_num_batched_tokens > 0, "max_num_batched_tokens must be positive, got " + std::to_string(c.max_num_batched_tokens));
  need(c.target_itl >= 0 && std::isfinite(c.target_itl), "target_itl must be >= 0 seconds (0: off)");
  need(c.speculative_ngram >= 0, "speculative_ngram must be an integer >= 0 (0: off), got " + std::to_string(c.speculative_ngram));
  kv_dtype_from_name(c.kv_cache_dtype);
  need(c.speculative_method == "ngram" || c.speculative_method == "mtp",
       "speculative_method must be one of ngram, mtp, got '" + c.speculative_method + "'");
  need(c.kv_cache_disk <= (size_t)INT64_MAX, "kv_cache_disk must be a byte count below 2^63");
}

namespace {

// A q8_0 cache stores each head's K and V rows in whole blocks of 32 values.
void check_kv_widths(const HParams& hp, KVDType dtype) {
  const std::vector<int> w = hp.kv_widths();
  const int blk = kv_dtype_block(dtype);
  for (int il = 0; il < hp.n_layer; il++)
    if (w[il] > 0 && hp.layer_head_dim(il) % blk != 0)
      throw std::invalid_argument("kv_cache_dtype " + std::string(kv_dtype_name(dtype)) + " stores K/V in blocks of " +
                                  std::to_string(blk) + " values: layer " + std::to_string(il) + " has head width " +
                                  std::to_string(hp.layer_head_dim(il)) + " (K/V width " + std::to_string(w[il]) +
                                  "), not a multiple of " + std::to_string(blk) + "; use f16, bf16 or f32");
}

}  // namespace

int KVGeometry::max_model_len() const {
  return (int)std::min<int64_t>(n_ctx, (int64_t)num_kv_blocks * block_size);
}

namespace {

// The state's slots and their size (none without recurrent layers).
void state_slots(const HParams& hp, const EngineConfig& c, KVGeometry& g) {
  if (hp.n_recurrent() == 0) return;
  g.state_slots = c.max_num_seqs + (c.speculative_ngram > 0 ? SchedulerConfig{}.spec_rows - 1 : 0);
  g.state_slot_bytes = RecurrentStatePool::slot_bytes(hp.n_recurrent(), hp.state_conv_floats(), hp.state_mat_floats());
}

// Checkpoints as many as a quarter of kv_bytes holds, between 1 and 2 · max_num_seqs (with prefix caching).
int checkpoints_for(const EngineConfig& c, const KVGeometry& g, int64_t kv_bytes) {
  if (g.state_slots == 0 || !c.enable_prefix_caching) return 0;
  return (int)std::clamp<int64_t>(kv_bytes / 4 / g.state_slot_bytes, 1, 2 * c.max_num_seqs);
}

// kv_cache_memory covers the recurrent state too: its slots first, then checkpoints and KV blocks share the
// rest (the checkpoints at most a quarter of the blocks' bytes).
void blocks_within(const EngineConfig& c, KVGeometry& g) {
  const int64_t rest = (int64_t)c.kv_cache_memory - (int64_t)g.state_slots * g.state_slot_bytes;
  if (rest < (int64_t)g.bytes_per_block)
    throw std::invalid_argument(
        "kv_cache_memory (--kv-cache-memory) of " + std::to_string(c.kv_cache_memory) + " bytes does not hold the " +
        "recurrent state of " + std::to_string(g.state_slots) + " slots (" + std::to_string(g.state_slot_bytes) +
        " bytes each) and one KV block; give more memory or fewer --max-num-seqs");
  g.state_checkpoints = checkpoints_for(c, g, rest * 4 / 5);
  const int64_t kv = rest - (int64_t)g.state_checkpoints * g.state_slot_bytes;
  g.num_kv_blocks = (int)std::min<int64_t>(std::max<int64_t>(1, kv / (int64_t)g.bytes_per_block), INT32_MAX);
}

}  // namespace

KVGeometry kv_geometry(const HParams& hp, const EngineConfig& c) {
  check_config(c);
  KVGeometry g;
  g.n_ctx = c.n_ctx > 0 ? c.n_ctx : std::min(hp.n_ctx_train, 8192);
  g.block_size = c.block_size;
  const KVDType dtype = kv_dtype_from_name(c.kv_cache_dtype);
  check_kv_widths(hp, dtype);
  if (drafts_by_mtp(c) && hp.n_mtp == 0)
    throw std::invalid_argument("speculative_method 'mtp': this " + hp.arch + " file has no MTP (NextN) layers "
                                "(nextn_predict_layers 0); use 'ngram'");
  g.bytes_per_block = KVCache::bytes_per_block(hp.kv_widths(drafts_by_mtp(c)), c.block_size, dtype);
  state_slots(hp, c, g);
  if (c.num_kv_blocks > 0) {
    g.num_kv_blocks = c.num_kv_blocks;
  } else if (c.kv_cache_memory > 0) {
    blocks_within(c, g);  // the checkpoints too
    return g;
  } else {  // 512 MiB of blocks (the state beside them), and at least one full context
    const size_t by_memory = (512ull << 20) / g.bytes_per_block;
    const size_t for_ctx = ((size_t)g.n_ctx + c.block_size - 1) / c.block_size;
    g.num_kv_blocks = (int)std::min<size_t>(std::max(by_memory, for_ctx), INT32_MAX);
  }
  g.state_checkpoints = checkpoints_for(c, g, (int64_t)g.num_kv_blocks * (int64_t)g.bytes_per_block);
  return g;
}

Engine::Engine(const std::string& path, const EngineConfig& cfg, bool calibrate, const std::string& packed_path)
    : cfg_(cfg) {
  file_ = std::make_shared<GGUFFile>(path);
  if (drafts_by_mtp(cfg_)) kv_geometry(read_hparams(*file_), cfg_);  // a file without MTP layers: said as such
  model_ = std::make_unique<Model>(file_, drafts_by_mtp(cfg_), packed_path);
  const HParams& hp = model_->hparams();
  const KVGeometry geo = kv_geometry(hp, cfg_);
  cfg_.n_ctx = geo.n_ctx;
  model_->set_context(geo.n_ctx);
  const int nb = geo.num_kv_blocks;
  pool_ = ThreadPool::shared(cfg_.n_threads);
  cfg_.n_threads = pool_->size();
  cfg_.num_kv_blocks = nb;
  kv_ = std::make_unique<KVCache>(hp.kv_widths(drafts_by_mtp(cfg_)), nb, cfg_.block_size, kv_dtype_from_name(cfg_.kv_cache_dtype));
  if (geo.state_slots > 0) init_recurrent(hp, geo);
  blocks_ = std::make_unique<BlockManager>(nb, cfg_.block_size, cfg_.enable_prefix_caching);
  SchedulerConfig sc{cfg_.max_num_seqs, cfg_.max_num_batched_tokens, cfg_.block_size};
  scheduler_ = std::make_unique<Scheduler>(sc, *blocks_);
  scheduler_->set_state_pool(states_.get(), checkpoints_.get());
  if (!cfg_.kv_cache_dir.empty() && cfg_.enable_prefix_caching) init_disk(path);
  groups_ = std::make_unique<SequenceGroups>(*scheduler_, [this](const std::string& id) {
    std::lock_guard<std::mutex> lk(mu_);
    live_ids_.erase(id);
  });
  cost_ = StepCostModel(step_macs(hp));
  if (calibrate) calibrate_costs();
  snapshot_stats();
  int64_t eos = file_->get_int("tokenizer.ggml.eos_token_id", -1);
  if (eos >= 0) eos_ids_.push_back((int32_t)eos);
}

void Engine::seed_costs(const std::vector<double>& step_weights, const std::vector<double>& row_costs) {
  if (calibrated_ || steps_ > 0) throw std::invalid_argument("seed_costs: the engine is calibrated already");
  const bool itl = cfg_.target_itl > 0, spec = cfg_.speculative_ngram > 0;
  const size_t rows = spec ? (size_t)std::min({scheduler_->config().spec_rows, cfg_.n_ctx,
                                               cfg_.num_kv_blocks * cfg_.block_size}) + 1 : 0;
  if (step_weights.size() != (itl ? 2u : 0u) || row_costs.size() != rows)
    throw std::invalid_argument("seed_costs: step_weights or row_costs do not fit these options");
  for (double w : step_weights)
    if (!(w >= 0) || !std::isfinite(w)) throw std::invalid_argument("seed_costs: a step weight is not >= 0");
  for (size_t r = 0; r < row_costs.size(); r++)
    if (!std::isfinite(row_costs[r]) || (r == 0 ? row_costs[r] != 0.0 : !(row_costs[r] >= row_costs[r - 1])))
      throw std::invalid_argument("seed_costs: row_costs must be [0, T(1), ...] not decreasing");
  calibrated_ = true;
  if (itl) {
    cost_.set_weights(step_weights[0], step_weights[1]);
    scheduler_->set_step_target(cfg_.target_itl, &cost_);
  }
  if (spec) {
    row_costs_.seconds = row_costs;
    set_price_drafts(cfg_.speculative_price_drafts);
  }
  snapshot_stats();
}

std::pair<std::vector<double>, std::vector<double>> Engine::calibration() const {
  std::vector<double> w;
  if (cfg_.target_itl > 0) {
    const auto a = cost_.weights();
    w = {a[0], a[1]};
  }
  return {w, cfg_.speculative_ngram > 0 ? row_costs_.seconds : std::vector<double>{}};
}

void Engine::calibrate_costs() {
  if (calibrated_ || steps_ > 0) return;
  calibrated_ = true;
  if (cfg_.target_itl > 0) {
    calibrate();
    scheduler_->set_step_target(cfg_.target_itl, &cost_);
  }
  if (cfg_.speculative_ngram > 0) {
    calibrate_rows();
    set_price_drafts(cfg_.speculative_price_drafts);
  }
  snapshot_stats();
}

Engine::~Engine() {
  try {
    persist_kv_cache();
  } catch (...) {  // a cache: nothing to report from a destructor
  }
}

namespace {

// What makes a disk tier's blocks interchangeable: the model file itself (its real path, size, modification
// time and inode, as the packed-weights cache keys it), the KV dtype, the block size and the layers' widths.
uint64_t kv_layout_key(const std::string& path, const EngineConfig& c, const std::vector<int>& widths) {
  struct stat st {};
  char real[PATH_MAX];
  if (!realpath(path.c_str(), real) || stat(real, &st) != 0)
    throw std::invalid_argument("kv_cache_dir: cannot identify the model file '" + path + "'");
  std::string key = std::string(real) + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) +
                    "." + std::to_string(st.st_mtim.tv_nsec) + "|" + std::to_string(st.st_ino) + "|" +
                    c.kv_cache_dtype + "|" + std::to_string(c.block_size) + "|v1";
  for (int w : widths) key += "," + std::to_string(w);
  std::vector<int32_t> bytes(key.begin(), key.end());
  return BlockManager::hash_block(0x6b76646973ull, bytes.data(), (int)bytes.size());
}

}  // namespace

void Engine::init_disk(const std::string& path) {
  const int64_t max_bytes = cfg_.kv_cache_disk ? (int64_t)cfg_.kv_cache_disk : (int64_t)16 << 30;
  const uint64_t layout = kv_layout_key(path, cfg_, model_->hparams().kv_widths(drafts_by_mtp(cfg_)));
  auto tier = std::make_unique<DiskTier>(cfg_.kv_cache_dir, max_bytes, layout, kv_->block_bytes(), cfg_.block_size);
  disk_ = std::make_unique<DiskBlocks>(*blocks_, *kv_, std::move(tier));
  scheduler_->set_disk(disk_.get());
}

void Engine::persist_kv_cache() {
  if (disk_) disk_->save_cached();
}

// A hybrid model: the recurrent state's slots and checkpoints as kv_geometry sized them — a slot for each of
// the max_num_seqs seats and, with speculation, one for each row a step may draft (the state after each
// drafted row, so a rejected draft rolls back; Sequence::draft_slots); with prefix caching, checkpoints at
// block boundaries (a hit resumes only where one is held: state_checkpoints.h).
void Engine::init_recurrent(const HParams& hp, const KVGeometry& geo) {
  states_ = std::make_unique<RecurrentStatePool>(geo.state_slots, hp.n_recurrent(), hp.state_conv_floats(),
                                                 hp.state_mat_floats());
  if (geo.state_checkpoints > 0)
    checkpoints_ = std::make_unique<StateCheckpoints>(geo.state_checkpoints, hp.n_recurrent(), hp.state_conv_floats(),
                                                      hp.state_mat_floats());
}

void Engine::check(const Request& req) const {
  const int V = model_->hparams().n_vocab;
  if (req.prompt.empty()) throw std::invalid_argument("prompt is empty");
  for (int32_t t : req.prompt) check_token_id("prompt", t, V);
  check_kind(req);
  check_size(req);
  check_sampling(req.sampling, V);
  for (int32_t t : req.stop.stop_token_ids) check_token_id("stop_token_ids", t, V);
  if (req.sampling.min_tokens > req.stop.max_tokens)
    throw std::invalid_argument("min_tokens must be at most max_tokens (" + std::to_string(req.stop.max_tokens) +
                                "), got " + std::to_string(req.sampling.min_tokens));
}

void Engine::check_kind(const Request& req) const {
  const int max_tokens = req.stop.max_tokens, V = model_->hparams().n_vocab;
  if (req.pooling != Pooling::NONE) {
    if (req.n != 1 || max_tokens != 0 || req.prompt_logprobs >= 0 || req.grammar)
      throw std::invalid_argument("pooling: an embedding request has n 1, max_tokens 0, no prompt_logprobs and "
                                  "no grammar");
    if (req.pooling == Pooling::RANK && model_->hparams().n_cls_out == 0)
      throw std::invalid_argument("pooling: this model is not a reranker (no classifier head cls.output.weight)");
    return;
  }
  if (req.grammar && req.grammar->n_vocab() != V)
    throw std::invalid_argument("grammar: compiled for a vocabulary of " + std::to_string(req.grammar->n_vocab()) +
                                " ids, the model has " + std::to_string(V));
  if (req.prompt_logprobs > V)
    throw std::invalid_argument("prompt_logprobs must be <= n_vocab (" + std::to_string(V) + "), got " +
                                std::to_string(req.prompt_logprobs));
  const int least = req.prompt_logprobs >= 0 ? 0 : 1;  // 0: score the prompt alone
  if (max_tokens < least)
    throw std::invalid_argument("max_tokens must be at least " + std::to_string(least) + ", got " +
                                std::to_string(max_tokens) + (least ? " (0 only with prompt_logprobs)" : ""));
  if (req.n < 1 || req.n > cfg_.max_num_seqs)
    throw std::invalid_argument("n must be in [1, max_num_seqs = " + std::to_string(cfg_.max_num_seqs) + "], got " +
                                std::to_string(req.n));
}

void Engine::check_size(const Request& req) const {
  const int n_prompt = (int)req.prompt.size(), max_tokens = req.stop.max_tokens;
  const std::string np = std::to_string(n_prompt), mt = std::to_string(max_tokens);
  const int64_t total = (int64_t)n_prompt + max_tokens;
  const std::string pool = "the KV cache (" + std::to_string((int64_t)cfg_.num_kv_blocks * cfg_.block_size) + " tokens)";
  const int max_len = KVGeometry{cfg_.n_ctx, cfg_.num_kv_blocks, cfg_.block_size, 0}.max_model_len();
  if (total > max_len)
    throw ContextLengthError("prompt (" + np + " tokens)" + (max_tokens ? " + max_tokens (" + mt + ")" : "") +
                                 " exceeds " + (total > cfg_.n_ctx ? "the context length " + std::to_string(cfg_.n_ctx) : pool),
                             max_len, n_prompt, max_tokens);
  // The prompt's full blocks are shared; each sample holds the rest (its copy of a partial last block too).
  // A prefill-only request never forks.
  const int n = max_tokens == 0 ? 1 : req.n;
  const int shared = n_prompt / cfg_.block_size;
  const int64_t need = shared + (int64_t)n * (scheduler_->blocks_needed((int)total) - shared);
  if (need <= cfg_.num_kv_blocks) return;
  const std::string times = std::to_string(n) + " × ";
  throw std::invalid_argument("prompt + " + times + "max_tokens (" + np + " + " + times + mt + " tokens) exceeds " + pool);
}

void Engine::add(Request req) {
  check(req);
  if (req.sampling.min_tokens > 0) {  // what would end the request: EOS (unless ignored) and the stop ids
    auto& banned = req.sampling.min_tokens_banned;
    banned = req.stop.stop_token_ids;
    if (!req.stop.ignore_eos) banned.insert(banned.end(), eos_ids_.begin(), eos_ids_.end());
  }
  const HParams& hp = model_->hparams();
  auto seq = request_sequence(std::move(req.id), std::move(req.prompt), std::move(req.stop), req.n);
  if (req.pooling != Pooling::NONE) {
    // an embedding draws nothing: no sampler
  } else if (req.n == 1) {
    seq->sampler = std::make_unique<Sampler>(req.sampling, hp.n_vocab);
    seq->sampler->set_prompt(seq->tokens);
    if (req.grammar) seq->sampler->set_grammar(req.grammar->clone());
  } else {
    for (int i = 0; i < req.n; i++) {
      SamplingConfig c = req.sampling;
      if (c.seed >= 0) c.seed = (int64_t)(((uint64_t)c.seed + (uint64_t)i) & INT64_MAX);  // seed + i, wrapped in [0, 2^63)
      seq->fork_samplers.push_back(std::make_unique<Sampler>(c, hp.n_vocab));
      seq->fork_samplers.back()->set_prompt(seq->tokens);
      if (req.grammar) seq->fork_samplers.back()->set_grammar(req.grammar->clone());  // each sample its own state
    }
  }
  seq->pooling = req.pooling;
  seq->normalize = req.normalize;
  seq->priority = req.priority;
  seq->return_progress = req.return_progress;
  seq->write_through = req.write_through;
  seq->blocks.root = BlockManager::salted_root(req.cache_salt);
  seq->prompt_logprobs = req.prompt_logprobs;
  if (req.prompt_logprobs >= 0) seq->prompt_lp = std::make_shared<std::vector<SampleResult>>();
  seq->n_recorded = seq->record_begin();
  std::lock_guard<std::mutex> lk(mu_);
  if (live_ids_.count(seq->id)) throw std::invalid_argument("duplicate request id '" + seq->id + "'");
  live_ids_[seq->id] = 1;
  inbox_add_.push_back(std::move(seq));
}

void Engine::abort(const std::string& id, int index) {
  std::lock_guard<std::mutex> lk(mu_);
  inbox_abort_.emplace_back(id, index);
}

void Engine::apply_pending(std::vector<StepOutput>& out) {
  std::vector<std::unique_ptr<Sequence>> adds;
  std::vector<std::pair<std::string, int>> aborts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    adds.swap(inbox_add_);
    aborts.swap(inbox_abort_);
  }
  for (auto& s : adds) groups_->admit(std::move(s));
  for (const auto& [id, index] : aborts) abort_now(id, index, "abort", out);
}

// Ends sample `index` (< 0: every sample) of request id with `reason`, one output per sample ended.
void Engine::abort_now(const std::string& id, int index, const std::string& reason, std::vector<StepOutput>& out) {
  groups_->abort(id, index, [&](const Sequence& seq, int idx) {
    out.push_back(output_of(seq, idx, monotonic_now()));
    out.back().finish_reason = reason;
  });
}

std::string Engine::finish_reason(const Sequence& seq, int32_t token, int n_tokens,
                                  const std::string& grammar_end) const {
  const StopConfig& st = seq.stop;
  auto has = [&](const std::vector<int32_t>& ids) { return std::find(ids.begin(), ids.end(), token) != ids.end(); };
  if (!grammar_end.empty()) return grammar_end;  // the grammar is complete (or its matcher failed)
  if ((!st.ignore_eos && has(eos_ids_)) || has(st.stop_token_ids)) return "stop";
  if (n_tokens - seq.n_prompt >= st.max_tokens || n_tokens >= cfg_.n_ctx) return "length";
  return "";
}

// Before the schedule: each decoding sequence proposes what its n-gram index predicts; the scheduler keeps
// what fits the step. None at all once the decodes alone fill the rows a draft could ride on.
void Engine::propose_drafts() {
  if (cfg_.speculative_ngram <= 0) return;
  const std::vector<Sequence*>& running = scheduler_->running();
  int decodes = 0;
  for (Sequence* seq : running) {
    seq->draft.clear();
    decodes += seq->n_pending() == 1;
  }
  if (decodes >= scheduler_->config().spec_rows) return;
  for (Sequence* seq : running)
    if (seq->n_pending() == 1 && seq->sampler && seq->pending_samples.empty()) propose_draft(seq);
}

// At most K, what max_tokens leaves after the token this step draws anyway, and what the grammar (if any)
// accepts in a row; the scheduler keeps the rows worth their time.
void Engine::propose_draft(Sequence* seq) {
  seq->draft_policy.tick();
  const int k = std::min(cfg_.speculative_ngram, seq->stop.max_tokens - seq->n_generated() - 1);
  if (k <= 0) return;
  if (drafts_by_mtp(cfg_)) {
    if (seq->mtp_at == (int)seq->tokens.size() && seq->mtp_next >= 0) seq->draft = {seq->mtp_next};
  } else {
    seq->ngrams.extend(seq->tokens);
    seq->draft = seq->ngrams.propose(seq->tokens, k);
  }
  seq->draft.resize(seq->sampler->grammar_accepts(seq->draft));
}

std::vector<StepOutput> Engine::step() {
  std::vector<StepOutput> out;
  apply_pending(out);
  const double t_sched = monotonic_now();
  propose_drafts();
  Schedule sched = scheduler_->schedule();
  if (sched.empty()) {
    snapshot_stats();
    return out;
  }
  for (const ScheduledSeq& s : sched.seqs)
    if (s.seq->first_scheduled == 0.0) s.seq->first_scheduled = t_sched;
  for (const BlockCopy& c : sched.copies) kv_->copy_block(c.first, c.second);
  build_batch(sched);
  const StepShape shape = shape_of(sched);  // before the step moves (or frees) its sequences
  const double t_forward = monotonic_now();
  model_->forward(batch_, *kv_, *pool_, logits_, &hidden_, states_.get());
  if (follow_row_costs_ && shape.logit_rows == shape.tokens)  // decodes and drafts alone: what drafted rows are priced on
    row_costs_.observe(shape.tokens, monotonic_now() - t_forward);
  record_rows(sched);
  steps_++;
  tokens_computed_ += batch_.size();
  const double t_step = monotonic_now();
  std::vector<std::pair<Sequence*, const float*>> draws = computed(sched, t_step, out);
  sample_draws(draws, t_step, out);
  draft_by_mtp();
  last_step_s_ = monotonic_now() - t_sched;
  cost_.observe(shape, last_step_s_);
  step_seconds_sum_ += last_step_s_;
  for (size_t i = 0; i < kStepBuckets.size(); i++) step_buckets_[i] += last_step_s_ <= kStepBuckets[i];
  snapshot_stats();
  return out;
}

// After the forward: each scheduled sequence's rows are computed (its drafted ones once verified), prefill-only
// requests end, n > 1 prompts fork. Returns the draws, (sample, its logits rows), in output order.
std::vector<std::pair<Sequence*, const float*>> Engine::computed(const Schedule& sched, double t_step,
                                                                 std::vector<StepOutput>& out) {
  const int V = model_->hparams().n_vocab;
  size_t row = 0;
  int brow = 0;  // the batch row of s's first token
  std::vector<std::pair<Sequence*, const float*>> draws;
  mtp_rows_.clear();
  for (const ScheduledSeq& s : sched.seqs) {
    const int drafted = (int)s.seq->draft.size(), pos0 = s.seq->n_computed;
    // seq, or once an n > 1 prompt is computed every sample (forked): each draws from these logits.
    const bool progress = s.seq->return_progress && pos0 < s.seq->n_prompt;
    const int index = s.seq->pending_samples.empty() ? s.seq->index : s.seq->pending_samples.front();
    const std::vector<Sequence*> drawers = groups_->computed(s);
    if (progress) {  // before the prompt's first token (or its end): the stream sees them in that order
      out.push_back(output_of(*s.seq, index, t_step));
      out.back().progress = std::min(s.seq->n_computed, s.seq->n_prompt);
    }
    if (s.sample && s.seq->prefill_only()) end_prefill(s.seq, t_step, out);
    if (drafts_by_mtp(cfg_) && !s.seq->prefill_only())  // a prompt chunk's rows too: the MTP layer's K/V
      for (Sequence* d : drawers.empty() && !s.sample ? std::vector<Sequence*>{s.seq} : drawers)
        mtp_rows_.push_back({d, pos0, s.n_tokens, brow});
    brow += s.n_tokens;
    if (drawers.empty()) continue;
    const float* logits = logits_.data() + row * V;  // [1 + drafted rows × V]
    row += 1 + drafted;
    for (Sequence* d : drawers) draws.emplace_back(d, logits);
  }
  return draws;
}

StepShape Engine::shape_of(const Schedule& sched) const {
  StepShape s;
  for (const ScheduledSeq& q : sched.seqs) s.add(q.n_tokens, q.seq->n_computed, false);
  s.logit_rows = (int)batch_.logit_rows.size();
  return s;
}


// Two scratch forwards after an unmeasured warm-up (one row; 64 rows, one sampled) seed the step-cost model
// with this machine's floor and rate; the real steps refine both.
void Engine::calibrate() {
  const int32_t tok = model_->hparams().n_vocab > 1 ? 1 : 0;
  const int room = std::min(cfg_.n_ctx, cfg_.num_kv_blocks * cfg_.block_size);
  if (room < 64) return;  // the prior, then the steps
  prompt_logits(std::vector<int32_t>(32, tok), {0});  // pages and caches in
  double t[2];
  StepShape s[2];
  for (int k = 0; k < 2; k++) {
    const int n = k ? 64 : 1;
    s[k].add(n, 0, true);
    const double t0 = monotonic_now();
    prompt_logits(std::vector<int32_t>(n, tok), {n - 1});
    t[k] = monotonic_now() - t0;
  }
  const StepMacs m = step_macs(model_->hparams());
  const double rate = std::max((t[1] - t[0]) / ((s[1].macs(m) - s[0].macs(m)) * 1e-9), 1e-6);
  cost_.set_weights(std::max(t[0] - rate * s[0].macs(m) * 1e-9, 0.0), rate);
}

void Engine::set_row_costs(const std::vector<double>& seconds) {
  if (cfg_.speculative_ngram <= 0) throw std::invalid_argument("row_costs: speculation is off");
  const int most = scheduler_->config().spec_rows + 1;
  if (seconds.size() < 2 || (int)seconds.size() > most || seconds[0] != 0.0)
    throw std::invalid_argument("row_costs: [0, T(1), …] of 2 to " + std::to_string(most) + " entries");
  for (size_t r = 1; r < seconds.size(); r++)
    if (!(seconds[r] >= seconds[r - 1])) throw std::invalid_argument("row_costs: must not decrease");
  row_costs_.seconds = seconds;
  follow_row_costs_ = false;
  scheduler_->set_row_costs(&row_costs_);
  snapshot_stats();  // stats() shows the costs in force at once, not at the end of the next step
}

// RowCosts: a fresh sequence of r tokens, every row projected, the least of three forwards, r = 1 … spec_rows.
void Engine::calibrate_rows() {
  const int rows = std::min({scheduler_->config().spec_rows, cfg_.n_ctx, cfg_.num_kv_blocks * cfg_.block_size});
  const std::vector<int32_t> tokens(std::max(rows, 0), model_->hparams().n_vocab > 1 ? 1 : 0);
  row_costs_.seconds.assign(1, 0.0);
  for (int r = 1; r <= rows; r++) {
    const std::vector<int32_t> t(tokens.begin(), tokens.begin() + r);
    double best = INFINITY;
    for (int k = 0; k < 3; k++) {
      const double t0 = monotonic_now();
      prompt_logits(t, {});
      best = std::min(best, monotonic_now() - t0);
    }
    row_costs_.seconds.push_back(std::max(best, row_costs_.seconds.back()));
  }
}

void Engine::build_batch(const Schedule& sched) {
  batch_.clear();
  for (const ScheduledSeq& s : sched.seqs) {
    Sequence* seq = s.seq;
    const int base = (int)batch_.size() - seq->n_computed;  // the batch row of position p: base + p
    const int n_tokens = (int)seq->tokens.size();
    for (int i = 0; i < s.n_tokens; i++) {
      int p = seq->n_computed + i;
      batch_.tokens.push_back(p < n_tokens ? seq->tokens[p] : seq->draft[p - n_tokens]);  // drafted rows last
      batch_.pos.push_back(p);
      batch_.tables.push_back(&seq->blocks.blocks);
      batch_.slots.push_back(seq->state_slot);
      batch_.snapshots.push_back(i < (int)seq->draft_slots.size() ? seq->draft_slots[i]
                                 : p + 1 == seq->checkpoint_at ? seq->checkpoint_slot : -1);
    }
    const auto [first, end] = seq->rows_to_record(s.n_tokens);
    for (int p = first; p < end; p++) batch_.hidden_rows.push_back(base + p);
    if (s.sample && !seq->prefill_only())  // the last row, and each drafted one: the draws verify them in turn
      for (int r = (int)seq->draft.size(); r >= 0; r--) batch_.logit_rows.push_back((int32_t)batch_.size() - 1 - r);
  }
  mtp_hidden0_ = batch_.hidden_rows.size();
  if (drafts_by_mtp(cfg_))  // every row's state, after the recorded ones: what the MTP layer reads
    for (int r = 0; r < (int)batch_.size(); r++) batch_.hidden_rows.push_back(r);
}

// Each MTP row joins the target's state at position p with the token now known at p + 1 (rejected drafted
// rows have none); a sequence whose last such row holds its pending token gets a guess at the token after it.
void Engine::draft_by_mtp() {
  if (mtp_rows_.empty()) return;
  const int E = model_->hparams().n_embd, V = model_->hparams().n_vocab;
  Batch& b = mtp_batch_;
  b.clear();
  mtp_target_.clear();
  std::vector<Sequence*> guessing;
  for (const MtpRows& m : mtp_rows_) {
    Sequence* d = m.seq;
    const int n = std::min(m.n, (int)d->tokens.size() - 1 - m.pos0);
    for (int i = 0; i < n; i++) {
      b.tokens.push_back(d->tokens[m.pos0 + i + 1]);
      b.pos.push_back(m.pos0 + i);
      b.tables.push_back(&d->blocks.blocks);
      const float* h = hidden_.data() + (mtp_hidden0_ + m.row0 + i) * E;
      mtp_target_.insert(mtp_target_.end(), h, h + E);
    }
    if (n > 0 && m.pos0 + n == (int)d->tokens.size() - 1 && d->sampler && mtp_guess_worth(*d)) {
      b.logit_rows.push_back((int32_t)b.size() - 1);
      guessing.push_back(d);
    }
  }
  model_->draft_forward(b, mtp_target_.data(), *kv_, *pool_, mtp_logits_);
  mtp_guesses_ += guessing.size();
  for (size_t r = 0; r < guessing.size(); r++) {
    const float* l = mtp_logits_.data() + r * V;
    guessing[r]->mtp_next = (int32_t)(std::max_element(l, l + V) - l);
    guessing[r]->mtp_at = (int)guessing[r]->tokens.size();
  }
}

// Whether the MTP layer's guess at d's next token is worth its pass through the output head: whether the
// scheduler would take a one-row draft for a lone stream at the odds d's DraftPolicy gives next step
// (Scheduler::draft_rows). Without a guess the layer's K/V rows are still written; as the policy's rejections
// fade (DraftPolicy::tick) its odds rise and it guesses again.
bool Engine::mtp_guess_worth(const Sequence& d) const {
  const RowCosts* costs = scheduler_->row_costs();
  DraftPolicy next = d.draft_policy;
  next.tick();
  return !costs || costs->worth(next.p(), 1.0, 1, 1);
}

// Before scheduler_->computed: rows_to_record reads n_computed as build_batch did.
void Engine::record_rows(const Schedule& sched) {
  const int E = model_->hparams().n_embd;
  size_t row = 0;
  for (const ScheduledSeq& s : sched.seqs) {
    Sequence* seq = s.seq;
    const auto [first, end] = seq->rows_to_record(s.n_tokens);
    if (first >= end) continue;
    const float* h = hidden_.data() + row * E;
    row += end - first;
    seq->n_recorded = end;
    if (seq->prompt_logprobs >= 0) {
      score_rows(seq, h, first, end);
    } else if (seq->pooling == Pooling::LAST || seq->pooling == Pooling::RANK) {  // its one row, n_prompt - 1
      seq->pooled.assign(h, h + E);
    } else {  // MEAN: summed in position order, whatever the chunks, so chunking cannot change the sum
      seq->pooled.resize(E, 0.0);
      for (int r = 0; r < end - first; r++)
        for (int i = 0; i < E; i++) seq->pooled[i] += h[(size_t)r * E + i];
    }
  }
}

// Prompt rows [first, end) of seq (their final-norm states at `hidden`): each row's logits score the next
// prompt token. Projected kScoreRows at a time, the rows of a slice scored in parallel.
void Engine::score_rows(Sequence* seq, const float* hidden, int first, int end) {
  const int E = model_->hparams().n_embd, V = model_->hparams().n_vocab, k = seq->prompt_logprobs;
  std::vector<SampleResult>& lp = *seq->prompt_lp;  // lp[p] scores token p + 1; holds rows < first already
  score_scratch_.resize(pool_->size());
  for (int p0 = first; p0 < end; p0 += kScoreRows) {
    const int n = std::min(kScoreRows, end - p0);
    model_->project(*pool_, hidden + (size_t)(p0 - first) * E, n, score_logits_);
    lp.resize(p0 + n);
    pool_->run([&](int ith, int nth) {
      const auto [b, e] = ThreadPool::share(n, ith, nth);
      for (int64_t i = b; i < e; i++)
        lp[p0 + i] = score_token(&score_logits_[(size_t)i * V], V, seq->tokens[p0 + i + 1], k, score_scratch_[ith]);
    });
  }
}

// A prefill-only request whose prompt is computed: one final output per sample still pending, then its end.
void Engine::end_prefill(Sequence* seq, double t_step, std::vector<StepOutput>& out) {
  const std::vector<int> idx = seq->pending_samples.empty() ? std::vector<int>{seq->index} : seq->pending_samples;
  const size_t first = out.size();
  const std::string reason = seq->pooling != Pooling::NONE ? "stop" : "length";
  for (int i : idx) {
    out.push_back(output_of(*seq, i, t_step));
    out.back().finish_reason = reason;
  }
  if (seq->pooling == Pooling::RANK) out[first].embedding = {(float)model_->rank(seq->pooled)};
  else if (seq->pooling != Pooling::NONE) out[first].embedding = pooled_vector(*seq);
  out[first].prompt_logprobs = std::move(seq->prompt_lp);
  groups_->finish(seq);
}

void Engine::sample_draws(std::vector<std::pair<Sequence*, const float*>>& draws, double t_step,
                          std::vector<StepOutput>& out) {
  // Each sample owns its sampler (state, RNG): the draws are independent and run on the pool.
  std::vector<std::vector<SampleResult>> results(draws.size());
  pool_->parallel_for((int64_t)draws.size(), [&](int64_t i) { results[i] = verify(draws[i].first, draws[i].second); },
                      INLINE_ROWS);
  for (size_t i = 0; i < draws.size(); i++) apply_draw(draws[i].first, results[i], t_step, out);
}

// seq's draws from logits [1 + draft size × V]: row j's token is drawn exactly as a decode would draw it
// after the j before it, and the next row counts only while each draw equals the drafted token (standard
// speculative acceptance with a point-mass draft: a drafted token stands with the probability the sampler
// gives it; on a mismatch the draw is from the rest of that distribution). Stops where the sequence ends.
std::vector<SampleResult> Engine::verify(Sequence* seq, const float* logits) const {
  std::vector<SampleResult> rs;
  const int V = model_->hparams().n_vocab, n = (int)seq->tokens.size();
  for (size_t j = 0; j <= seq->draft.size(); j++) {
    rs.push_back(seq->sampler->sample(logits + j * V));
    const SampleResult& r = rs.back();
    if (j == seq->draft.size() || r.token != seq->draft[j]) break;
    if (!finish_reason(*seq, r.token, n + (int)rs.size(), r.grammar_end).empty()) break;
  }
  return rs;
}

// The draws become seq's tokens and outputs; a verified draft keeps the K/V of the tokens it got right.
void Engine::apply_draw(Sequence* d, std::vector<SampleResult>& results, double t_step, std::vector<StepOutput>& out) {
  bool ended = false;
  for (SampleResult& r : results) {
    d->tokens.push_back(r.token);
    StepOutput o = output_of(*d, d->index, t_step);
    o.token = r.token;
    o.logprob = r.logprob;
    o.top = std::move(r.top);
    o.prompt_logprobs = std::move(d->prompt_lp);  // the request's first draw: a fork's siblings hold none
    o.finish_reason = finish_reason(*d, r.token, (int)d->tokens.size(), r.grammar_end);
    ended = !o.finish_reason.empty();
    out.push_back(std::move(o));
  }
  if (ended)  // its blocks go with it: no MTP rows
    mtp_rows_.erase(std::remove_if(mtp_rows_.begin(), mtp_rows_.end(), [d](const MtpRows& m) { return m.seq == d; }),
                    mtp_rows_.end());
  const auto [drafted, accepted] = groups_->drawn(d, ended);
  if (drafted) spec_drafts_++, spec_draft_tokens_ += drafted, spec_accepted_tokens_ += accepted;
}

std::vector<StepOutput> Engine::fail_all(const std::string& what) {
  std::vector<StepOutput> out;
  apply_pending(out);
  for (const std::string& id : groups_->ids()) abort_now(id, -1, "error: " + what, out);
  snapshot_stats();
  return out;
}

bool Engine::has_work() {
  std::lock_guard<std::mutex> lk(mu_);
  return !live_ids_.empty() || !inbox_abort_.empty();
}

void Engine::snapshot_stats() {
  EngineStats s;
  s.running = (int)scheduler_->num_running();
  s.waiting = (int)scheduler_->num_waiting();
  s.blocks_total = blocks_->num_blocks();
  s.blocks_used = blocks_->num_used();
  s.blocks_cached = blocks_->num_cached();
  if (disk_) s.disk = disk_->stats();
  s.state_slots_total = states_ ? states_->num_slots() : 0;
  s.state_slots_used = states_ ? states_->num_used() : 0;
  s.state_slot_bytes = states_ ? states_->slot_bytes() : 0;
  s.state_bytes = s.state_slot_bytes * (s.state_slots_total + (checkpoints_ ? checkpoints_->capacity() : 0));
  s.kv_cache_bytes = (int64_t)kv_->bytes();
  s.state_checkpoints = checkpoints_ ? checkpoints_->size() : 0;
  s.state_checkpoints_total = checkpoints_ ? checkpoints_->capacity() : 0;
  s.state_checkpoint_restores = checkpoints_ ? checkpoints_->restored() : 0;
  s.prefix_cache_queries = blocks_->queried_tokens();
  s.prefix_cache_hits = blocks_->hit_tokens();
  s.preemptions = scheduler_->num_preemptions();
  s.steps = steps_;
  s.tokens_computed = tokens_computed_;
  s.grammar_matchers = Matcher::live();
  s.step_cost = cost_.weights();
  s.last_step_s = last_step_s_;
  s.step_buckets = step_buckets_;
  s.step_seconds_sum = step_seconds_sum_;
  s.spec_drafts = spec_drafts_;
  s.spec_draft_tokens = spec_draft_tokens_;
  s.spec_accepted_tokens = spec_accepted_tokens_;
  s.mtp_guesses = mtp_guesses_;
  s.row_costs = row_costs_.seconds;
  std::lock_guard<std::mutex> lk(mu_);
  stats_ = s;
}

EngineStats Engine::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

std::vector<float> Engine::prompt_logits(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows) {
  return scratch_logits(tokens, rows, false);
}

std::vector<float> Engine::mtp_logits(const std::vector<int32_t>& tokens) {
  if (!drafts_by_mtp(cfg_)) throw std::invalid_argument("mtp_logits: the engine does not draft by MTP");
  return scratch_logits(tokens, {}, true);
}

// The target's rows → (mtp) the MTP layer's rows 0 … T - 2, each with the token after it.
void Engine::scratch_mtp(const Batch& target, std::vector<float>& logits) {
  const int T = (int)target.size();
  Batch b;
  for (int t = 0; t + 1 < T; t++) {
    b.tokens.push_back(target.tokens[t + 1]);
    b.pos.push_back(t);
    b.tables.push_back(target.tables[t]);
    b.logit_rows.push_back(t);
  }
  model_->draft_forward(b, hidden_.data(), *kv_, *pool_, logits);
}

std::vector<float> Engine::scratch_logits(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                                          bool mtp) {
  const int T = (int)tokens.size(), bs = cfg_.block_size;
  if (T == 0) return {};
  if (T > cfg_.n_ctx) throw std::invalid_argument("more tokens than the context length");
  for (int32_t t : tokens) check_token_id("tokens", t, model_->hparams().n_vocab);
  int need = (T + bs - 1) / bs;
  if (!blocks_->can_allocate(need)) throw std::runtime_error("not enough free KV blocks");
  const int slot = states_ ? states_->acquire() : -1;
  if (states_ && slot < 0) throw std::runtime_error("no free recurrent state slot");
  std::vector<int32_t> table;
  for (int i = 0; i < need; i++) table.push_back(blocks_->allocate_block());
  Batch b;
  for (int t = 0; t < T; t++) {
    b.tokens.push_back(tokens[t]);
    b.pos.push_back(t);
    b.tables.push_back(&table);
    b.slots.push_back(slot);
    if (rows.empty()) b.logit_rows.push_back(t);
    if (mtp) b.hidden_rows.push_back(t);
  }
  for (int32_t r : rows) {
    if (r < 0 || r >= T) throw std::invalid_argument("row " + std::to_string(r) + " outside the prompt");
    b.logit_rows.push_back(r);
  }
  std::vector<float> logits;
  try {
    model_->forward(b, *kv_, *pool_, logits, mtp ? &hidden_ : nullptr, states_.get());
    if (mtp) scratch_mtp(b, logits);
  } catch (...) {
    for (int blk : table) blocks_->release(blk);
    if (states_) states_->release(slot);
    throw;
  }
  for (int blk : table) blocks_->release(blk);
  if (states_) states_->release(slot);
  return logits;
}

}  // namespace pyserve
