// PowerSGD gradient compression with error feedback and warm start (Vogels et al. 2019), with the
// semantics of PyTorch's DDP powerSGD_hook applied to one bucket holding the whole model.
//
// Per step (on or after start_step), each parameter with at least two dimensions, viewed as an
// n x m matrix M ([out, in x kh x kw] for a convolution), is compressed at rank r = min(n, m, rank)
// when (n + m) x r x min_compression_rate < n x m; the others (biases, small matrices) are summed
// uncompressed in one allreduce. For every compressed matrix:
//   M  = gradient + error                 (error feedback: what earlier steps did not transmit)
//   Q  = orthogonalise(Q)                 (warm start: last step's Q, seeded random at first)
//   P  = M Q,                allreduce P  (sum), orthogonalise P
//   Q  = M^T P,              allreduce Q  (sum)
//   gradient = P Q^T                      (the average: local gradients are already divided by N)
//   error    = M - P Q^T / N              (this rank's share of what was not transmitted)
// Two allreduces per step in all: every P with the uncompressed tensors behind them, every Q. (PyTorch
// allreduces the uncompressed tensors separately, overlapped with computing P; on a slow link the
// latency of a third collective costs more than that overlap saves.)
//
// Scaling: the trainer seeds backward with 1 / N, so each rank's gradient is g / N, and this class
// works on those. PyTorch's hook works on g and divides by N itself; with the error held as
// PyTorch's error / N the two compute the same gradients (orthogonalisation ignores the scale of
// P). PyTorch also runs error feedback over the uncompressed tensors, where the errors of all ranks
// sum to zero and change the average only by rounding; here they have none.
//
// State: Q is the same on every rank (seeded alike, then the result of allreduces); the error is
// each rank's own. Both are training state: checkpoints hold Q and every rank's error, and a resume
// restores them. The error enters the next step only through its sum over ranks (P and Q are linear
// in the sum of the M's), so a resume on another number of ranks gives rank 0 that sum and the
// others zero: the same training, up to the order of floating-point additions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/parameters.h"
#include "distributed/communicator.h"

namespace dptrain::distributed {

struct PowerSgdOptions {
  int64_t rank = 2;                 // distributed.powersgd.rank
  int64_t start_step = 100;         // plain allreduce before this global step
  double min_compression_rate = 2;  // (n + m) r x this < n m, or the tensor goes uncompressed
  uint64_t seed = 0;                // of the initial Q
  bool check_finite = true;
};

// A parameter compressed as an n x m matrix at rank r; its P and Q within the flat P and Q buffers.
struct PowerSgdMatrix {
  std::size_t parameter = 0;
  int64_t rows = 0, cols = 0, rank = 0;
  int64_t p_offset = 0, q_offset = 0;  // [rows x rank] and [cols x rank], row-major
};

class PowerSgdReducer {
 public:
  // Host memory only: `parameters` on the CPU.
  PowerSgdReducer(Communicator& comm, const FlatParameters& parameters, PowerSgdOptions options);

  // Whether global step `step` is compressed (else the caller's plain allreduce runs it).
  bool compresses(int64_t step) const { return step >= options_.start_step; }
  // After the step's backward: leaves the approximated average in the gradients, identical on every
  // rank, and the new error in error(). `step` labels messages. Throws if the result is not finite.
  void reduce(int64_t step);

  // Elements this rank contributes to the step's allreduces (the payload; a ring allreduce sends
  // 2 (N - 1) / N of it over each link): the parameters uncompressed, P and Q compressed.
  int64_t payload_elements() const;
  const std::vector<PowerSgdMatrix>& matrices() const { return matrices_; }
  const std::vector<std::size_t>& uncompressed() const { return uncompressed_; }

  // Training state, host tensors of fixed size: Q ([sum of cols x rank]) and this rank's error (the
  // flat gradient layout; zero outside the compressed parameters).
  const Tensor& q() const { return q_; }
  const Tensor& error() const { return error_; }

 private:
  Communicator& comm_;
  const FlatParameters& parameters_;
  void redraw_zero_columns(const PowerSgdMatrix& m, int64_t step);

  PowerSgdOptions options_;
  std::vector<PowerSgdMatrix> matrices_;
  std::vector<std::size_t> uncompressed_;  // parameter indices
  int64_t uncompressed_elements_ = 0, p_elements_ = 0;
  Tensor q_, error_;
  std::vector<float> p_;  // all Ps, then the uncompressed gradients: one allreduce
};

// Orthogonalises the columns of a rows x cols row-major matrix in place by Gram-Schmidt, as
// PyTorch's powerSGD_hook does (for rank > 2 it uses a QR factorisation, which differs only in the
// signs of columns, and those cancel in P Q^T). A column that becomes zero stays zero; returns
// whether none did.
bool orthogonalize_columns(float* matrix, int64_t rows, int64_t cols);

}  // namespace dptrain::distributed
