// Direct convolution (no im2col) at stride 1: forward, weight and input gradients.
#pragma once

#include <cstdint>
#include <functional>

#include "core/backend.h"

namespace dptrain::cpu::direct_conv {

// Whether these kernels take the convolution: stride 1, and either a short patch (C * KH * KW <= 32,
// where im2col copies every input pixel K times to feed a GEMM too short in K to reuse what it packs:
// the MNIST CNN's first layer ran at 15 GFLOP/s that way) or a kernel wider than 1x1 over rows that
// the padding and the kernel's overhang do not make mostly waste.
bool applies(const Conv2dGeometry& g);
// Whether backward() takes it: what forward takes, except wide patches whose weights outgrow half of
// L2, which both gradients stream once per pass over a block of channels.
bool applies_backward(const Conv2dGeometry& g);

// One [out_h, out_w] plane of a sample and output channel, which the callee may overwrite.
using PlaneVisitor = std::function<void(int64_t sample, int64_t channel, float* plane)>;

// Hands visit(sample, channel, sums) every plane of sums over the patch of w * x, bias not added.
// Called from several threads at once, never twice for a plane.
void forward(const Conv2dGeometry& g, const float* x, const float* w, const PlaneVisitor& visit);

// Writes the output gradient of one sample: pixel p = oh * out_w + ow of channel o at
// base[offset_of[p] + o * channel_stride]. Every such float is zero beforehand, so a writer may skip
// its zeros.
using GradientWriter =
    std::function<void(int64_t sample, float* base, const int64_t* offset_of, int64_t channel_stride)>;

// Adds the gradients (each may be null) of the convolution whose output gradient the writer gives,
// called once per sample, from several threads at once. The sums over the batch do not depend on the
// number of threads.
void backward(const Conv2dGeometry& g, const float* x, const float* w, float* gx, float* gw, float* gbias,
              const GradientWriter& write_output_gradient);

}  // namespace dptrain::cpu::direct_conv
