// Gradient clipping by the global L2 norm, as PyTorch's torch.nn.utils.clip_grad_norm_(parameters,
// max_norm): every gradient is multiplied by max_norm / (norm + 1e-6) where that is below 1 (by the
// optimizer's step, as it reads the gradients: Optimizer::step's grad_scale).
#pragma once

#include <span>

#include "core/parameters.h"

namespace dptrain::optim {

// What clip_grad_norm_ multiplies the gradients by at total norm `norm`: min(1, max_norm / (norm +
// 1e-6)). 1 where the norm is Inf or NaN: those gradients are the finiteness check's to report (a
// factor of NaN would only turn every gradient into NaN).
float clip_factor(double norm, double max_norm);

// The sum of the squares of the gradients in `ranges` of the flat gradient buffer, in double.
double gradient_sum_of_squares(const FlatParameters& parameters, std::span<const FlatRange> ranges);

}  // namespace dptrain::optim
