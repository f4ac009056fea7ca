// PowerSGD with error feedback and warm start over the flat gradient buffer (the algorithm and its
// scaling are in powersgd.h).
#include "distributed/powersgd.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "core/timeline.h"

namespace dptrain::distributed {
namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixView = Eigen::Map<RowMajor>;

// Tells the initial Q of PowerSGD apart from the other streams drawn from the run's seed.
constexpr uint64_t kPowerSgdStream = 0x706f77657273ull;

}  // namespace

bool orthogonalize_columns(float* matrix, int64_t rows, int64_t cols) {
  MatrixView a(matrix, rows, cols);
  bool full_rank = true;
  for (int64_t i = 0; i < cols; ++i) {
    // In double: a column of a large layer sums tens of thousands of squares.
    const double norm = std::sqrt(a.col(i).cast<double>().squaredNorm());
    if (norm > 0) {
      a.col(i) /= static_cast<float>(norm);
    } else {
      full_rank = false;
    }
    for (int64_t j = i + 1; j < cols; ++j) {
      const float projection = a.col(i).dot(a.col(j));
      a.col(j) -= projection * a.col(i);
    }
  }
  return full_rank;
}

PowerSgdReducer::PowerSgdReducer(Communicator& comm, const FlatParameters& parameters,
                                 PowerSgdOptions options)
    : comm_(comm), parameters_(parameters), options_(options) {
  DPTRAIN_CHECK(parameters.device().is_host(), "distributed.compression \"powersgd\" runs on the CPU; the ",
                "parameters are in ", parameters.device().str(), " memory (set device \"cpu\")");
  DPTRAIN_CHECK(options_.rank >= 1, "distributed.powersgd.rank must be >= 1, not ", options_.rank);
  int64_t q_elements = 0;
  const std::vector<NamedTensor>& tensors = parameters_.parameters();
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const Shape& shape = tensors[k].tensor.shape();
    const int64_t numel = tensors[k].tensor.numel();
    const int64_t rows = shape.empty() ? 1 : shape[0], cols = rows > 0 ? numel / rows : 0;
    const int64_t rank = std::min({rows, cols, options_.rank});
    // As PyTorch's _should_compress: worth it only if the factors are min_compression_rate smaller.
    const bool compress =
        shape.size() >= 2 && static_cast<double>((rows + cols) * rank) * options_.min_compression_rate <
                                 static_cast<double>(numel);
    if (!compress) {
      uncompressed_.push_back(k);
      uncompressed_elements_ += numel;
      continue;
    }
    matrices_.push_back({.parameter = k,
                         .rows = rows,
                         .cols = cols,
                         .rank = rank,
                         .p_offset = p_elements_,
                         .q_offset = q_elements});
    p_elements_ += rows * rank;
    q_elements += cols * rank;
  }
  p_.resize(static_cast<std::size_t>(p_elements_ + uncompressed_elements_));
  error_ = Tensor::zeros({parameters_.size()});
  // The same standard normal Q on every rank, per matrix from (seed, parameter index); start-up
  // broadcasts it anyway, with the rest of the state.
  q_ = Tensor::zeros({q_elements});
  for (const PowerSgdMatrix& m : matrices_) {
    Rng rng(splitmix64_draw(options_.seed ^ kPowerSgdStream, m.parameter));
    float* q = q_.data_ptr() + m.q_offset;
    for (int64_t i = 0; i < m.cols * m.rank; ++i) q[i] = static_cast<float>(rng.normal());
  }
}

// A step whose M was zero on every rank leaves Q = M^T P zero, and a zero column would stay zero
// for good (PyTorch's hook turns it into NaN): such columns are drawn anew from (seed, parameter,
// step), alike on every rank.
void PowerSgdReducer::redraw_zero_columns(const PowerSgdMatrix& m, int64_t step) {
  MatrixView q(q_.data_ptr() + m.q_offset, m.cols, m.rank);
  Rng rng(splitmix64_draw(options_.seed ^ kPowerSgdStream, m.parameter) ^
          splitmix64_draw(kPowerSgdStream, static_cast<uint64_t>(step)));
  for (int64_t j = 0; j < m.rank; ++j)
    if (q.col(j).squaredNorm() == 0)
      for (int64_t i = 0; i < m.cols; ++i) q(i, j) = static_cast<float>(rng.normal());
  orthogonalize_columns(q.data(), m.cols, m.rank);
}

int64_t PowerSgdReducer::payload_elements() const {
  return uncompressed_elements_ + p_elements_ + q_.numel();
}

void PowerSgdReducer::reduce(int64_t step) {
  const std::string at = " at step " + std::to_string(step);
  const std::vector<NamedTensor>& tensors = parameters_.parameters();
  float* grads = parameters_.grads().data_ptr();
  float* error = error_.data_ptr();
  const auto gradient_of = [&](std::size_t k) { return grads + parameters_.offset(k); };

  // The uncompressed tensors travel behind the Ps, in the same allreduce: on a slow link each
  // collective costs a round of latency, and these are small.
  float* staged = p_.data() + p_elements_;
  for (std::size_t k : uncompressed_) {
    std::memcpy(staged, gradient_of(k), sizeof(float) * static_cast<std::size_t>(tensors[k].tensor.numel()));
    staged += tensors[k].tensor.numel();
  }

  {
    timeline::Span span("powersgd P = M Q", "communication");
    for (const PowerSgdMatrix& m : matrices_) {
      const int64_t offset = parameters_.offset(m.parameter);
      // M = gradient + error, kept in the error buffer until the new error replaces it.
      MatrixView matrix(error + offset, m.rows, m.cols);
      matrix += MatrixView(grads + offset, m.rows, m.cols);
      float* q = q_.data_ptr() + m.q_offset;
      if (!orthogonalize_columns(q, m.cols, m.rank)) redraw_zero_columns(m, step);
      MatrixView(p_.data() + m.p_offset, m.rows, m.rank).noalias() = matrix * MatrixView(q, m.cols, m.rank);
    }
  }
  comm_.allreduce(std::span<float>(p_), ReduceOp::kSum,
                  "allreduce of PowerSGD's P and the uncompressed gradients" + at);
  staged = p_.data() + p_elements_;
  for (std::size_t k : uncompressed_) {
    std::memcpy(gradient_of(k), staged, sizeof(float) * static_cast<std::size_t>(tensors[k].tensor.numel()));
    staged += tensors[k].tensor.numel();
  }
  {
    timeline::Span span("powersgd Q = M^T P", "communication");
    for (const PowerSgdMatrix& m : matrices_) {
      float* p = p_.data() + m.p_offset;
      orthogonalize_columns(p, m.rows, m.rank);
      MatrixView(q_.data_ptr() + m.q_offset, m.cols, m.rank).noalias() =
          MatrixView(error + parameters_.offset(m.parameter), m.rows, m.cols).transpose() *
          MatrixView(p, m.rows, m.rank);
    }
  }
  comm_.allreduce(std::span<float>(q_.data_ptr(), static_cast<std::size_t>(q_.numel())), ReduceOp::kSum,
                  "allreduce of PowerSGD's Q" + at);
  {
    timeline::Span span("powersgd gradient = P Q^T", "communication");
    const float share = 1.0f / static_cast<float>(comm_.size());
    for (const PowerSgdMatrix& m : matrices_) {
      const int64_t offset = parameters_.offset(m.parameter);
      MatrixView gradient(grads + offset, m.rows, m.cols);
      gradient.noalias() = MatrixView(p_.data() + m.p_offset, m.rows, m.rank) *
                           MatrixView(q_.data_ptr() + m.q_offset, m.cols, m.rank).transpose();
      MatrixView(error + offset, m.rows, m.cols) -= share * gradient;
    }
  }

  if (!options_.check_finite) return;
  for (std::size_t k = 0; k < tensors.size(); ++k) {
    const float* g = gradient_of(k);
    const bool finite =
        std::all_of(g, g + tensors[k].tensor.numel(), [](float x) { return std::isfinite(x); });
    DPTRAIN_CHECK(finite, "non-finite averaged gradient in ", tensors[k].name, at,
                  " (PowerSGD); not applied. Lower optimizer.lr");
  }
}

}  // namespace dptrain::distributed
