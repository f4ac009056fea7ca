// The CPU backend: host memory from the block cache, the kernels of core/cpu/ and their switches.
#include "core/cpu/backend.h"

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/cpu/kernels.h"
#include "core/cpu/packet.h"
#include "core/storage.h"

namespace dptrain {
namespace {
std::atomic<bool> winograd_on{true};
std::atomic<int> winograd_tile{2};
}  // namespace

void set_cpu_options(const CpuOptions& options) {
  if (options.winograd_tile != 2 && options.winograd_tile != 4)
    throw std::invalid_argument("CPU option winograd_tile = " + std::to_string(options.winograd_tile) +
                                " must be 2 or 4 (outputs a side of Winograd's tiles)");
  winograd_on.store(options.winograd, std::memory_order_relaxed);
  winograd_tile.store(options.winograd_tile, std::memory_order_relaxed);
}
CpuOptions cpu_options() {
  return {.winograd = winograd_on.load(std::memory_order_relaxed),
          .winograd_tile = winograd_tile.load(std::memory_order_relaxed)};
}

const char* cpu_vector_isa() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2";
#elif defined(__ARM_NEON)
  return "NEON";
#else
  return "none";
#endif
}
int cpu_vector_floats() {
  return static_cast<int>(cpu::simd::kLanes);
}

}  // namespace dptrain

namespace dptrain::cpu {

void* HostMemory::allocate(std::size_t bytes) {
  return allocate_host_block(bytes);
}
void HostMemory::release(void* pointer, std::size_t bytes) {
  release_host_block(pointer, bytes);
}
// A tensor of no elements has no memory: memcpy's pointers must not be null even for 0 bytes.
void HostMemory::copy_from_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void HostMemory::copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void HostMemory::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void HostMemory::fill(float* dst, int64_t n, float value) {
  cpu::fill(dst, n, value);
}
void HostMemory::add_scalar(float* y, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) y[i] += value;
}
void HostMemory::to_half(const float* x, uint16_t* y, int64_t n, float scale, HalfFormat format) {
  floats_to_halves(x, y, n, scale, format);
}
void HostMemory::from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) {
  halves_to_floats(x, y, n, format);
}

void CpuBackend::matmul(const float* a, const float* b, float* y, MatmulShape s) {
  cpu::matmul(a, b, y, s);
}
void CpuBackend::matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                                 MatmulShape s) {
  cpu::matmul_backward(gy, a, b, ga, gb, s);
}
void CpuBackend::linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) {
  cpu::linear(x, w, bias, y, s);
}
void CpuBackend::linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw,
                                 float* gbias, LinearShape s) {
  cpu::linear_backward(gy, x, w, gx, gw, gbias, s);
}
void CpuBackend::add_bias(const float* x, const float* bias, float* y, BiasShape s) {
  cpu::add_bias(x, bias, y, s);
}
void CpuBackend::add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) {
  cpu::add_bias_backward(gy, gx, gbias, s);
}
void CpuBackend::conv2d(const float* x, const float* w, const float* bias, float* y,
                        const Conv2dGeometry& g) {
  cpu::conv2d(x, w, bias, y, g);
}
void CpuBackend::conv2d_backward(const float* gy, const float* x, const float* w, const float* y,
                                 GradientOut gx, float* gw, float* gbias, const Conv2dGeometry& g) {
  cpu::conv2d_backward(gy, x, w, y, gx, gw, gbias, g);
}
void CpuBackend::maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) {
  cpu::maxpool2d(x, y, argmax, g);
}
void CpuBackend::conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y,
                                     int32_t* argmax, const ConvPoolGeometry& g) {
  cpu::conv2d_relu_maxpool(x, w, bias, y, argmax, g);
}
void CpuBackend::conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y,
                                              const float* x, const float* w, GradientOut gx, float* gw,
                                              float* gbias, const ConvPoolGeometry& g) {
  cpu::conv2d_relu_maxpool_backward(gy, argmax, y, x, w, gx, gw, gbias, g);
}
void CpuBackend::maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                                    const Pool2dGeometry& g) {
  cpu::maxpool2d_backward(gy, argmax, gx, g);
}
void CpuBackend::activation(Activation f, const float* x, float* y, int64_t n) {
  cpu::activation(f, x, y, n);
}
void CpuBackend::activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx,
                                     int64_t n) {
  cpu::activation_backward(f, x, y, gy, gx, n);
}
void CpuBackend::dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) {
  cpu::dropout(x, y, mask, n, p, rng_state);
}
void CpuBackend::dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) {
  cpu::dropout_backward(gy, mask, gx, n);
}
void CpuBackend::add(const float* x, float* y, int64_t n) {
  cpu::add(x, y, n);
}
void CpuBackend::cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs,
                               float* loss, int64_t batch, int64_t classes) {
  cpu::cross_entropy(logits, labels, probs, loss, batch, classes);
}
void CpuBackend::cross_entropy_backward(const float* probs, std::span<const int32_t> labels,
                                        const float* gloss, float* glogits, int64_t batch, int64_t classes) {
  cpu::cross_entropy_backward(probs, labels, gloss, glogits, batch, classes);
}
void CpuBackend::mse(const float* prediction, const float* target, float* loss, int64_t n) {
  cpu::mse(prediction, target, loss, n);
}
void CpuBackend::mse_backward(const float* prediction, const float* target, const float* gloss,
                              float* gprediction, int64_t n) {
  cpu::mse_backward(prediction, target, gloss, gprediction, n);
}
void CpuBackend::batchnorm_sums(const float* x, double* sums, BatchNormShape s) {
  cpu::batchnorm_sums(x, sums, s);
}
void CpuBackend::batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) {
  cpu::batchnorm_squares(x, sums, squares, s);
}
void CpuBackend::batchnorm_batch_stats(const double* sums, const double* squares, float* stats,
                                       float* running_mean, float* running_var, int64_t channels, float eps,
                                       float momentum) {
  cpu::batchnorm_batch_stats(sums, squares, stats, running_mean, running_var, channels, eps, momentum);
}
void CpuBackend::batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                                         int64_t channels, float eps) {
  cpu::batchnorm_running_stats(running_mean, running_var, stats, channels, eps);
}
void CpuBackend::batchnorm_normalize(const float* x, const float* stats, const float* gamma,
                                     const float* beta, float* y, BatchNormShape s,
                                     BatchNormEpilogue epilogue) {
  cpu::batchnorm_normalize(x, stats, gamma, beta, y, s, epilogue);
}
void CpuBackend::batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x,
                                           const float* stats, double* grad_sums, float* ggamma, float* gbeta,
                                           GradientOut gresidual, BatchNormShape s) {
  cpu::batchnorm_backward_reduce(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, s);
}
void CpuBackend::batchnorm_backward_input(const float* gy, const float* relu_y, const float* x,
                                          const float* stats, const float* gamma, const double* grad_sums,
                                          const double* sums, GradientOut gx, BatchNormShape s) {
  cpu::batchnorm_backward_input(gy, relu_y, x, stats, gamma, grad_sums, sums, gx, s);
}
void CpuBackend::batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                                         double* squares, float* stats, float* running_mean,
                                         float* running_var, float* y, BatchNormShape s,
                                         BatchNormEpilogue epilogue, float eps, float momentum) {
  cpu::batchnorm_train_forward(x, gamma, beta, sums, squares, stats, running_mean, running_var, y, s,
                               epilogue, eps, momentum);
}
void CpuBackend::batchnorm_train_backward(const float* gy, const float* relu_y, const float* x,
                                          const float* stats, const float* gamma, const double* sums,
                                          double* grad_sums, float* ggamma, float* gbeta,
                                          GradientOut gresidual, GradientOut gx, BatchNormShape s) {
  cpu::batchnorm_train_backward(gy, relu_y, x, stats, gamma, sums, grad_sums, ggamma, gbeta, gresidual, gx,
                                s);
}
void CpuBackend::mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) {
  cpu::mean_planes(x, y, planes, plane_size);
}
void CpuBackend::mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) {
  cpu::mean_planes_backward(gy, gx, planes, plane_size);
}
void CpuBackend::sum(const float* x, float* out, int64_t n) {
  cpu::sum(x, out, n);
}
void CpuBackend::sum_backward(const float* gout, float* gx, int64_t n) {
  add_scalar(gx, n, gout[0]);
}
bool CpuBackend::all_finite(const float* x, int64_t n) {
  return cpu::all_finite(x, n);
}
double CpuBackend::sum_of_squares(const float* x, int64_t n) {
  return cpu::sum_of_squares(x, n);
}
void CpuBackend::sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                          const SgdStep& s) {
  cpu::sgd_step(params, grads, momentum_buffer, n, s);
}
void CpuBackend::adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                           const AdamStep& s) {
  cpu::adam_step(params, grads, exp_avg, exp_avg_sq, n, s);
}

}  // namespace dptrain::cpu
