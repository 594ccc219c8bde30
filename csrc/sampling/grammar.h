// grammar: constrained decoding (JSON schema, regex, Lark / GBNF grammars) with llguidance's matcher.
//
// A GrammarVocab is llguidance's view of one model's vocabulary, built once per model from the engine's own
// token bytes (special tokens marked with a 0xFF prefix, every end-of-generation id given). A Matcher is one
// compiled constraint in some state: compiled off the engine thread (Python calls Matcher::compile on a
// worker thread, without the GIL), then cloned into each sample's sampler, which computes its mask inside
// the step's parallel sampling loop, applies it and consumes the drawn token (sampler.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct LlgTokenizer;
struct LlgMatcher;

namespace pyserve {

class GrammarVocab {
 public:
  // token_bytes[n_vocab]: what each id writes (a special token: "\xFF" + its name; unused ids: "");
  // eos_ids: the ids that end generation (at least one). Throws std::invalid_argument with llguidance's
  // message for a vocabulary it refuses, std::runtime_error when llguidance is not loaded.
  GrammarVocab(const std::vector<std::string>& token_bytes, const std::vector<int32_t>& eos_ids);
  ~GrammarVocab();
  GrammarVocab(const GrammarVocab&) = delete;
  GrammarVocab& operator=(const GrammarVocab&) = delete;

  int n_vocab() const { return n_vocab_; }
  const LlgTokenizer* get() const { return tok_; }

 private:
  LlgTokenizer* tok_ = nullptr;
  int n_vocab_ = 0;
};

class Matcher {
 public:
  // Compiles `data` as `kind` ("json_schema", "regex", "lark", or "llguidance": a grammar list in JSON) over
  // vocab. Throws std::invalid_argument carrying llguidance's error (a bad schema or regex, an unsupported
  // feature) and std::runtime_error when llguidance is not loaded. Thread-safe.
  static std::shared_ptr<Matcher> compile(std::shared_ptr<const GrammarVocab> vocab, const std::string& kind,
                                          const std::string& data);
  ~Matcher();
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  std::unique_ptr<Matcher> clone() const;  // same state, independent from here on
  int n_vocab() const { return vocab_->n_vocab(); }
  int mask_words() const { return (n_vocab() + 31) / 32; }
  // The ids allowed next, one bit each (bit i % 32 of word i / 32), into mask[mask_words()]. False when the
  // matcher is in its error state (error() says why).
  bool compute_mask(uint32_t* mask);
  // Advances by `token`; false (error state) when the grammar does not allow it.
  bool consume(int32_t token);
  bool rollback(int n_tokens);
  // How many of tokens[0, n) the grammar accepts in a row from this state, which it leaves unchanged
  // (0 in the error state).
  int validate(const int32_t* tokens, int n);
  bool accepting();       // the text so far is a complete match
  bool stopped() const;   // nothing but end-of-generation may follow (also true in the error state)
  std::string error();    // "" unless in the error state

  static int64_t live();  // matchers alive in the process (compiled, cloned, not yet freed): for tests

 private:
  Matcher(std::shared_ptr<const GrammarVocab> vocab, LlgMatcher* m);
  std::shared_ptr<const GrammarVocab> vocab_;  // outlives the matcher: llguidance needs its tokenizer
  LlgMatcher* m_;
  static std::atomic<int64_t> live_;
};

}  // namespace pyserve
