// The training run: data, model, optimizer, data-parallel gradient averaging, the step loop,
// evaluation, metrics and final weights. The entry points (trainer/run.cpp).
#pragma once

#include <string>

#include "distributed/world.h"
#include "trainer/config.h"
#include "trainer/run_types.h"

namespace dptrain::trainer {

// Runs the configured training on this process's world. Rank 0 holds the run directories' locks
// (trainer/directory_lock.h) throughout.
TrainingResult train(const Config& config, const distributed::World& world, const RunOptions& options = {});

// Runs the configured training's real steps (no evaluation, no checkpoints): `warmup_steps` untimed,
// then `repetitions` x `timed_steps` timed, across epochs as needed. Writes the timeline if configured.
BenchmarkResult benchmark(const Config& config, const distributed::World& world,
                          const BenchmarkOptions& options);

// Loads the model weights of `checkpoint` (on rank 0, broadcast to the others) and evaluates the test
// set, sharded over the ranks. Prints the result on rank 0.
Evaluation evaluate_checkpoint(const Config& config, const distributed::World& world,
                               const std::string& checkpoint);

}  // namespace dptrain::trainer
