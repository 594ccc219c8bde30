// ngram_draft: speculative drafting by prompt lookup, per sequence, no draft model.
//
// NgramIndex maps every n-gram (n = 1 … kMaxNgram) of a sequence's tokens to the position right after its
// latest occurrence. propose() takes the longest suffix of the tokens that occurred before and returns the
// tokens that followed it there, copying on past the end of the tokens into the draft itself (an earlier
// occurrence that overlaps the suffix repeats: "a b a b" drafts "a b a b …"). Cost: kMaxNgram hash updates
// per token, indexed incrementally (extend() looks only at the tokens appended since its last call), and
// kMaxNgram lookups per proposal — never a scan of the text.
//
// DraftPolicy: how many tokens a sequence drafts next, from what its last drafts had accepted (k grows while
// every drafted token is accepted, shrinks to just past what was; after misses in a row it pauses drafting,
// for longer each time), so a sequence whose text does not copy stops paying for verification rows.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pyserve {

class NgramIndex {
 public:
  static constexpr int kMaxNgram = 4;  // longest suffix looked up, in tokens

  // Indexes tokens[indexed, size): registers each n-gram that ends before a token now present.
  void extend(const std::vector<int32_t>& tokens);
  // Up to k tokens that followed the latest earlier occurrence of the longest suffix of `tokens` (as indexed
  // by extend(tokens) just before); empty when not even the last token occurred earlier.
  std::vector<int32_t> propose(const std::vector<int32_t>& tokens, int k) const;
  int indexed() const { return indexed_; }

 private:
  static uint64_t key(const int32_t* gram, int n);
  std::unordered_map<uint64_t, int32_t> follower_;  // key(n-gram) → position after its latest occurrence
  int indexed_ = 0;                                 // followers registered for positions [1, indexed_)
};

class DraftPolicy {
 public:
  static constexpr int kFirst = 3;     // the first draft's length (at most k_max)
  static constexpr int kMisses = 2;    // drafts in a row with nothing accepted before a pause
  static constexpr int kMaxPause = 64; // steps, the longest pause

  // This step's draft length, in [0, k_max]; 0 while paused (each call counts a paused step down).
  int want(int k_max);
  // A draft of `drafted` tokens (> 0) of which the first `accepted` were accepted.
  void observe(int drafted, int accepted, int k_max);

 private:
  int k_ = 0;        // the next draft's length (0: none yet)
  int misses_ = 0;   // drafts in a row with nothing accepted
  int pause_ = 0;    // steps left without drafting
  int backoff_ = 1;  // the next pause's length (steps)
};

}  // namespace pyserve
