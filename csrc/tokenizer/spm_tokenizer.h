// spm_tokenizer: text -> token ids for SentencePiece-BPE vocabularies (tokenizer.ggml.model "llama": gemma 1-3,
// llama 2, mistral, phi-3), built in a few milliseconds from the token texts, types and scores.
//
// It is the native twin of the `tokenizers` pipeline that pyserve/engine/hf_tokenizer.py builds for these
// vocabularies (merges derived from the scores; ~0.6 s to construct for Gemma 3's 262k tokens), and gives the
// same ids (tests/models/test_spm_tokenizer.py holds them together over the vocabulary fixtures and random text):
//   1. added tokens are cut out of the raw text, leftmost-longest over all of them; a special one (control or
//      unknown) is left as text unless parse_special, and its span is not searched again for shorter ones; one
//      with rstrip also takes the whitespace after it (phi-3).
//   2. each stretch of text between them becomes one word: a leading "▁" when add_space_prefix, spaces as "▁";
//      its characters are the first symbols (a character that is no token: its bytes as <0xNN> tokens with
//      byte fallback, else the unknown token).
//   3. adjacent symbols merge while some pair of NORMAL tokens concatenates to a NORMAL token; the best pair
//      first: the merged token's score (higher), then its id (lower), then the longer left part, then the
//      earlier position -- the rank order of the derived merges, applied with the same queue and staleness
//      rule as `tokenizers`' BPE word (so even its tie-breaks agree).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pyserve {

struct SpmAddedToken {
  int32_t id;
  bool special;  // control / unknown: matched only with parse_special
  bool rstrip;   // swallows the whitespace after it
};

struct SpmVocabSpec {
  std::vector<std::string> tokens;   // [n_vocab] UTF-8 texts ("▁" for a space), unique, non-empty
  std::vector<float> scores;         // [n_vocab], or empty: all 0
  std::vector<uint8_t> types;        // [n_vocab] GGUF token types (1 = NORMAL: the only ones merges make or use)
  std::vector<SpmAddedToken> added;  // cut out of the raw text before anything else
  int32_t unk_id = -1;               // -1: none
  bool byte_fallback = false;        // the 256 <0xNN> tokens stand in for a character that is no token
  bool add_space_prefix = false;
};

class SpmTokenizer {
 public:
  // Throws std::invalid_argument naming the field for lengths that differ, duplicate or empty texts, ids out of
  // range, or byte_fallback without all 256 byte tokens.
  explicit SpmTokenizer(SpmVocabSpec spec);

  // The ids of `text` (UTF-8), without BOS/EOS. Throws std::invalid_argument when a character is no token and
  // there is neither byte fallback nor an unknown token. Thread-safe (const).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  int32_t token_to_id(std::string_view text) const;  // -1: not a token
  size_t n_vocab() const { return spec_.tokens.size(); }

 private:
  struct Pair;  // a candidate merge: its rank key and where
  struct Symbol;

  void build_added_trie();
  size_t longest_added(std::string_view text, size_t pos, int32_t* which) const;  // match length (0: none)
  void encode_word(std::string_view piece, std::vector<int32_t>& out) const;
  void initial_symbols(const std::string& word, std::vector<Symbol>& syms) const;
  bool pair_at(std::string_view word, const std::vector<Symbol>& syms, int left, Pair* p) const;  // false: no merge there

  SpmVocabSpec spec_;
  std::unordered_map<std::string_view, int32_t> id_of_;  // views into spec_.tokens
  int32_t byte_ids_[256];                                // <0xNN> ids when byte_fallback
  // the added tokens' byte trie: child of (node << 8 | byte); node 0 is the root
  std::unordered_map<uint64_t, int32_t> trie_next_;
  std::vector<int32_t> trie_added_;  // [nodes] index into spec_.added ending here, -1: none
  bool first_byte_[256] = {};        // some added token starts with this byte
};

}  // namespace pyserve
