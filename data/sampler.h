// ShardedSampler: per-epoch permutation shared by all ranks, sliced into per-rank batches.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dptrain::data {

// Every rank builds the same permutation of [0, n) from (seed, epoch) and takes, in each step, its
// contiguous chunk of that step's global batch. With g = batch_size * world_size, steps are full
// global batches of g samples in permutation order, so 1 rank with batch N*B sees exactly the
// concatenation of N ranks' batches of B.
//
// The tail of an epoch, with q = n / g and rem = n % g:
//   drop_last:            q steps; the last rem samples of the permutation are skipped.
//   rem == 0:             q steps.
//   rem >= world_size, or q == 0:
//                         q + 1 steps; the last holds the rem samples.
//   0 < rem < world_size, q >= 1 (a last step of rem would leave some ranks empty):
//     batch_size >= 2:    q + 1 steps; the last full batch and the remainder (g + rem samples)
//                         are shared by the last two steps, ceil and floor of half each.
//     batch_size == 1:    q steps; the last step holds g + rem samples, so some ranks get 2
//                         (see max_batch_size()); no split can give every rank >= 1 sample here.
// A step of m samples gives rank r m / W samples, plus one if r < m % W, contiguous in rank order.
// Hence every rank runs the same number of steps, every rank gets >= 1 sample in every step when
// n >= world_size, and without drop_last the ranks together see every sample exactly once per
// epoch. With drop_last, steps_per_epoch() is 0 when n < g: the caller decides if that is an error.
//
// Micro-batch mode (micro_batch > 0, the trainer's distributed.deterministic): a step's samples are
// cut into micro-batches of micro_batch samples in permutation order (the last one of an epoch may
// be shorter), and rank r takes the contiguous run of micro-batches [K r / W, K (r + 1) / W) of the
// step's K. Full steps are then laid out exactly as above (micro_batch divides batch_size); the tail
// is one step of rem samples whichever the world size (dropped with drop_last), so that every step,
// and every micro-batch in it, holds the same samples on any number of ranks with the same
// batch_size * world_size. A rank may get no sample in that last step.
//
// The position is fully described by (seed, epoch, samples of the epoch's permutation consumed):
// a checkpoint records those, and set_epoch(epoch, first_sample) resumes there. The rest of the epoch
// is then laid out by the rule above applied to the n - first_sample remaining samples, so resuming
// at a step boundary with the same global batch replays exactly the steps a straight run takes, and
// a different world size or batch continues from the same sample.
class ShardedSampler {
 public:
  ShardedSampler(int64_t dataset_size, int64_t batch_size, int rank, int world_size, uint64_t seed,
                 bool shuffle, bool drop_last, int64_t micro_batch = 0);

  // Builds this epoch's order from Rng(derive_seed(seed, "epoch<epoch>")) by Fisher-Yates
  // (identity if !shuffle), starting at permutation position first_sample in [0, n). Must be called
  // before batch_indices().
  void set_epoch(int64_t epoch, int64_t first_sample = 0);

  int64_t epoch() const { return epoch_; }  // -1 before the first set_epoch
  // Steps in the current epoch (from its first_sample on); before set_epoch, in a whole epoch.
  int64_t steps_per_epoch() const { return steps_; }
  int64_t dataset_size() const { return n_; }
  // Samples of the current epoch's permutation (all ranks) consumed before `step` begins;
  // step == steps_per_epoch() gives where the epoch ends (n, or less with drop_last).
  int64_t samples_before(int64_t step) const;
  // Largest batch_indices() size over all steps: batch_size, except 2 in the batch_size == 1 fold.
  int64_t max_batch_size() const { return max_batch_; }

  // This rank's dataset indices for a step of the current epoch; a view into the sampler's own
  // permutation (no allocation), valid until the next set_epoch.
  std::span<const int64_t> batch_indices(int64_t step) const;
  // Micro-batch mode: the step's micro-batches (all ranks), and the global index of this rank's first.
  int64_t micro_batches(int64_t step) const;
  int64_t first_micro_batch(int64_t step) const;

 private:
  int64_t n_, batch_, global_;
  int rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  bool drop_last_;
  int64_t micro_ = 0;  // 0: the tail rule of the comment above
  int64_t first_ = 0;  // permutation position where the current epoch's steps begin
  int64_t steps_ = 0;
  int64_t full_steps_ = 0;   // leading steps that are whole global batches
  int64_t tail_sizes_[2]{};  // global sizes of the steps after them (0, 1 or 2 steps)
  int64_t max_batch_ = 0;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;

  void plan(int64_t remaining);           // lays out the steps over `remaining` samples from first_
  int64_t step_size(int64_t step) const;  // samples of a step, all ranks
};

}  // namespace dptrain::data
