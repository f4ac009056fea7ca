// Reverse-mode autodiff: ops append backward closures to a per-thread tape; backward() replays
// them in reverse. Inputs that need no gradient record nothing and cost no gradient work.
#pragma once

#include <functional>
#include <initializer_list>

#include "core/tensor.h"

namespace dptrain {

bool grad_enabled();

// Disables recording for its lifetime (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

namespace autograd {

// True when grad mode is on and at least one input requires a gradient.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);

// Records `backward` for an op whose output is `output` and whose differentiable inputs are `inputs`;
// marks the output as requiring grad. Call only when any_requires_grad(inputs) is true.
void record(const Tensor& output, std::initializer_list<const Tensor*> inputs,
            std::function<void()> backward);

// Seeds d(root)/d(root) = seed for a scalar root and replays, in reverse, the recorded ops the root
// depends on, removing them from the tape; ops of other graphs stay for their own backward.
void backward(const Tensor& root, float seed = 1.0f);
// The same from a root of any shape with the upstream gradient `upstream` (same element count and
// device): what backward of sum(root * upstream) would do.
void backward(const Tensor& root, const Tensor& upstream);

// Drops everything recorded (e.g. after a forward pass whose loss is not differentiated).
void clear_tape();
std::size_t tape_size();

}  // namespace autograd
}  // namespace dptrain
