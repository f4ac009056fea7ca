// The differentiable ops, device-neutral: checks, outputs on the inputs' device, backend kernels,
// and backward closures on the tape.
#include "core/ops.h"

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "core/tensor_access.h"

namespace dptrain::ops {
namespace {

// The backend of the device every defined tensor among `tensors` lives on.
Backend& backend_of(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    DPTRAIN_CHECK(t->device() == first->device(), op, ": inputs on ", first->device().str(), " and ",
                  t->device().str(), "; move them to one device first (Tensor::to)");
  }
  DPTRAIN_CHECK(first != nullptr, op, ": no input");
  return backend_for(first->device());
}

// The gradient buffer of `t` where it lives, or null when no gradient is wanted.
float* grad_if_wanted(const Tensor& t) {
  return t.defined() && t.requires_grad() ? t.grad_ptr() : nullptr;
}
// The same for a kernel that can write the gradient: a buffer made now skips grad_ptr()'s zeroing
// and is written by the kernel, since nothing has contributed to it yet (the first of a tensor's
// uses to run backward); one that exists already (another use came first, or a parameter's, which
// accumulates over micro-batches) is added into.
GradientOut gradient_out_if_wanted(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  StoragePtr& grad = TensorAccess::grad(TensorAccess::impl(t));
  if (grad) return {grad->as<float>(), false};
  grad = make_storage(sizeof(float) * static_cast<std::size_t>(t.numel()), t.device());
  return {grad->as<float>(), true};
}
const float* data_if_defined(const Tensor& t) {
  return t.defined() ? t.data_ptr() : nullptr;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  Backend& backend = backend_of("matmul", {&a, &b});
  DPTRAIN_CHECK(a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == b.dim(0), "matmul: shapes ",
                shape_str(a.shape()), " and ", shape_str(b.shape()), " do not chain");
  const MatmulShape s{a.dim(0), a.dim(1), b.dim(1)};
  Tensor out = Tensor::empty({s.m, s.n}, a.device());
  backend.matmul(a.data_ptr(), b.data_ptr(), out.data_ptr(), s);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(out, {&a, &b}, [&backend, a, b, out, s] {
      backend.matmul_backward(out.grad_ptr(), a.data_ptr(), b.data_ptr(), grad_if_wanted(a),
                              grad_if_wanted(b), s);
    });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Backend& backend = backend_of("linear", {&x, &weight, &bias});
  DPTRAIN_CHECK(x.ndim() == 2 && weight.ndim() == 2 && x.dim(1) == weight.dim(1), "linear: input ",
                shape_str(x.shape()), " does not match weight ", shape_str(weight.shape()), " ([out, in])");
  const LinearShape s{x.dim(0), x.dim(1), weight.dim(0)};
  DPTRAIN_CHECK(!bias.defined() || (bias.ndim() == 1 && bias.dim(0) == s.out), "linear: bias ",
                shape_str(bias.shape()), " does not match ", s.out, " outputs");
  Tensor out = Tensor::empty({s.batch, s.out}, x.device());
  backend.linear(x.data_ptr(), weight.data_ptr(), data_if_defined(bias), out.data_ptr(), s);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(out, {&x, &weight, &bias}, [&backend, x, weight, bias, out, s] {
      backend.linear_backward(out.grad_ptr(), x.data_ptr(), weight.data_ptr(), grad_if_wanted(x),
                              grad_if_wanted(weight), grad_if_wanted(bias), s);
    });
  }
  return out;
}

Tensor add_bias(const Tensor& x, const Tensor& bias) {
  Backend& backend = backend_of("add_bias", {&x, &bias});
  DPTRAIN_CHECK(x.ndim() >= 2 && bias.ndim() == 1 && bias.dim(0) == x.dim(1), "add_bias: bias ",
                shape_str(bias.shape()), " does not match dimension 1 of ", shape_str(x.shape()));
  const int64_t outer = x.dim(0), channels = x.dim(1);
  const BiasShape s{outer, channels, outer * channels == 0 ? 0 : x.numel() / (outer * channels)};
  Tensor out = Tensor::empty(x.shape(), x.device());
  backend.add_bias(x.data_ptr(), bias.data_ptr(), out.data_ptr(), s);
  if (autograd::any_requires_grad({&x, &bias})) {
    autograd::record(out, {&x, &bias}, [&backend, x, bias, out, s] {
      backend.add_bias_backward(out.grad_ptr(), grad_if_wanted(x), grad_if_wanted(bias), s);
    });
  }
  return out;
}

namespace {

Conv2dGeometry conv2d_geometry(const Tensor& x, const Tensor& weight, const Tensor& bias,
                               Conv2dOptions options) {
  DPTRAIN_CHECK(x.ndim() == 4, "conv2d: input must be [B, C, H, W], got ", shape_str(x.shape()));
  DPTRAIN_CHECK(weight.ndim() == 4 && weight.dim(1) == x.dim(1), "conv2d: weight ", shape_str(weight.shape()),
                " ([out_c, in_c, kh, kw]) does not match input ", shape_str(x.shape()));
  DPTRAIN_CHECK(options.stride >= 1 && options.padding >= 0, "conv2d: stride must be >= 1 and padding >= 0");
  Conv2dGeometry g{x.dim(0),      x.dim(1), x.dim(2), x.dim(3),       weight.dim(0),   weight.dim(2),
                   weight.dim(3), 0,        0,        options.stride, options.padding, options.fuse_relu};
  g.out_h = (g.height + 2 * g.padding - g.kernel_h) / g.stride + 1;
  g.out_w = (g.width + 2 * g.padding - g.kernel_w) / g.stride + 1;
  DPTRAIN_CHECK(g.height + 2 * g.padding >= g.kernel_h && g.width + 2 * g.padding >= g.kernel_w,
                "conv2d: kernel ", g.kernel_h, "x", g.kernel_w, " does not fit input ", shape_str(x.shape()),
                " with padding ", g.padding);
  DPTRAIN_CHECK(!bias.defined() || (bias.ndim() == 1 && bias.dim(0) == g.out_channels), "conv2d: bias ",
                shape_str(bias.shape()), " does not match ", g.out_channels, " output channels");
  return g;
}

// Pooling of the planes of an input [batch, channels, height, width].
Pool2dGeometry maxpool2d_geometry(const Shape& x, MaxPool2dOptions o) {
  DPTRAIN_CHECK(x.size() == 4, "maxpool2d: input must be [B, C, H, W], got ", shape_str(x));
  DPTRAIN_CHECK(o.kernel >= 1 && o.stride >= 1, "maxpool2d: kernel and stride must be >= 1");
  DPTRAIN_CHECK(o.padding >= 0 && 2 * o.padding <= o.kernel, "maxpool2d: padding ", o.padding,
                " must lie in [0, kernel / 2] (kernel ", o.kernel, ")");
  DPTRAIN_CHECK(x[2] + 2 * o.padding >= o.kernel && x[3] + 2 * o.padding >= o.kernel, "maxpool2d: kernel ",
                o.kernel, " larger than input ", shape_str(x), " with padding ", o.padding);
  return {x[0] * x[1],
          x[2],
          x[3],
          (x[2] + 2 * o.padding - o.kernel) / o.stride + 1,
          (x[3] + 2 * o.padding - o.kernel) / o.stride + 1,
          o.kernel,
          o.stride,
          o.padding};
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions options) {
  Backend& backend = backend_of("conv2d", {&x, &weight, &bias});
  const Conv2dGeometry g = conv2d_geometry(x, weight, bias, options);
  Tensor out = Tensor::empty({g.batch, g.out_channels, g.out_h, g.out_w}, x.device());
  backend.conv2d(x.data_ptr(), weight.data_ptr(), data_if_defined(bias), out.data_ptr(), g);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(out, {&x, &weight, &bias}, [&backend, x, weight, bias, out, g] {
      backend.conv2d_backward(out.grad_ptr(), x.data_ptr(), weight.data_ptr(), out.data_ptr(),
                              gradient_out_if_wanted(x), grad_if_wanted(weight), grad_if_wanted(bias), g);
    });
  }
  return out;
}

Tensor maxpool2d(const Tensor& x, int kernel, int stride, int padding) {
  Backend& backend = backend_of("maxpool2d", {&x});
  const Pool2dGeometry g = maxpool2d_geometry(x.shape(), {kernel, stride, padding});
  Tensor out = Tensor::empty({x.dim(0), x.dim(1), g.out_h, g.out_w}, x.device());
  const bool track = autograd::any_requires_grad({&x});
  // Position of each output's winner within its input plane, kept for backward.
  StoragePtr argmax = track ? make_storage(sizeof(int32_t) * out.numel(), x.device()) : nullptr;
  backend.maxpool2d(x.data_ptr(), out.data_ptr(), track ? argmax->as<int32_t>() : nullptr, g);
  if (track) {
    autograd::record(out, {&x}, [&backend, x, out, argmax, g] {
      backend.maxpool2d_backward(out.grad_ptr(), argmax->as<int32_t>(), x.grad_ptr(), g);
    });
  }
  return out;
}

Tensor conv2d_relu_maxpool(const Tensor& x, const Tensor& weight, const Tensor& bias, Conv2dOptions conv,
                           MaxPool2dOptions pool) {
  Backend& backend = backend_of("conv2d_relu_maxpool", {&x, &weight, &bias});
  conv.fuse_relu = true;
  ConvPoolGeometry g{conv2d_geometry(x, weight, bias, conv), {}};
  g.pool = maxpool2d_geometry({g.conv.batch, g.conv.out_channels, g.conv.out_h, g.conv.out_w}, pool);
  Tensor out = Tensor::empty({g.conv.batch, g.conv.out_channels, g.pool.out_h, g.pool.out_w}, x.device());
  const bool track = autograd::any_requires_grad({&x, &weight, &bias});
  StoragePtr argmax = track ? make_storage(sizeof(int32_t) * out.numel(), x.device()) : nullptr;
  backend.conv2d_relu_maxpool(x.data_ptr(), weight.data_ptr(), data_if_defined(bias), out.data_ptr(),
                              track ? argmax->as<int32_t>() : nullptr, g);
  if (track) {
    autograd::record(out, {&x, &weight, &bias}, [&backend, x, weight, bias, out, argmax, g] {
      backend.conv2d_relu_maxpool_backward(out.grad_ptr(), argmax->as<int32_t>(), out.data_ptr(),
                                           x.data_ptr(), weight.data_ptr(), gradient_out_if_wanted(x),
                                           grad_if_wanted(weight), grad_if_wanted(bias), g);
    });
  }
  return out;
}

Tensor global_avgpool(const Tensor& x) {
  Backend& backend = backend_of("global_avgpool", {&x});
  DPTRAIN_CHECK(x.ndim() == 4, "global_avgpool: input must be [B, C, H, W], got ", shape_str(x.shape()));
  const int64_t planes = x.dim(0) * x.dim(1), plane_size = x.dim(2) * x.dim(3);
  DPTRAIN_CHECK(plane_size > 0, "global_avgpool: empty planes in ", shape_str(x.shape()));
  Tensor out = Tensor::empty({x.dim(0), x.dim(1)}, x.device());
  backend.mean_planes(x.data_ptr(), out.data_ptr(), planes, plane_size);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [&backend, x, out, planes, plane_size] {
      backend.mean_planes_backward(out.grad_ptr(), x.grad_ptr(), planes, plane_size);
    });
  }
  return out;
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormOptions& o) {
  Backend& backend = backend_of("batch_norm", {&x, &weight, &bias, &running_mean, &running_var, &o.residual});
  DPTRAIN_CHECK(x.ndim() >= 2, "batch_norm: input must be [B, C, ...], got ", shape_str(x.shape()));
  const int64_t channels = x.dim(1);
  const auto per_channel = [&](const Tensor& t) { return t.ndim() == 1 && t.dim(0) == channels; };
  DPTRAIN_CHECK(weight.defined() && bias.defined() && per_channel(weight) && per_channel(bias),
                "batch_norm: weight and bias must be [", channels, "] for input ", shape_str(x.shape()));
  DPTRAIN_CHECK(running_mean.defined() == running_var.defined() &&
                    (!running_mean.defined() || (per_channel(running_mean) && per_channel(running_var))),
                "batch_norm: running_mean and running_var must both be [", channels, "] or both absent");
  DPTRAIN_CHECK(!o.residual.defined() || o.residual.shape() == x.shape(), "batch_norm: residual ",
                shape_str(o.residual.shape()), " for input ", shape_str(x.shape()), "; they must match");
  DPTRAIN_CHECK(o.training || running_mean.defined(), "batch_norm: evaluation needs running statistics");
  const BatchNormShape s{x.dim(0), channels,
                         x.dim(0) * channels == 0 ? 0 : x.numel() / (x.dim(0) * channels)};
  DPTRAIN_CHECK(!o.training || s.batch * s.inner > 1, "batch_norm: ", s.batch * s.inner,
                " value(s) per channel in training mode (input ", shape_str(x.shape()),
                "); a variance needs more than 1");
  const Device device = x.device();
  StoragePtr sums = make_storage(sizeof(double) * (channels + 1), device);
  StoragePtr stats = make_storage(sizeof(float) * 2 * channels, device);
  Tensor out = Tensor::empty(x.shape(), device);
  const Tensor residual = o.residual;
  const BatchNormEpilogue epilogue{.residual = data_if_defined(residual), .relu = o.relu};
  float* const running_mean_data = running_mean.defined() ? running_mean.data_ptr() : nullptr;
  float* const running_var_data = running_var.defined() ? running_var.data_ptr() : nullptr;
  if (o.training && !o.sync) {
    StoragePtr squares = make_storage(sizeof(double) * channels, device);
    backend.batchnorm_train_forward(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), sums->as<double>(),
                                    squares->as<double>(), stats->as<float>(), running_mean_data,
                                    running_var_data, out.data_ptr(), s, epilogue, o.eps, o.momentum);
  } else {
    if (o.training) {  // SyncBatchNorm: every rank's sums, then squares around the global mean
      StoragePtr squares = make_storage(sizeof(double) * channels, device);
      backend.batchnorm_sums(x.data_ptr(), sums->as<double>(), s);
      o.sync->sum(sums->as<double>(), channels + 1, device, "SyncBatchNorm sums");
      backend.batchnorm_squares(x.data_ptr(), sums->as<double>(), squares->as<double>(), s);
      o.sync->sum(squares->as<double>(), channels, device, "SyncBatchNorm squares");
      backend.batchnorm_batch_stats(sums->as<double>(), squares->as<double>(), stats->as<float>(),
                                    running_mean_data, running_var_data, channels, o.eps, o.momentum);
    } else {
      backend.batchnorm_running_stats(running_mean.data_ptr(), running_var.data_ptr(), stats->as<float>(),
                                      channels, o.eps);
    }
    backend.batchnorm_normalize(x.data_ptr(), stats->as<float>(), weight.data_ptr(), bias.data_ptr(),
                                out.data_ptr(), s, epilogue);
  }
  if (autograd::any_requires_grad({&x, &weight, &bias, &residual})) {
    const bool training = o.training, relu = o.relu;
    CrossReplicaSum* sync = o.sync;
    autograd::record(
        out, {&x, &weight, &bias, &residual},
        [&backend, x, weight, bias, residual, out, sums, stats, s, training, relu, sync] {
          StoragePtr grad_sums = make_storage(sizeof(double) * 2 * s.channels, x.device());
          // ReLU's mask is read from the output: positive exactly where its input was.
          const float* relu_y = relu ? out.data_ptr() : nullptr;
          // weight and bias take this replica's sums: the gradient reduction adds the
          // replicas' later.
          if (training && !sync) {
            // The residual's gradient first, as below: were it x itself, x's would add to it.
            const GradientOut gresidual = gradient_out_if_wanted(residual);
            const GradientOut gx = gradient_out_if_wanted(x);
            backend.batchnorm_train_backward(out.grad_ptr(), relu_y, x.data_ptr(), stats->as<float>(),
                                             weight.data_ptr(), sums->as<double>(), grad_sums->as<double>(),
                                             grad_if_wanted(weight), grad_if_wanted(bias), gresidual, gx, s);
            return;
          }
          backend.batchnorm_backward_reduce(out.grad_ptr(), relu_y, x.data_ptr(), stats->as<float>(),
                                            grad_sums->as<double>(), grad_if_wanted(weight),
                                            grad_if_wanted(bias), gradient_out_if_wanted(residual), s);
          if (!x.requires_grad()) return;
          // The input gradient sees the whole batch's sums: each rank's gy holds only its
          // own loss's part.
          if (training && sync)
            sync->sum(grad_sums->as<double>(), 2 * s.channels, x.device(), "SyncBatchNorm grad sums");
          backend.batchnorm_backward_input(out.grad_ptr(), relu_y, x.data_ptr(), stats->as<float>(),
                                           weight.data_ptr(), training ? grad_sums->as<double>() : nullptr,
                                           training ? sums->as<double>() : nullptr, gradient_out_if_wanted(x),
                                           s);
        });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  Backend& backend = backend_of("add", {&a, &b});
  DPTRAIN_CHECK(a.shape() == b.shape(), "add: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
                " differ");
  const int64_t n = a.numel();
  Tensor out = Tensor::empty(a.shape(), a.device());
  backend.copy(out.data_ptr(), a.data_ptr(), sizeof(float) * n);
  backend.add(b.data_ptr(), out.data_ptr(), n);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(out, {&a, &b}, [&backend, a, b, out, n] {
      if (a.requires_grad()) backend.add(out.grad_ptr(), a.grad_ptr(), n);
      if (b.requires_grad()) backend.add(out.grad_ptr(), b.grad_ptr(), n);
    });
  }
  return out;
}

Tensor activation(const Tensor& x, Activation f) {
  Backend& backend = backend_of("activation", {&x});
  Tensor out = Tensor::empty(x.shape(), x.device());
  const int64_t n = x.numel();
  backend.activation(f, x.data_ptr(), out.data_ptr(), n);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [&backend, f, x, out, n] {
      backend.activation_backward(f, x.data_ptr(), out.data_ptr(), out.grad_ptr(), x.grad_ptr(), n);
    });
  }
  return out;
}

Tensor reshape(const Tensor& x, Shape shape) {
  Tensor out = x.view(std::move(shape));
  if (autograd::any_requires_grad({&x})) {
    Backend& backend = backend_of("reshape", {&x});
    autograd::record(out, {&x}, [&backend, x, out] { backend.add(out.grad_ptr(), x.grad_ptr(), x.numel()); });
  }
  return out;
}

Tensor flatten(const Tensor& x) {
  DPTRAIN_CHECK(x.ndim() >= 1, "flatten: needs a batch dimension");
  return reshape(x, {x.dim(0), x.numel() / std::max<int64_t>(x.dim(0), 1)});
}

Tensor dropout(const Tensor& x, float p, Rng& rng) {
  DPTRAIN_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got ", p);
  Backend& backend = backend_of("dropout", {&x});
  const int64_t n = x.numel();
  Tensor mask = Tensor::empty(x.shape(), x.device()), out = Tensor::empty(x.shape(), x.device());
  backend.dropout(x.data_ptr(), out.data_ptr(), mask.data_ptr(), n, p, rng.state());
  rng.skip(static_cast<uint64_t>(n));
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x}, [&backend, x, out, mask, n] {
      backend.dropout_backward(out.grad_ptr(), mask.data_ptr(), x.grad_ptr(), n);
    });
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, std::span<const int32_t> labels) {
  Backend& backend = backend_of("cross_entropy", {&logits});
  DPTRAIN_CHECK(logits.ndim() == 2, "cross_entropy: logits must be [B, C], got ", shape_str(logits.shape()));
  const int64_t batch = logits.dim(0), classes = logits.dim(1);
  DPTRAIN_CHECK(static_cast<int64_t>(labels.size()) == batch, "cross_entropy: ", labels.size(),
                " labels for a batch of ", batch);
  DPTRAIN_CHECK(batch > 0, "cross_entropy: empty batch");
  for (const int32_t label : labels)
    DPTRAIN_CHECK(label >= 0 && label < classes, "cross_entropy: label ", label, " outside [0, ", classes,
                  ")");
  // Softmax probabilities are kept for backward: d loss / d logits = (softmax - onehot) / B.
  Tensor probs = Tensor::empty(logits.shape(), logits.device()), out = Tensor::empty({1}, logits.device());
  backend.cross_entropy(logits.data_ptr(), labels, probs.data_ptr(), out.data_ptr(), batch, classes);
  if (autograd::any_requires_grad({&logits})) {
    std::vector<int32_t> kept(labels.begin(), labels.end());
    autograd::record(out, {&logits}, [&backend, logits, out, probs, kept = std::move(kept), batch, classes] {
      backend.cross_entropy_backward(probs.data_ptr(), kept, out.grad_ptr(), logits.grad_ptr(), batch,
                                     classes);
    });
  }
  return out;
}

Tensor mse(const Tensor& prediction, const Tensor& target) {
  Backend& backend = backend_of("mse", {&prediction, &target});
  DPTRAIN_CHECK(prediction.shape() == target.shape(), "mse: prediction ", shape_str(prediction.shape()),
                " and target ", shape_str(target.shape()), " differ");
  const int64_t n = prediction.numel();
  Tensor out = Tensor::empty({1}, prediction.device());
  backend.mse(prediction.data_ptr(), target.data_ptr(), out.data_ptr(), n);
  if (autograd::any_requires_grad({&prediction})) {
    autograd::record(out, {&prediction}, [&backend, prediction, target, out, n] {
      backend.mse_backward(prediction.data_ptr(), target.data_ptr(), out.grad_ptr(), prediction.grad_ptr(),
                           n);
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  Backend& backend = backend_of("sum", {&x});
  const int64_t n = x.numel();
  Tensor out = Tensor::empty({1}, x.device());
  backend.sum(x.data_ptr(), out.data_ptr(), n);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(out, {&x},
                     [&backend, x, out, n] { backend.sum_backward(out.grad_ptr(), x.grad_ptr(), n); });
  }
  return out;
}

}  // namespace dptrain::ops
