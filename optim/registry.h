// The registry of optimizers by name ("sgd", "adam", "adamw"): one line per optimizer in
// optim/registry.cpp, made from the config's optimizer section.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace dptrain::optim {

// Every optimizer's hyperparameters; each reads the ones it has.
struct OptimizerSettings {
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // The ranges of the flat buffers this rank updates (distributed.shard_optimizer); empty: all.
  std::vector<FlatRange> owned;
};

struct OptimizerEntry {
  const char* name;
  std::unique_ptr<Optimizer> (*make)(const FlatParameters& parameters, const OptimizerSettings& settings);
};

// An unknown name throws, listing the registered ones.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const FlatParameters& parameters,
                                          const OptimizerSettings& settings);
std::vector<std::string> optimizer_names();

}  // namespace dptrain::optim
