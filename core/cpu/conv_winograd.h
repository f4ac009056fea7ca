// 3x3 convolutions at stride 1 with padding 1 by Winograd's minimal filtering: the forward and the
// input gradient by F(2x2, 3x3) (F(4x4, 3x3) as cpu_options().winograd_tile says), the weight gradient
// by F(4x4, 3x3).
#pragma once

#include "core/backend.h"
#include "core/cpu/conv_direct.h"

namespace dptrain::cpu::winograd_conv {

// Whether these kernels take the convolution, forward and backward: a 3x3 kernel at stride 1
// with padding 1 (the output plane is the input's), channels enough for GEMMs, and planes of at least
// 8x8, 4x4 with winograd_tile 4 (below that the per-tap GEMMs of conv_small.h make few more products than
// these do, or fewer).
bool applies(const Conv2dGeometry& g);

// As direct_conv::forward: visit(sample, channel, sums) for every plane of sums, bias not added, from
// several threads at once, never twice for a plane. A sample's sums do not depend on the batch or
// the number of threads.
void forward(const Conv2dGeometry& g, const float* x, const float* w, const direct_conv::PlaneVisitor& visit);

// As direct_conv::backward, all three gradients (each may be null; gx written or added into as it
// says) from the output gradient that the writer gives, once per sample, with channel_stride 1.
void backward(const Conv2dGeometry& g, const float* x, const float* w, GradientOut gx, float* gw,
              float* gbias, const direct_conv::GradientWriter& write_output_gradient);

}  // namespace dptrain::cpu::winograd_conv
