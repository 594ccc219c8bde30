// recurrent_state: the per-sequence state of a hybrid model's recurrent layers (Gated DeltaNet: a short conv's
// last inputs and a matrix per value head; LFM2's short convs: their last inputs only, no matrix), a resource
// beside the KV blocks. A sequence holds one slot from
// admission until it finishes, is aborted or preempted (where its KV blocks are freed); an n > 1 request
// reserves a slot per sample at admission and its forks take them, copying the parent's state.
//
// The pool's size is fixed at construction (its own budget); memory is allocated untouched (calloc) and a
// slot's pages become resident when first used. acquire() hands out a zeroed slot or -1 when none is free
// (the scheduler admits nothing then); the accessors are unchecked beyond a debug assert.
//
// Speculative decoding takes slots from the same pool for the state after each drafted row but the last of a
// step (Sequence::draft_slots), written by the forward (Batch::snapshots) and handed back at the step's
// verification: the engine sizes the pool max_num_seqs + spec_rows - 1 then, since a step drafts at most
// spec_rows - 1 rows in all.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace pyserve {

class RecurrentStatePool {
 public:
  // n_slots slots, each with n_layers recurrent layers of conv_floats + mat_floats floats.
  RecurrentStatePool(int n_slots, int n_layers, int64_t conv_floats, int64_t mat_floats);

  int acquire(bool zeroed = true);  // a free slot (zeroed, or as its last holder left it: to be overwritten), or -1
  void release(int slot);      // back to the free list (slot < 0: nothing)
  void copy(int src, int dst); // dst's state = src's (an n > 1 fork)
  // dst's state = other's slot src (a pool of the same layout: state checkpoints)
  void copy_from(const RecurrentStatePool& other, int src, int dst);
  float* conv(int slot, int layer);  // [d_conv - 1][conv_dim]: the conv's last inputs, oldest first
  float* mat(int slot, int layer);   // [n_v_heads][head_k][head_v]: each value head's state matrix, transposed (delta_rule.h)

  int num_slots() const { return n_slots_; }
  int num_free() const { return (int)free_.size(); }
  int num_used() const { return n_slots_ - num_free(); }
  int64_t slot_bytes() const { return slot_floats_ * (int64_t)sizeof(float); }
  // One slot's bytes for this layout, before a pool is made (the KV geometry's budget).
  static int64_t slot_bytes(int n_layers, int64_t conv_floats, int64_t mat_floats) {
    return (int64_t)n_layers * (conv_floats + mat_floats) * (int64_t)sizeof(float);
  }
  int64_t bytes() const { return slot_bytes() * n_slots_; }

 private:
  float* slot(int s) { return data_.get() + (int64_t)s * slot_floats_; }
  const float* slot(int s) const { return data_.get() + (int64_t)s * slot_floats_; }
  struct Free { void operator()(float* p) const { std::free(p); } };
  int n_slots_, n_layers_;
  int64_t conv_floats_, mat_floats_, slot_floats_;
  std::unique_ptr<float, Free> data_;  // [n_slots][n_layers][conv_floats + mat_floats]
  std::vector<int> free_;              // stack of free slots
  std::vector<uint8_t> used_;          // [n_slots]: 1 while handed out (a double release is an error)
};

}  // namespace pyserve
