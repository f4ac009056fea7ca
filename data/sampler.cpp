// ShardedSampler and gather_batch: the tail rule is documented in sampler.h.
#include "data/sampler.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace dptrain::data {

ShardedSampler::ShardedSampler(int64_t dataset_size, int64_t batch_size, int rank, int world_size,
                               uint64_t seed, bool shuffle, bool drop_last, int64_t micro_batch)
    : n_(dataset_size),
      batch_(batch_size),
      global_(batch_size * world_size),
      rank_(rank),
      world_(world_size),
      seed_(seed),
      shuffle_(shuffle),
      drop_last_(drop_last),
      micro_(micro_batch) {
  DPTRAIN_CHECK(dataset_size > 0, "sampler: dataset is empty");
  DPTRAIN_CHECK(batch_size > 0, "sampler: batch size must be positive, got ", batch_size);
  DPTRAIN_CHECK(micro_batch >= 0 && (micro_batch == 0 || batch_size % micro_batch == 0),
                "sampler: micro-batch size ", micro_batch, " does not divide the batch size ", batch_size);
  DPTRAIN_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "sampler: rank ", rank,
                " is outside world size ", world_size);
  plan(n_);
  perm_.resize(static_cast<std::size_t>(n_));
}

void ShardedSampler::plan(int64_t remaining) {
  const int64_t q = remaining / global_;
  const int64_t rem = remaining % global_;
  full_steps_ = q;
  max_batch_ = batch_;
  tail_sizes_[0] = tail_sizes_[1] = 0;
  int tails = 0;
  if (!drop_last_ && rem > 0) {
    if (micro_ > 0 || rem >= world_ || q == 0) {
      tail_sizes_[tails++] = rem;
    } else if (batch_ >= 2) {
      // g + rem >= 2W here, so both halves still give every rank a sample.
      full_steps_ = q - 1;
      tail_sizes_[tails++] = (global_ + rem + 1) / 2;
      tail_sizes_[tails++] = (global_ + rem) / 2;
    } else {
      full_steps_ = q - 1;
      tail_sizes_[tails++] = global_ + rem;
      max_batch_ = 2;
    }
  }
  steps_ = full_steps_ + tails;
}

void ShardedSampler::set_epoch(int64_t epoch, int64_t first_sample) {
  DPTRAIN_CHECK(epoch >= 0, "sampler: epoch must be non-negative, got ", epoch);
  DPTRAIN_CHECK(first_sample >= 0 && first_sample < n_, "sampler: first sample ", first_sample, " of epoch ",
                epoch, " is outside [0, ", n_, ")");
  epoch_ = epoch;
  first_ = first_sample;
  plan(n_ - first_);
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  if (!shuffle_) return;
  Rng rng(derive_seed(seed_, "epoch" + std::to_string(epoch)));
  for (int64_t i = n_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(perm_[i], perm_[j]);
  }
}

int64_t ShardedSampler::samples_before(int64_t step) const {
  DPTRAIN_CHECK(step >= 0 && step <= steps_, "sampler: step ", step, " is outside [0, ", steps_, "]");
  const int64_t full = std::min(step, full_steps_);
  int64_t at = first_ + full * global_;
  for (int64_t t = 0; t < step - full; ++t) at += tail_sizes_[t];
  return at;
}

int64_t ShardedSampler::step_size(int64_t step) const {
  DPTRAIN_CHECK(step >= 0 && step < steps_, "sampler: step ", step, " is outside [0, ", steps_, ")");
  return step < full_steps_ ? global_ : tail_sizes_[step - full_steps_];
}

int64_t ShardedSampler::micro_batches(int64_t step) const {
  DPTRAIN_CHECK(micro_ > 0, "sampler: not in micro-batch mode");
  return (step_size(step) + micro_ - 1) / micro_;
}

int64_t ShardedSampler::first_micro_batch(int64_t step) const {
  return micro_batches(step) * rank_ / world_;
}

std::span<const int64_t> ShardedSampler::batch_indices(int64_t step) const {
  DPTRAIN_CHECK(epoch_ >= 0, "sampler: set_epoch() must be called before batch_indices()");
  const int64_t start = samples_before(step);
  const int64_t m = step_size(step);
  if (micro_ > 0) {
    const int64_t begin = std::min(first_micro_batch(step) * micro_, m),
                  end = std::min(micro_batches(step) * (rank_ + 1) / world_ * micro_, m);
    return {perm_.data() + start + begin, static_cast<std::size_t>(end - begin)};
  }
  const int64_t base = m / world_, extra = m % world_;
  const int64_t offset = rank_ * base + std::min<int64_t>(rank_, extra);
  const int64_t count = base + (rank_ < extra ? 1 : 0);
  return {perm_.data() + start + offset, static_cast<std::size_t>(count)};
}

}  // namespace dptrain::data
