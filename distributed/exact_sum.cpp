// Order-independent sums in 64-bit fixed point: the derivation and the bounds are in exact_sum.h.
#include "distributed/exact_sum.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace dptrain::distributed {
namespace {

constexpr int32_t kAllZero = INT32_MIN;    // a tensor whose gradients are all zero: no scale needed
constexpr int32_t kNotFinite = INT32_MAX;  // an Inf or NaN: max() carries it to every rank

// The smallest e with |x| < 2^e for every x in `values`, kAllZero or kNotFinite. On the bit
// patterns: |x| ordered as floats is |x| ordered as unsigned integers, Inf and NaN above every
// finite value, and an integer max reduction vectorises where a float one may not.
int32_t exponent_bound(std::span<const float> values) {
  uint32_t largest = 0;
  for (float x : values) largest = std::max(largest, std::bit_cast<uint32_t>(x) & 0x7fffffffu);
  if (largest >= 0x7f800000u) return kNotFinite;
  if (largest == 0) return kAllZero;
  int e = 0;
  std::frexp(std::bit_cast<float>(largest), &e);  // largest = f x 2^e with f in [0.5, 1): < 2^e
  return e;
}

// The fixed point's binary point for a tensor: 51 - c - E (exact_sum.h), so every term and every
// sum of at most M of them stays below 2^51 in magnitude.
int shift_for(int32_t exponent, int64_t micro_batches) {
  const int headroom =
      static_cast<int>(std::bit_width(static_cast<uint64_t>(std::max<int64_t>(micro_batches, 1) - 1)));
  return 51 - headroom - exponent;
}

// Integers below 2^51 in magnitude and doubles convert exactly through 1.5 x 2^52, whose binade
// has a unit in the last place of exactly 1: adding it rounds to the nearest integer (ties to even,
// as llrint), and the bit patterns of the sums differ by that integer. Unlike cvtsd2si this
// vectorises.
constexpr double kRoundingMagic = 0x1.8p52;
inline int64_t round_to_int(double v) {  // |v| < 2^51
  return std::bit_cast<int64_t>(v + kRoundingMagic) - std::bit_cast<int64_t>(kRoundingMagic);
}
inline double to_double(int64_t q) {  // |q| < 2^51: exact
  return std::bit_cast<double>(q + std::bit_cast<int64_t>(kRoundingMagic)) - kRoundingMagic;
}

}  // namespace

ExactGradientSum::ExactGradientSum(Communicator& comm, const FlatParameters& parameters, bool shard)
    : comm_(comm), parameters_(parameters) {
  DPTRAIN_CHECK(parameters.device().is_host(),
                "distributed.deterministic sums gradients on the host; the parameters are in ",
                parameters.device().str(), " memory (set device \"cpu\")");
  if (shard) shard_.emplace(std::vector<FlatRange>{{0, parameters.size()}}, comm.size(), comm.rank());
}

void ExactGradientSum::sum_across_ranks() {
  const std::string what = "of fixed-point gradients at step " + std::to_string(step_);
  if (!shard_) {
    comm_.allreduce(std::span<int64_t>(fixed_), ReduceOp::kSum, "allreduce " + what);
    return;
  }
  if (comm_.size() == 1) return;
  const FlatRange tail = shard_->tail(0);
  comm_.reduce_scatter(
      std::span<int64_t>(fixed_.data(), static_cast<std::size_t>(shard_->scattered(0).numel)), ReduceOp::kSum,
      "reduce-scatter " + what);
  if (tail.numel > 0)
    comm_.allreduce(std::span<int64_t>(fixed_.data() + tail.offset, static_cast<std::size_t>(tail.numel)),
                    ReduceOp::kSum, "allreduce of the tail " + what);
}

void ExactGradientSum::begin(int64_t step, int64_t micro_batches, int64_t local) {
  DPTRAIN_CHECK(micro_batches >= 1 && local >= 0 && local <= micro_batches, "exact gradient sum: ", local,
                " local of ", micro_batches, " micro-batches at step ", step);
  step_ = step;
  micro_batches_ = micro_batches;
  local_ = local;
  added_ = 0;
  exponents_.assign(parameters_.parameters().size(), kAllZero);
  const std::size_t kept = static_cast<std::size_t>(std::max<int64_t>(local - 1, 0) * parameters_.size());
  if (kept_.size() < kept) kept_.resize(kept);
}

void ExactGradientSum::add_micro_batch() {
  DPTRAIN_CHECK(added_ < local_, "exact gradient sum: more than the ", local_,
                " micro-batches announced at step ", step_);
  // The last one stays in the gradient buffer, where finish() reads it: one model-sized copy fewer.
  if (added_ + 1 < local_)
    std::memcpy(kept_.data() + added_ * parameters_.size(), parameters_.grads().data_ptr(),
                sizeof(float) * static_cast<std::size_t>(parameters_.size()));
  // The exponent scan reads the gradients while the backward has just left them in cache.
  const std::vector<NamedTensor>& tensors = parameters_.parameters();
  const float* grads = parameters_.grads().data_ptr();
  for (std::size_t t = 0; t < tensors.size(); ++t)
    exponents_[t] = std::max(
        exponents_[t],
        exponent_bound({grads + parameters_.offset(t), static_cast<std::size_t>(tensors[t].tensor.numel())}));
  ++added_;
}

std::span<const float> ExactGradientSum::micro_batch_gradients(int64_t i) const {
  const float* data = i + 1 < local_ ? kept_.data() + i * parameters_.size() : parameters_.grads().data_ptr();
  return {data, static_cast<std::size_t>(parameters_.size())};
}

void ExactGradientSum::finish() {
  DPTRAIN_CHECK(added_ == local_, "exact gradient sum: ", added_, " of ", local_,
                " micro-batches added at step ", step_);
  const std::vector<NamedTensor>& tensors = parameters_.parameters();
  const std::size_t count = tensors.size();
  const auto window = [&](int64_t i, std::size_t t) {
    return micro_batch_gradients(i).subspan(static_cast<std::size_t>(parameters_.offset(t)),
                                            static_cast<std::size_t>(tensors[t].tensor.numel()));
  };

  // Each tensor's exponent bound over every micro-batch of every rank.
  std::vector<int32_t> everyone(count * static_cast<std::size_t>(comm_.size()));
  comm_.allgather(std::span<const int32_t>(exponents_), std::span<int32_t>(everyone),
                  "allgather of gradient exponents at step " + std::to_string(step_));
  std::vector<int32_t> exponent(count, kAllZero);
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm_.size()); ++r)
    for (std::size_t t = 0; t < count; ++t) exponent[t] = std::max(exponent[t], everyone[r * count + t]);
  for (std::size_t t = 0; t < count; ++t)
    DPTRAIN_CHECK(exponent[t] != kNotFinite, "non-finite gradient in ", tensors[t].name, " at step ", step_,
                  " (a micro-batch of some rank); not applied. Lower optimizer.lr");

  fixed_.assign(static_cast<std::size_t>(parameters_.size()), 0);
  for (std::size_t t = 0; t < count; ++t) {
    if (exponent[t] == kAllZero) continue;
    const double scale = std::ldexp(1.0, shift_for(exponent[t], micro_batches_));
    int64_t* out = fixed_.data() + parameters_.offset(t);
    const std::size_t n = static_cast<std::size_t>(tensors[t].tensor.numel());
    // In blocks that stay in L1 while every micro-batch is added to them: one pass over the sums.
    constexpr std::size_t kBlock = 1024;
    for (std::size_t first = 0; first < n; first += kBlock) {
      const std::size_t size = std::min(kBlock, n - first);
      for (int64_t i = 0; i < local_; ++i) {
        const float* g = window(i, t).data() + first;
        // Exact in double (a power-of-two scaling of a float), then rounded once to an integer.
        for (std::size_t k = 0; k < size; ++k)
          out[first + k] += round_to_int(static_cast<double>(g[k]) * scale);
      }
    }
  }
  sum_across_ranks();
  const std::vector<FlatRange> whole = {{0, parameters_.size()}};
  const std::vector<FlatRange>& mine = shard_ ? shard_->owned() : whole;
  float* grads = parameters_.grads().data_ptr();
  for (std::size_t t = 0; t < count; ++t) {
    const double unscale =
        exponent[t] == kAllZero ? 0.0 : std::ldexp(1.0, -shift_for(exponent[t], micro_batches_));
    for (const FlatRange& r : mine) {
      const int64_t first = std::max(r.offset, parameters_.offset(t)),
                    end = std::min(r.end(), parameters_.offset(t) + tensors[t].tensor.numel());
      if (first >= end) continue;
      if (exponent[t] == kAllZero) {
        std::fill(grads + first, grads + end, 0.0f);
        continue;
      }
      // Exact up to the cast: the one rounding of the sum is the cast to fp32.
      for (int64_t k = first; k < end; ++k) grads[k] = static_cast<float>(to_double(fixed_[k]) * unscale);
    }
  }
}

void ExactScalarSum::add(double term) {
  if (!std::isfinite(term) || std::fabs(term) >= 0x1p62) {
    ++invalid;
    return;
  }
  const double floor = std::floor(term);
  const auto whole = static_cast<int64_t>(floor);
  fractions += std::llrint(std::ldexp(term - floor, 32));  // term - floor is exact, in [0, 1)
  low += whole & 0xffffffff;
  if (__builtin_add_overflow(high, whole >> 32, &high)) ++invalid;  // >> 32: floor, so whole is exact
  carry();
}

void ExactScalarSum::carry() {
  low += fractions >> 32;
  fractions &= 0xffffffff;
  if (__builtin_add_overflow(high, low >> 32, &high)) ++invalid;
  low &= 0xffffffff;
}

double ExactScalarSum::value() const {
  if (invalid != 0) return std::nan("");
  return std::ldexp(static_cast<double>(high), 32) + static_cast<double>(low) +
         std::ldexp(static_cast<double>(fractions), -32);
}

void ExactScalarSum::allreduce(Communicator& comm, const std::string& what) {
  // Each rank's low and fractions are below 2^32: their sums fit for up to 2^31 ranks.
  int64_t parts[4] = {high, low, fractions, invalid};
  comm.allreduce(std::span<int64_t>(parts), ReduceOp::kSum, what);
  high = parts[0];
  low = parts[1];
  fractions = parts[2];
  invalid = parts[3];
  carry();
}

}  // namespace dptrain::distributed
