// ngram_draft: speculative drafting by prompt lookup, per sequence, no draft model.
//
// NgramIndex maps every n-gram (n = 1 … kMaxNgram) of a sequence's tokens to the position right after its
// latest occurrence. propose() takes the longest suffix of the tokens that occurred before and returns the
// tokens that followed it there, copying on past the end of the tokens into the draft itself (an earlier
// occurrence that overlaps the suffix repeats: "a b a b" drafts "a b a b …"). Cost: kMaxNgram hash updates
// per token, indexed incrementally (extend() looks only at the tokens appended since its last call), and
// kMaxNgram lookups per proposal — never a scan of the text.
//
// DraftPolicy: what a sequence's verified drafts say about its next one (below).
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

 private:
  static uint64_t key(const int32_t* gram, int n);
  std::unordered_map<uint64_t, int32_t> follower_;  // key(n-gram) → position after its latest occurrence
  int indexed_ = 0;                                 // followers registered for positions [1, indexed_)
};

// A sequence's estimate of p, the chance that a drafted token is accepted once the ones before it were:
// (accepted + 1) / (accepted + rejected + 2) over its verified drafts (a draft not accepted whole counts one
// rejection), every count fading by kDecay a step. The scheduler drafts the rows whose expected tokens
// (p, p², … for a draft's 1st, 2nd, … token) pay for what they add to the step; a sequence whose drafts
// miss stops drafting, and as its misses fade it tries again — rarely where rows are dear.
class DraftPolicy {
 public:
  static constexpr double kDecay = 0.97;  // per step: evidence ~30 steps old counts a third

  void tick() { accepted_ *= kDecay, rejected_ *= kDecay; }  // once a step, before the proposal
  double p() const { return (accepted_ + 1.0) / (accepted_ + rejected_ + 2.0); }
  // A draft of `drafted` tokens (> 0) whose first `accepted` were accepted.
  void observe(int drafted, int accepted) { accepted_ += accepted, rejected_ += accepted < drafted; }

 private:
  double accepted_ = 0, rejected_ = 0;  // faded counts of accepted tokens and of rejections
};

}  // namespace pyserve
