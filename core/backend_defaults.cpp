// The backend table's defaults: the fused kernels as the separate kernels in sequence, with scratch
// buffers from the storage cache (a file of its own because Storage sits above core/backend.h), and
// the flag and metric ops computed on the host.
#include <algorithm>
#include <new>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/storage.h"

namespace dptrain {

void Backend::conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y,
                                  int32_t* argmax, const ConvPoolGeometry& g) {
  DPTRAIN_CHECK(g.conv.fuse_relu, "conv2d_relu_maxpool: the geometry must have fuse_relu set");
  Storage conv_out(sizeof(float) * g.conv.batch * g.conv.out_channels * g.conv.pixels(), device());
  conv2d(x, w, bias, conv_out.as<float>(), g.conv);
  maxpool2d(conv_out.as<float>(), y, argmax, g.pool);
}

void Backend::conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y,
                                           const float* x, const float* w, GradientOut gx, float* gw,
                                           float* gbias, const ConvPoolGeometry& g) {
  // The separate kernels' backward reads the conv output only for ReLU's mask (output > 0), and only
  // where gradient arrives: at the windows' winners, whose output is the pooled value. Scattering y
  // like the gradient gives a tensor that is > 0 exactly there (a sum of copies of one value >= 0),
  // so conv2d_backward's own select runs on the same gradient: the same bits, Inf and NaN included.
  const int64_t conv_elements = g.conv.batch * g.conv.out_channels * g.conv.pixels();
  Storage gconv(sizeof(float) * conv_elements, device()), mask(sizeof(float) * conv_elements, device());
  fill(gconv.as<float>(), conv_elements, 0.0f);
  maxpool2d_backward(gy, argmax, gconv.as<float>(), g.pool);
  fill(mask.as<float>(), conv_elements, 0.0f);
  maxpool2d_backward(y, argmax, mask.as<float>(), g.pool);
  conv2d_backward(gconv.as<float>(), x, w, mask.as<float>(), gx, gw, gbias, g.conv);
}

void Backend::batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                                      double* squares, float* stats, float* running_mean, float* running_var,
                                      float* y, BatchNormShape s, BatchNormEpilogue epilogue, float eps,
                                      float momentum) {
  batchnorm_sums(x, sums, s);
  batchnorm_squares(x, sums, squares, s);
  batchnorm_batch_stats(sums, squares, stats, running_mean, running_var, s.channels, eps, momentum);
  batchnorm_normalize(x, stats, gamma, beta, y, s, epilogue);
}

void Backend::batchnorm_train_backward(const float* gy, const float* relu_y, const float* x,
                                       const float* stats, const float* gamma, const double* sums,
                                       double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                                       GradientOut gx, BatchNormShape s) {
  batchnorm_backward_reduce(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, s);
  if (gx) batchnorm_backward_input(gy, relu_y, x, stats, gamma, grad_sums, sums, gx, s);
}

void* Backend::upload(const void* host_src, std::size_t bytes) {
  void* p = allocate(bytes);
  try {
    copy_from_host(p, host_src, bytes);
  } catch (...) {
    release(p, bytes);
    throw;
  }
  return p;
}

void* Backend::allocate_host(std::size_t bytes) {
  return ::operator new (bytes, std::align_val_t{64});
}

void Backend::release_host(void* pointer) {
  ::operator delete (pointer, std::align_val_t{64});
}

void Backend::mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value) {
  int32_t current = 0;
  copy_to_host(&current, flag, sizeof current);
  if (current == 0 && !all_finite(x, n)) copy_from_host(flag, &value, sizeof value);
}

void Backend::count_correct(const float* logits, std::span<const int32_t> labels, int64_t classes,
                            float* out) {
  std::vector<float> values(labels.size() * static_cast<std::size_t>(classes));
  copy_to_host(values.data(), logits, values.size() * sizeof(float));
  int64_t correct = 0;
  for (std::size_t b = 0; b < labels.size(); ++b) {
    const float* row = values.data() + b * static_cast<std::size_t>(classes);
    correct += (std::max_element(row, row + classes) - row) == labels[b];
  }
  const auto count = static_cast<float>(correct);
  copy_from_host(out, &count, sizeof count);
}

}  // namespace dptrain
