// The CUDA backend's own kernels: everything the backend table needs that is not a cuBLAS GEMM or a
// cuDNN convolution. Each launches on `stream` and returns without waiting; shapes follow the
// Backend interface (core/backend.h), and numerics follow the CPU backend where they can be equal
// (pooling winners and their gradient order, dropout masks, casts: bitwise) and the reference within
// rounding elsewhere (float math in another order; the update rules are the CPU's source, but nvcc
// and GCC may fuse different multiply-adds). Internal to cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/backend.h"

namespace dptrain::cuda {

void fill(float* y, int64_t n, float value, cudaStream_t stream);
void add(const float* x, float* y, int64_t n, cudaStream_t stream);                    // y += x
void add_scalar(float* y, int64_t n, float value, cudaStream_t stream);                // y += value
void add_device_scalar(const float* value, float* y, int64_t n, cudaStream_t stream);  // y += value[0]

// y = x + bias[channel] (bias may be null: x), optionally then max(0, .); in place allowed (y == x).
void add_bias(const float* x, const float* bias, float* y, BiasShape s, bool relu, cudaStream_t stream);
// gbias[c] += sum of gy over outer and inner (fixed orders: deterministic). With inner 1 (a linear
// layer's [batch, out]) a warp reads 32 neighbouring channels of a row at a time.
// `partials` holds bias_gradient_partials(s) doubles.
int64_t bias_gradient_partials(BiasShape s);
void bias_gradient(const float* gy, float* gbias, BiasShape s, double* partials, cudaStream_t stream);
// masked = y > 0 ? gy : 0 (a fused ReLU's backward).
void relu_mask(const float* gy, const float* y, float* masked, int64_t n, cudaStream_t stream);

void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g, cudaStream_t stream);
// Gathers, per input element, the gradients of the outputs it won, in output order: the CPU's
// sequence of additions, so the result is bitwise the CPU's even where windows overlap.
void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx, const Pool2dGeometry& g,
                        cudaStream_t stream);
// conv2d_relu_maxpool's backward as far as the convolution: per conv output element, the gradients
// of the windows it won (maxpool2d_backward's order) where ReLU let it through (the windows' pooled
// y, summed the same way, > 0), written whole. Bitwise the backend defaults' two scatters into zeroed
// buffers and the ReLU mask, in one pass instead of eight over conv-sized tensors.
void maxpool_relu_backward(const float* gy, const int32_t* argmax, const float* y, float* gconv,
                           const Pool2dGeometry& g, cudaStream_t stream);

// Batch normalisation in the buffers of BatchNormShape. Per-channel sums are in double, each channel
// cut by samples into batchnorm_splits(s) blocks (enough blocks to fill the GPU when the channels
// are few: 64 channels of a ResNet's first layers would leave most SMs idle), whose partial sums a
// second pass adds in a fixed order: deterministic. `partials` holds batchnorm_partials(s) doubles.
int64_t batchnorm_partials(BatchNormShape s);
void batchnorm_sums(const float* x, double* sums, BatchNormShape s, double* partials, cudaStream_t stream);
void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s,
                       double* partials, cudaStream_t stream);
void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                           float* running_var, int64_t channels, float eps, float momentum,
                           cudaStream_t stream);
void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                             int64_t channels, float eps, cudaStream_t stream);
void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta, float* y,
                         BatchNormShape s, BatchNormEpilogue epilogue, cudaStream_t stream);
void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                               double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                               BatchNormShape s, double* partials, cudaStream_t stream);
void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                              const float* gamma, const double* grad_sums, const double* sums, GradientOut gx,
                              BatchNormShape s, cudaStream_t stream);
void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size, cudaStream_t stream);
void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size,
                          cudaStream_t stream);

void activation(Activation f, const float* x, float* y, int64_t n, cudaStream_t stream);
void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx, int64_t n,
                         cudaStream_t stream);
void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state,
             cudaStream_t stream);
void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n, cudaStream_t stream);

// probs = softmax(logits) by rows, row_loss[b] = -log probs[b, label[b]]; labels on the device. One
// exponential per element: the exponentials are kept in probs, then scaled.
void softmax_cross_entropy(const float* logits, const int32_t* labels, float* probs, float* row_loss,
                           int64_t batch, int64_t classes, cudaStream_t stream);
void cross_entropy_backward(const float* probs, const int32_t* labels, const float* gloss, float* glogits,
                            int64_t batch, int64_t classes, cudaStream_t stream);
void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                  int64_t n, cudaStream_t stream);

// Deterministic sums in double (block partials, then one block over the partials, fixed orders):
// out[0] = float(scale * sum_i term(i)) with term x[i], or (x[i] - t[i])^2 when t is given.
// `partials` holds kReductionBlocks doubles on the device.
inline constexpr int kReductionBlocks = 512;
void reduce_sum(const float* x, const float* t, int64_t n, double scale, double* partials, float* out,
                cudaStream_t stream);
// The block partials of sum_i x[i]^2 (the same kernel and orders) into `partials`; how many there are,
// for the host to add in order.
int sum_of_squares_partials(const float* x, int64_t n, double* partials, cudaStream_t stream);

// *flag = 1 if any element is Inf or NaN (flag untouched otherwise).
void flag_non_finite(const float* x, int64_t n, int32_t* flag, cudaStream_t stream);
// *flag = value if *flag is 0 and any element is Inf or NaN (the first marker wins).
void mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value, cudaStream_t stream);
// out[0] = float(rows whose first largest logit is at their label); labels on the device. One block:
// a batch's rows, each scanned by one thread.
void count_correct(const float* logits, const int32_t* labels, int64_t batch, int64_t classes, float* out,
                   cudaStream_t stream);

// One fused update over flat device buffers of `n` floats (parameters, gradients, optimizer state
// at the same offsets), with the formulas of core/update_rules.h that the CPU backend uses too.
void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n, const SgdStep& s,
              cudaStream_t stream);
void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStep& s, cudaStream_t stream);

// dst[i] = half(src[i] * scale) and back; `n` elements.
void floats_to_halves(const float* src, uint16_t* dst, int64_t n, float scale, HalfFormat format,
                      cudaStream_t stream);
void halves_to_floats(const uint16_t* src, float* dst, int64_t n, HalfFormat format, cudaStream_t stream);

}  // namespace dptrain::cuda
