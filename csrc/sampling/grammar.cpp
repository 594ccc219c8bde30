// grammar: see grammar.h.
#include "sampling/grammar.h"

#include <algorithm>
#include <stdexcept>

#include "sampling/llg_api.h"

namespace pyserve {

std::atomic<int64_t> Matcher::live_{0};

GrammarVocab::GrammarVocab(const std::vector<std::string>& token_bytes, const std::vector<int32_t>& eos_ids) {
  const LlgApi& api = llg();
  if (token_bytes.empty()) throw std::invalid_argument("grammar vocabulary: no tokens");
  if (eos_ids.empty()) throw std::invalid_argument("grammar vocabulary: no end-of-generation id");
  n_vocab_ = (int)token_bytes.size();
  std::vector<uint32_t> lens;
  std::string bytes;
  for (const std::string& t : token_bytes) lens.push_back((uint32_t)t.size()), bytes += t;
  std::vector<uint32_t> eos;
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n_vocab_) throw std::invalid_argument("grammar vocabulary: eos id " + std::to_string(id) +
                                                              " outside [0, " + std::to_string(n_vocab_) + ")");
    eos.push_back((uint32_t)id);
  }
  LlgTokenizerInitV2 init{};
  init.struct_size = sizeof init;
  init.vocab_size = (uint32_t)n_vocab_;
  init.tok_eos = eos[0];
  init.token_lens = lens.data();
  init.token_bytes = reinterpret_cast<const uint8_t*>(bytes.data());
  // llguidance asks a tokenizer only to re-tokenize forced text (fast-forward tokens, which pyserve does not
  // use); masks come from the token bytes alone, so its greedy approximation is enough
  init.use_approximate_greedy_tokenize_fn = true;
  init.tok_eos_extra = eos.data() + 1;
  init.tok_eos_extra_count = (uint32_t)eos.size() - 1;
  char err[1024] = {0};
  tok_ = api.new_tokenizer_v2(&init, err, sizeof err);
  if (!tok_) throw std::invalid_argument(std::string("grammar vocabulary: ") + err);
}

GrammarVocab::~GrammarVocab() { llg().free_tokenizer(tok_); }

Matcher::Matcher(std::shared_ptr<const GrammarVocab> vocab, LlgMatcher* m) : vocab_(std::move(vocab)), m_(m) {
  live_++;
}

Matcher::~Matcher() {
  llg().free_matcher(m_);
  live_--;
}

std::shared_ptr<Matcher> Matcher::compile(std::shared_ptr<const GrammarVocab> vocab, const std::string& kind,
                                          const std::string& data) {
  const LlgApi& api = llg();
  LlgConstraintInit init{};
  api.constraint_init_set_defaults(&init, vocab->get());
  init.log_stderr_level = 0;  // errors come back as exceptions, not on the server's stderr
  std::shared_ptr<Matcher> m(new Matcher(std::move(vocab), api.new_matcher(&init, kind.c_str(), data.c_str())));
  if (api.matcher_is_error(m->m_)) throw std::invalid_argument(m->error());
  if (api.matcher_get_mask_byte_size(m->m_) != (size_t)m->mask_words() * 4)
    throw std::runtime_error("llguidance: mask size " + std::to_string(api.matcher_get_mask_byte_size(m->m_)) +
                             " bytes for a vocabulary of " + std::to_string(m->n_vocab()));
  return m;
}

std::unique_ptr<Matcher> Matcher::clone() const {
  return std::unique_ptr<Matcher>(new Matcher(vocab_, llg().clone_matcher(m_)));
}

bool Matcher::compute_mask(uint32_t* mask) {
  return llg().matcher_compute_mask_into(m_, mask, (size_t)mask_words() * 4) == 0;
}

bool Matcher::consume(int32_t token) {
  return token >= 0 && token < n_vocab() && llg().matcher_consume_token(m_, (uint32_t)token) == 0;
}

bool Matcher::rollback(int n_tokens) { return n_tokens >= 0 && llg().matcher_rollback(m_, (size_t)n_tokens) == 0; }
int Matcher::validate(const int32_t* tokens, int n) {
  if (n <= 0) return 0;
  std::vector<uint32_t> ids(tokens, tokens + n);
  return std::max(0, (int)llg().matcher_validate_tokens(m_, ids.data(), ids.size()));
}
bool Matcher::accepting() { return llg().matcher_is_accepting(m_); }
bool Matcher::stopped() const { return llg().matcher_is_stopped(m_); }

std::string Matcher::error() {
  const char* e = llg().matcher_get_error(m_);
  return e ? e : "";
}

int64_t Matcher::live() { return live_.load(); }

}  // namespace pyserve
