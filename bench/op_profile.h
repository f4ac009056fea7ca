// A per-op time profile of training steps: a Backend decorator that times every kernel it forwards
// (a GPU's queue drained before and after each, so a call's wall time is its kernel's, launch
// included; host backends run their kernels before returning), and the tables it prints, by kind of op and by
// convolution shape, with the FLOP/s each achieved.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/backend.h"
#include "distributed/world.h"
#include "trainer/config.h"

namespace dptrain::bench {

struct OpTotals {
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;  // 0 where an op is memory-bound and no FLOP count is meaningful
};

class OpProfile {
 public:
  void add(const std::string& kind, const std::string& shape, double seconds, double flops);
  void reset();
  // Prints both tables, per step of `steps`, and what share of `step_seconds` (the measured wall time
  // of those steps) the kernels took; the rest is the framework's (tape, allocation, the step's own
  // bookkeeping). `gemm_flops_per_second`, when > 0, adds each kind's share of it.
  void print(int64_t steps, double step_seconds, double gemm_flops_per_second) const;
  // Per step of `steps`: {"flops_per_step", "kernel_ms_per_step", "calls_per_step": {kind: calls}}.
  nlohmann::json summary(int64_t steps) const;

 private:
  std::map<std::string, OpTotals> by_kind_;
  std::map<std::string, OpTotals> by_conv_shape_;
};

// Replaces the backend of the run's device (this rank's GPU registered first) by one that records
// every kernel into `profile` (which must outlive the program's tensors) and forwards it to the real
// one. Not under NCCL, which needs the CUDA backend itself: one rank, or distributed.backend "mpi".
void profile_kernels(const trainer::Config& config, const distributed::World& world, OpProfile& profile);

}  // namespace dptrain::bench
