// Sums whose bits do not depend on how the terms are grouped into ranks or in what order they are
// added: 64-bit fixed point, where addition is associative. The gradient reduction of
// distributed.deterministic (ExactGradientSum) and the metric sums of every run (ExactScalarSum).
//
// ExactGradientSum, per parameter tensor t and step:
//   E_t  = the smallest e with |g| < 2^e over every element of every micro-batch gradient of the step
//          on every rank (one allgather of a few int32), so every rank scales alike;
//   c    = ceil(log2 M), M = the step's micro-batches on all ranks;
//   q    = round(g x 2^(51 - c - E_t)) as int64, added locally, then across ranks (MPI sum of int64);
//   sum  = (float)(q_total x 2^-(51 - c - E_t)), the one rounding.
// Overflow cannot happen: |q| <= 2^(51 - c), so any sum of at most M terms stays within 2^51, far
// inside int64; that bound (rather than 2^62) lets a double round and convert the integers exactly
// with vector instructions. Precision: the tensor's largest element keeps 51 - c bits (fp32 has
// 24); each term is rounded to a multiple of 2^(E_t - 51 + c), so the total differs from the exact
// sum of the fp32 gradients by at most M x 2^(E_t - 52 + c), 2^-(52 - 2c) of the tensor's largest
// gradient (5.7e-14 for M = 16), before the one rounding to fp32. Only elements below that size
// relative to their tensor's largest are lost. An Inf or NaN anywhere is found by the same
// allgather and stops every rank alike.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/parameters.h"
#include "distributed/communicator.h"
#include "distributed/shard_layout.h"

namespace dptrain::distributed {

class ExactGradientSum {
 public:
  // Host memory only: `parameters` on the CPU. With `shard` (ZeRO-1) the fixed-point sums are
  // reduce-scattered over shard_layout() instead of allreduced: the same integers, so the same bits,
  // in this rank's shard only.
  ExactGradientSum(Communicator& comm, const FlatParameters& parameters, bool shard = false);
  const ShardLayout* shard_layout() const { return shard_ ? &*shard_ : nullptr; }

  // A step whose global batch is cut into `micro_batches` micro-batches; this rank computes `local` of
  // them, in any order. `step` labels messages.
  void begin(int64_t step, int64_t micro_batches, int64_t local);
  // After the backward of one of this rank's micro-batches (seeded with its share of the step's
  // average): takes the gradients. The caller zeroes them before the next micro-batch.
  void add_micro_batch();
  // Leaves the sum over every rank's micro-batches in the gradients (in this rank's shard of them,
  // with `shard`), identical bits on every rank and for any split of the micro-batches into ranks.
  void finish();

 private:
  std::span<const float> micro_batch_gradients(int64_t i) const;  // i < added_
  void sum_across_ranks();

  Communicator& comm_;
  const FlatParameters& parameters_;
  std::optional<ShardLayout> shard_;  // one window, the whole flat buffer
  int64_t step_ = 0, micro_batches_ = 0, local_ = 0, added_ = 0;
  // Every micro-batch but the last stays here; the last is still in the gradient buffer.
  std::vector<float> kept_;
  std::vector<int64_t> fixed_;      // the flat layout, in fixed point
  std::vector<int32_t> exponents_;  // per tensor, over this rank's micro-batches so far
};

// A sum of doubles with the same bits for any order and grouping of the terms: each term is held in
// fixed point, in units of 2^-32 (so terms are rounded to 2.3e-10), as 32-bit limbs kept in int64s
// (high * 2^32 + low + fractions * 2^-32, low and fractions in [0, 2^32)): the limbs of many ranks
// add without overflow where one int64 of units wrapped (a diverging run's loss of 1e15 at batch 128
// passed 2^63 within an epoch). A non-finite term, or one of 2^62 or more, makes the sum NaN.
struct ExactScalarSum {
  int64_t high = 0, low = 0, fractions = 0, invalid = 0;

  void add(double term);
  double value() const;
  // Across ranks: one allreduce of four int64.
  void allreduce(Communicator& comm, const std::string& what);

 private:
  void carry();  // low and fractions back into [0, 2^32); an overflow of high makes the sum invalid
};

}  // namespace dptrain::distributed
