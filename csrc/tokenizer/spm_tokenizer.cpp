// spm_tokenizer.cpp: see spm_tokenizer.h for the rules and the twin they must agree with.
#include "tokenizer/spm_tokenizer.h"

#include <queue>
#include <stdexcept>

namespace pyserve {

namespace {

const char kSpaceMark[] = "\xe2\x96\x81";  // ▁ (U+2581)

// Bytes of the UTF-8 character that starts with `lead` (a stray continuation or invalid byte: 1).
size_t char_len(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

uint32_t decode_char(std::string_view s, size_t pos, size_t len) {
  static const unsigned char kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t c = (unsigned char)s[pos] & kLeadMask[len];
  for (size_t i = 1; i < len && pos + i < s.size(); i++) c = (c << 6) | ((unsigned char)s[pos + i] & 0x3F);
  return c;
}

// Rust's char::is_whitespace (the Unicode White_Space property), which `tokenizers`' rstrip uses.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

size_t utf8_chars(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += char_len((unsigned char)s[i])) n++;
  return n;
}

void check_spec(const SpmVocabSpec& s) {
  const size_t n = s.tokens.size();
  if (n == 0) throw std::invalid_argument("SpmTokenizer: tokens is empty");
  if (s.types.size() != n) throw std::invalid_argument("SpmTokenizer: types and tokens differ in length");
  if (!s.scores.empty() && s.scores.size() != n)
    throw std::invalid_argument("SpmTokenizer: scores and tokens differ in length");
  if (s.unk_id < -1 || s.unk_id >= (int64_t)n) throw std::invalid_argument("SpmTokenizer: unk_id out of range");
  for (const SpmAddedToken& a : s.added)
    if (a.id < 0 || a.id >= (int64_t)n) throw std::invalid_argument("SpmTokenizer: added token id out of range");
}

}  // namespace

struct SpmTokenizer::Symbol {
  int32_t id;
  int32_t prev, next;  // neighbours in the word (-1: none)
  uint32_t start, len;  // bytes of the word it covers (len 0: merged into its left neighbour)
  bool spelled;         // those bytes are its token's text (not so for an unknown token, or one merged from it)
};

struct SpmTokenizer::Pair {
  float score;         // of the merged token (higher first)
  int32_t new_id;      // the merged token (lower first)
  int32_t left_chars;  // characters of the left part (more first)
  int32_t pos;         // the left symbol (earlier first)
  // true when this pair merges after `o` (std::priority_queue keeps the greatest on top)
  bool operator<(const Pair& o) const {
    if (score != o.score) return score < o.score;
    if (new_id != o.new_id) return new_id > o.new_id;
    if (left_chars != o.left_chars) return left_chars < o.left_chars;
    return pos > o.pos;
  }
};

SpmTokenizer::SpmTokenizer(SpmVocabSpec spec) : spec_(std::move(spec)) {
  check_spec(spec_);
  if (spec_.scores.empty()) spec_.scores.assign(spec_.tokens.size(), 0.0f);
  id_of_.reserve(spec_.tokens.size() * 2);
  for (size_t i = 0; i < spec_.tokens.size(); i++) {
    const std::string& t = spec_.tokens[i];
    if (t.empty()) throw std::invalid_argument("SpmTokenizer: token " + std::to_string(i) + " is empty");
    if (!id_of_.emplace(std::string_view(t), (int32_t)i).second)
      throw std::invalid_argument("SpmTokenizer: duplicate token text at id " + std::to_string(i));
  }
  for (int b = 0; b < 256; b++) {
    static const char kHex[] = "0123456789ABCDEF";
    const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    byte_ids_[b] = token_to_id(std::string_view(name, 6));
    if (spec_.byte_fallback && byte_ids_[b] < 0)
      throw std::invalid_argument("SpmTokenizer: byte_fallback without the token for byte " + std::to_string(b));
  }
  build_added_trie();
}

int32_t SpmTokenizer::token_to_id(std::string_view text) const {
  auto it = id_of_.find(text);
  return it == id_of_.end() ? -1 : it->second;
}

// ---- added tokens ----

void SpmTokenizer::build_added_trie() {
  trie_added_.assign(1, -1);
  for (size_t k = 0; k < spec_.added.size(); k++) {
    const std::string& t = spec_.tokens[spec_.added[k].id];
    first_byte_[(unsigned char)t[0]] = true;
    int32_t node = 0;
    for (unsigned char c : t) {
      auto [it, fresh] = trie_next_.emplace(((uint64_t)node << 8) | c, (int32_t)trie_added_.size());
      if (fresh) trie_added_.push_back(-1);
      node = it->second;
    }
    trie_added_[node] = (int32_t)k;
  }
}

size_t SpmTokenizer::longest_added(std::string_view text, size_t pos, int32_t* which) const {
  if (!first_byte_[(unsigned char)text[pos]]) return 0;
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); i++) {
    auto it = trie_next_.find(((uint64_t)node << 8) | (unsigned char)text[i]);
    if (it == trie_next_.end()) break;
    node = it->second;
    if (trie_added_[node] >= 0) best = i + 1 - pos, *which = trie_added_[node];
  }
  return best;
}

// `tokenizers`' AddedVocabulary split, step by step: a non-overlapping leftmost-longest scan; a skipped special
// match still moves the scan past it; rstrip widens the token's span but not the scan.
std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  size_t start_offset = 0, pos = 0;
  while (pos < text.size()) {
    int32_t k = -1;
    const size_t len = longest_added(text, pos, &k);
    if (len == 0) {
      pos++;
      continue;
    }
    const SpmAddedToken& a = spec_.added[k];
    const size_t match_end = pos + len;
    if (a.special && !parse_special) {
      pos = match_end;
      continue;
    }
    size_t stop = match_end;
    while (a.rstrip && stop < text.size()) {
      const size_t cl = char_len((unsigned char)text[stop]);
      if (!is_white_space(decode_char(text, stop, cl))) break;
      stop += cl;
    }
    if (start_offset < pos) encode_word(text.substr(start_offset, pos - start_offset), out);
    out.push_back(a.id);
    start_offset = stop;
    pos = match_end;
  }
  if (start_offset < text.size()) encode_word(text.substr(start_offset), out);
  return out;
}

// ---- one word: normalise, then BPE ----

void SpmTokenizer::initial_symbols(const std::string& word, std::vector<Symbol>& syms) const {
  auto add = [&](int32_t id, size_t start, size_t len) {
    const int32_t i = (int32_t)syms.size();
    syms.push_back({id, i - 1, i + 1, (uint32_t)start, (uint32_t)len, id != spec_.unk_id});
  };
  int32_t unk_start = -1;  // a pending unknown token's first byte (they are added once the next known char comes)
  for (size_t i = 0; i < word.size();) {
    const size_t cl = std::min(char_len((unsigned char)word[i]), word.size() - i);
    const int32_t id = token_to_id(std::string_view(word).substr(i, cl));
    if (id >= 0 || spec_.byte_fallback) {
      if (unk_start >= 0) add(spec_.unk_id, unk_start, i - unk_start), unk_start = -1;
      if (id >= 0) add(id, i, cl);
      else
        for (size_t b = i; b < i + cl; b++) add(byte_ids_[(unsigned char)word[b]], b, 1);
    } else {
      if (spec_.unk_id < 0)
        throw std::invalid_argument("SpmTokenizer: a character is not in the vocabulary, and there is no "
                                    "byte fallback or unknown token");
      if (unk_start >= 0) add(spec_.unk_id, unk_start, i - unk_start);
      unk_start = (int32_t)i;
    }
    i += cl;
  }
  if (unk_start >= 0) add(spec_.unk_id, unk_start, word.size() - unk_start);
  if (!syms.empty()) syms.back().next = -1;
}

bool SpmTokenizer::pair_at(std::string_view word, const std::vector<Symbol>& syms, int left, Pair* p) const {
  const Symbol& a = syms[left];
  if (a.next < 0) return false;
  const Symbol& b = syms[a.next];
  if (spec_.types[a.id] != 1 || spec_.types[b.id] != 1) return false;
  // looked up by the tokens' texts (as `tokenizers` looks a pair up by ids): the word's bytes where they spell
  // them, else joined (an unknown token covers a character but is named "<unk>", and some file types it NORMAL)
  std::string joined;
  if (!a.spelled || !b.spelled) joined = spec_.tokens[a.id] + spec_.tokens[b.id];
  const std::string_view both = joined.empty() ? word.substr(a.start, a.len + b.len) : std::string_view(joined);
  const int32_t id = token_to_id(both);
  if (id < 0 || spec_.types[id] != 1) return false;
  const size_t left_len = joined.empty() ? a.len : spec_.tokens[a.id].size();
  *p = {spec_.scores[id], id, (int32_t)utf8_chars(both.substr(0, left_len)), left};
  return true;
}

void SpmTokenizer::encode_word(std::string_view piece, std::vector<int32_t>& out) const {
  std::string word = spec_.add_space_prefix ? kSpaceMark : "";
  for (char c : piece)
    if (c == ' ') word.append(kSpaceMark);
    else word.push_back(c);
  std::vector<Symbol> syms;
  initial_symbols(word, syms);
  std::priority_queue<Pair> queue;
  Pair p;
  for (int i = 0; i + 1 < (int)syms.size(); i++)
    if (pair_at(word, syms, i, &p)) queue.push(p);
  while (!queue.empty()) {
    const Pair top = queue.top();
    queue.pop();
    Symbol& s = syms[top.pos];
    if (s.len == 0 || s.next < 0) continue;
    if (!pair_at(word, syms, top.pos, &p) || p.new_id != top.new_id) continue;  // stale: the pair changed
    Symbol& right = syms[s.next];
    s.id = top.new_id, s.len += right.len, s.next = right.next, s.spelled = s.spelled && right.spelled;
    right.len = 0;
    if (s.next >= 0) syms[s.next].prev = top.pos;
    if (s.prev >= 0 && pair_at(word, syms, s.prev, &p)) queue.push(p);
    if (pair_at(word, syms, top.pos, &p)) queue.push(p);
  }
  for (const Symbol& s : syms)
    if (s.len) out.push_back(s.id);
}

}  // namespace pyserve
