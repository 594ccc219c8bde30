// ngram_draft: see ngram_draft.h.
#include "scheduler/ngram_draft.h"

#include <algorithm>

namespace pyserve {

uint64_t NgramIndex::key(const int32_t* gram, int n) {
  uint64_t h = 0x9e3779b97f4a7c15ull * (uint64_t)n;
  for (int i = 0; i < n; i++) {
    h ^= (uint32_t)gram[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
  }
  return h ^ (h >> 31);
}

void NgramIndex::extend(const std::vector<int32_t>& tokens) {
  const int size = (int)tokens.size();
  for (int i = std::max(indexed_, 1); i < size; i++)
    for (int n = 1; n <= std::min(kMaxNgram, i); n++) follower_[key(&tokens[i - n], n)] = i;
  indexed_ = std::max(indexed_, size);
}

std::vector<int32_t> NgramIndex::propose(const std::vector<int32_t>& tokens, int k) const {
  std::vector<int32_t> draft;
  const int size = (int)tokens.size();
  for (int n = std::min(kMaxNgram, size - 1); n >= 1 && k > 0; n--) {
    const int32_t* suffix = &tokens[size - n];
    auto it = follower_.find(key(suffix, n));
    if (it == follower_.end()) continue;
    const int p = it->second;
    if (p < n || p >= size || !std::equal(suffix, suffix + n, &tokens[p - n])) continue;  // a hash collision
    // tokens ++ draft read as one text: draft[j] = text[p + j], and p + j < size + j, so it is always known
    for (int j = 0; j < k; j++) draft.push_back(p + j < size ? tokens[p + j] : draft[p + j - size]);
    break;
  }
  return draft;
}

}  // namespace pyserve
