// The host backends' shared memory half (HostMemory: the block cache, memcpy, the half-precision
// casts) and the CPU backend (Eigen kernels). Core-internal: reach a backend through backend_for().
#pragma once

#include "core/backend.h"

namespace dptrain::cpu {

// Memory, copies and casts for a backend over host memory; the reference backend shares them.
class HostMemory : public Backend {
 public:
  void* allocate(std::size_t bytes) override;
  void release(void* pointer, std::size_t bytes) override;
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void fill(float* dst, int64_t n, float value) override;
  void synchronize() override {}
  void add_scalar(float* y, int64_t n, float value) override;
  void to_half(const float* x, uint16_t* y, int64_t n, float scale, HalfFormat format) override;
  void from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) override;
};

class CpuBackend final : public HostMemory {
 public:
  Device device() const override { return Device::cpu(); }
  void matmul(const float* a, const float* b, float* y, MatmulShape s) override;
  void matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                       MatmulShape s) override;
  void linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) override;
  void linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw, float* gbias,
                       LinearShape s) override;
  void add_bias(const float* x, const float* bias, float* y, BiasShape s) override;
  void add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) override;
  void conv2d(const float* x, const float* w, const float* bias, float* y, const Conv2dGeometry& g) override;
  void conv2d_backward(const float* gy, const float* x, const float* w, const float* y, GradientOut gx,
                       float* gw, float* gbias, const Conv2dGeometry& g) override;
  void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) override;
  void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                          const Pool2dGeometry& g) override;
  void conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y, int32_t* argmax,
                           const ConvPoolGeometry& g) override;
  void conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y, const float* x,
                                    const float* w, GradientOut gx, float* gw, float* gbias,
                                    const ConvPoolGeometry& g) override;
  void batchnorm_sums(const float* x, double* sums, BatchNormShape s) override;
  void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) override;
  void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                             float* running_var, int64_t channels, float eps, float momentum) override;
  void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                               int64_t channels, float eps) override;
  void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta,
                           float* y, BatchNormShape s, BatchNormEpilogue epilogue) override;
  void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                                 double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                                 BatchNormShape s) override;
  void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                                const float* gamma, const double* grad_sums, const double* sums,
                                GradientOut gx, BatchNormShape s) override;
  void batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                               double* squares, float* stats, float* running_mean, float* running_var,
                               float* y, BatchNormShape s, BatchNormEpilogue epilogue, float eps,
                               float momentum) override;
  void batchnorm_train_backward(const float* gy, const float* relu_y, const float* x, const float* stats,
                                const float* gamma, const double* sums, double* grad_sums, float* ggamma,
                                float* gbeta, GradientOut gresidual, GradientOut gx,
                                BatchNormShape s) override;
  void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) override;
  void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) override;
  void activation(Activation f, const float* x, float* y, int64_t n) override;
  void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx,
                           int64_t n) override;
  void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) override;
  void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) override;
  void add(const float* x, float* y, int64_t n) override;
  void cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs, float* loss,
                     int64_t batch, int64_t classes) override;
  void cross_entropy_backward(const float* probs, std::span<const int32_t> labels, const float* gloss,
                              float* glogits, int64_t batch, int64_t classes) override;
  void mse(const float* prediction, const float* target, float* loss, int64_t n) override;
  void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                    int64_t n) override;
  void sum(const float* x, float* out, int64_t n) override;
  void sum_backward(const float* gout, float* gx, int64_t n) override;
  bool all_finite(const float* x, int64_t n) override;
  double sum_of_squares(const float* x, int64_t n) override;
  void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                const SgdStep& s) override;
  void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const AdamStep& s) override;
};

}  // namespace dptrain::cpu
