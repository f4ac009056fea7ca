// The optimizer tests' PyTorch fixtures: their MLP, and every parameter after a step against the
// fixture's "<run>.step<k>.<parameter>", within 1e-5 relative + 1e-6.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/parameters.h"
#include "layers/module.h"
#include "tests/test_util.h"

namespace dptrain::test_util {

// Linear(6,5)-ReLU-Linear(5,3), parameters named as PyTorch names them, loaded from the fixture's
// init.*.
inline std::unique_ptr<layers::Sequential> fixture_mlp(const FixtureFile& fixture) {
  auto model = std::make_unique<layers::Sequential>();
  model->add(std::make_unique<layers::Dense>("0", 6, 5, true));
  model->add(std::make_unique<layers::ActivationLayer>(layers::Activation::kRelu));
  model->add(std::make_unique<layers::Dense>("2", 5, 3, true));
  for (const NamedTensor& p : model->named_parameters()) {
    const Tensor& init = fixture.get("init." + p.name);
    EXPECT_EQ(init.shape(), p.tensor.shape()) << p.name;
    std::copy_n(init.data(), init.numel(), p.tensor.data());
  }
  return model;
}

inline bool close_to_pytorch(double ours, double ref) {
  return std::abs(ours - ref) <= 1e-6 + 1e-5 * std::abs(ref);
}

// Fails the test, naming up to three elements, where a parameter is not close_to_pytorch (call under
// ASSERT_NO_FATAL_FAILURE to stop at the first step that diverges).
inline void expect_step_matches(const FixtureFile& fixture, const std::string& run, int step,
                                const std::vector<NamedTensor>& parameters) {
  for (const NamedTensor& p : parameters) {
    const Tensor& ref = fixture.get(run + ".step" + std::to_string(step) + "." + p.name);
    ASSERT_EQ(ref.shape(), p.tensor.shape());
    int failures = 0;
    for (int64_t i = 0; i < ref.numel(); ++i)
      if (!close_to_pytorch(p.tensor.data()[i], ref.data()[i]) && ++failures <= 3)
        ADD_FAILURE() << run << " step " << step << " " << p.name << "[" << i << "]: " << p.tensor.data()[i]
                      << " vs PyTorch " << ref.data()[i];
    ASSERT_EQ(failures, 0) << run << " diverged at step " << step << " (" << p.name << ")";
  }
}

}  // namespace dptrain::test_util
