// The training run: data, model, optimizer, data-parallel gradient averaging, the step loop,
// evaluation, metrics and final weights.
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/world.h"
#include "trainer/config.h"

namespace dptrain::trainer {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  int64_t step = 0;   // optimizer steps taken so far
  double train_loss = 0, train_accuracy = 0;  // averaged over all ranks' samples
  double test_loss = 0, test_accuracy = 0;
  double samples_per_sec = 0, samples_per_sec_per_rank = 0, epoch_seconds = 0;
  double lr = 0;  // at the end of the epoch
  bool stopped_early = false;  // training.max_steps ended this epoch
};

// Runs the configured training on this process's world; returns one entry per (partial) epoch.
std::vector<EpochMetrics> train(const Config& config, const distributed::World& world);

}  // namespace dptrain::trainer
