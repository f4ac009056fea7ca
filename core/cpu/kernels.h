// The CPU backend's kernels (Eigen GEMMs, loops the compiler vectorises, OpenMP across cores);
// core/cpu/backend.cpp puts them behind the Backend interface, whose comments say what each computes.
#pragma once

#include <cstdint>
#include <span>

#include "core/backend.h"

namespace dptrain::cpu {

void matmul(const float* a, const float* b, float* y, MatmulShape s);
void matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb, MatmulShape s);
void linear(const float* x, const float* w, const float* bias, float* y, LinearShape s);
void linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw, float* gbias,
                     LinearShape s);
void add_bias(const float* x, const float* bias, float* y, BiasShape s);
void add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s);

void conv2d(const float* x, const float* w, const float* bias, float* y, const Conv2dGeometry& g);
void conv2d_backward(const float* gy, const float* x, const float* w, const float* y, GradientOut gx,
                     float* gw, float* gbias, const Conv2dGeometry& g);
void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g);
// One plane of maxpool2d (g.planes is not read), on the calling thread: for kernels that pool inside
// their own parallel loops.
void maxpool2d_plane(const float* plane, float* y, int32_t* argmax, const Pool2dGeometry& g);
void conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y, int32_t* argmax,
                         const ConvPoolGeometry& g);
void conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y, const float* x,
                                  const float* w, GradientOut gx, float* gw, float* gbias,
                                  const ConvPoolGeometry& g);
void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx, const Pool2dGeometry& g);

void batchnorm_sums(const float* x, double* sums, BatchNormShape s);
void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s);
void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                           float* running_var, int64_t channels, float eps, float momentum);
void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                             int64_t channels, float eps);
void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta, float* y,
                         BatchNormShape s, BatchNormEpilogue epilogue);
void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                               double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                               BatchNormShape s);
void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                              const float* gamma, const double* grad_sums, const double* sums, GradientOut gx,
                              BatchNormShape s);
void batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                             double* squares, float* stats, float* running_mean, float* running_var, float* y,
                             BatchNormShape s, BatchNormEpilogue epilogue, float eps, float momentum);
void batchnorm_train_backward(const float* gy, const float* relu_y, const float* x, const float* stats,
                              const float* gamma, const double* sums, double* grad_sums, float* ggamma,
                              float* gbeta, GradientOut gresidual, GradientOut gx, BatchNormShape s);
void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size);
void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size);

void activation(Activation f, const float* x, float* y, int64_t n);
void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx, int64_t n);
void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state);
void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n);
void add(const float* x, float* y, int64_t n);
void fill(float* x, int64_t n, float value);

void cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs, float* loss,
                   int64_t batch, int64_t classes);
void cross_entropy_backward(const float* probs, std::span<const int32_t> labels, const float* gloss,
                            float* glogits, int64_t batch, int64_t classes);
void mse(const float* prediction, const float* target, float* loss, int64_t n);
void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                  int64_t n);
void sum(const float* x, float* out, int64_t n);

bool all_finite(const float* x, int64_t n);
double sum_of_squares(const float* x, int64_t n);
void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n, const SgdStep& s);
void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamStep& s);

}  // namespace dptrain::cpu
