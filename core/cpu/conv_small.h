// Convolutions over planes so small that padding makes much of im2col's work, and stride-2 ones over
// small planes: per-tap GEMMs.
#pragma once

#include "core/backend.h"
#include "core/cpu/conv_direct.h"

namespace dptrain::cpu::small_plane_conv {

// Whether the forward takes the convolution: stride 1 or 2, a kernel wider than 1x1, channels enough
// for GEMMs, and planes where over a tenth of im2col's tap-pixel products meet padding (3x3 kernels
// over 8x8 and 7x7 planes, 16% and 18%; over 4x4, 31%; over 2x2, 56%), at stride 2 over 4.5% (3x3/2
// with padding 1 from even planes to outputs of 14x14 and less).
bool applies(const Conv2dGeometry& g);
// Whether backward() takes it: at stride 1 over a quarter with AVX-512 and over 5% with AVX2, at
// stride 2 over 8.5% (3x3/2 with padding 1 from even planes to 7x7 and less; from odd ones, 9x9 and
// less). Its copies of the activations (the output gradient twice, the input, the input gradient)
// grow with the planes; at 8x8 with AVX-512 they cost more than the padding's products.
bool applies_backward(const Conv2dGeometry& g);

// The kernels' taps apart, w [O, C, KH, KW] -> [KH * KW, O, C], in a buffer of the calling thread's
// that the next call overwrites.
const float* weights_by_tap(const Conv2dGeometry& g, const float* w);

// As direct_conv::forward: visit(sample, channel, sums) for every plane of sums, bias not added,
// from several threads at once, never twice for a plane.
void forward(const Conv2dGeometry& g, const float* x, const float* w, const direct_conv::PlaneVisitor& visit);

// As direct_conv::backward: adds the gradients (each may be null) from the output gradient that the
// writer gives, into zeros, once per sample. The sums do not depend on the number of threads.
void backward(const Conv2dGeometry& g, const float* x, const float* w, float* gx, float* gw, float* gbias,
              const direct_conv::GradientWriter& write_output_gradient);

}  // namespace dptrain::cpu::small_plane_conv
