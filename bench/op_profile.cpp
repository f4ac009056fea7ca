// The per-op profile: a timing decorator of a backend (CPU or GPU) and the tables it prints.
#include "bench/op_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "trainer/devices.h"

namespace dptrain::bench {
namespace {

std::string conv_kind(const Conv2dGeometry& g) {
  return "conv " + std::to_string(g.kernel_h) + "x" + std::to_string(g.kernel_w) + "/" +
         std::to_string(g.stride);
}

std::string conv_shape(const Conv2dGeometry& g) {
  return conv_kind(g) + " " + std::to_string(g.channels) + "->" + std::to_string(g.out_channels) + " " +
         std::to_string(g.out_h) + "x" + std::to_string(g.out_w) + " b" + std::to_string(g.batch);
}

// Multiply-adds of the forward pass, two FLOPs each; backward does this once per wanted gradient.
double conv_flops(const Conv2dGeometry& g) {
  return 2.0 * static_cast<double>(g.batch * g.out_channels * g.pixels() * g.patch());
}

int wanted(const void* a, const void* b) {
  return (a != nullptr) + (b != nullptr);
}

std::string activation_name(Activation f) {
  switch (f) {
    case Activation::kRelu:
      return "relu";
    case Activation::kTanh:
      return "tanh";
    case Activation::kSigmoid:
      return "sigmoid";
  }
  return "activation";
}

class ProfilingBackend final : public Backend {
 public:
  ProfilingBackend(Backend& inner, OpProfile& profile) : inner_(inner), profile_(profile) {}

  Device device() const override { return inner_.device(); }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    timed("allocate", "", 0, [&] { p = inner_.allocate(bytes); });
    return p;
  }
  void release(void* pointer, std::size_t bytes) override {
    timed("allocate", "", 0, [&] { inner_.release(pointer, bytes); });
  }
  void copy_from_host(void* dst, const void* src, std::size_t bytes) override {
    timed("upload", "", 0, [&] { inner_.copy_from_host(dst, src, bytes); });
  }
  // The backend's own batch upload (the GPU's overlaps the step before), not the default's allocate
  // and copy_from_host on this wrapper.
  void* upload(const void* host_src, std::size_t bytes) override {
    void* p = nullptr;
    timed("upload", "", 0, [&] { p = inner_.upload(host_src, bytes); });
    return p;
  }
  // The loader's slots as the backend keeps them (a GPU's are uploaded in place), so that the profile
  // times the data path that training takes.
  void* allocate_host(std::size_t bytes) override { return inner_.allocate_host(bytes); }
  void release_host(void* pointer) override { inner_.release_host(pointer); }
  void wait_for_uploads() override { inner_.wait_for_uploads(); }
  void copy_to_host(void* dst, const void* src, std::size_t bytes) override {
    timed("download", "", 0, [&] { inner_.copy_to_host(dst, src, bytes); });
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    timed("copy", "", 0, [&] { inner_.copy(dst, src, bytes); });
  }
  void fill(float* dst, int64_t n, float value) override {
    timed("fill", "", 0, [&] { inner_.fill(dst, n, value); });
  }
  void synchronize() override { inner_.synchronize(); }

  void matmul(const float* a, const float* b, float* y, MatmulShape s) override {
    timed("matmul fwd", "", 2.0 * s.m * s.k * s.n, [&] { inner_.matmul(a, b, y, s); });
  }
  void matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                       MatmulShape s) override {
    timed("matmul bwd", "", 2.0 * s.m * s.k * s.n * wanted(ga, gb),
          [&] { inner_.matmul_backward(gy, a, b, ga, gb, s); });
  }
  void linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) override {
    timed("linear fwd", "", 2.0 * s.batch * s.in * s.out, [&] { inner_.linear(x, w, bias, y, s); });
  }
  void linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw, float* gbias,
                       LinearShape s) override {
    timed("linear bwd", "", 2.0 * s.batch * s.in * s.out * wanted(gx, gw),
          [&] { inner_.linear_backward(gy, x, w, gx, gw, gbias, s); });
  }
  void add_bias(const float* x, const float* bias, float* y, BiasShape s) override {
    timed("bias fwd", "", 0, [&] { inner_.add_bias(x, bias, y, s); });
  }
  void add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) override {
    timed("bias bwd", "", 0, [&] { inner_.add_bias_backward(gy, gx, gbias, s); });
  }

  void conv2d(const float* x, const float* w, const float* bias, float* y, const Conv2dGeometry& g) override {
    timed(conv_kind(g) + " fwd", conv_shape(g) + " fwd", conv_flops(g),
          [&] { inner_.conv2d(x, w, bias, y, g); });
  }
  void conv2d_backward(const float* gy, const float* x, const float* w, const float* y, GradientOut gx,
                       float* gw, float* gbias, const Conv2dGeometry& g) override {
    timed(conv_kind(g) + " bwd", conv_shape(g) + " bwd", conv_flops(g) * wanted(gx.data, gw),
          [&] { inner_.conv2d_backward(gy, x, w, y, gx, gw, gbias, g); });
  }
  void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) override {
    timed("maxpool fwd", "", 0, [&] { inner_.maxpool2d(x, y, argmax, g); });
  }
  void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                          const Pool2dGeometry& g) override {
    timed("maxpool bwd", "", 0, [&] { inner_.maxpool2d_backward(gy, argmax, gx, g); });
  }
  void conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y, int32_t* argmax,
                           const ConvPoolGeometry& g) override {
    timed(conv_kind(g.conv) + "+pool fwd", conv_shape(g.conv) + "+pool fwd", conv_flops(g.conv),
          [&] { inner_.conv2d_relu_maxpool(x, w, bias, y, argmax, g); });
  }
  void conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y, const float* x,
                                    const float* w, GradientOut gx, float* gw, float* gbias,
                                    const ConvPoolGeometry& g) override {
    timed(conv_kind(g.conv) + "+pool bwd", conv_shape(g.conv) + "+pool bwd",
          conv_flops(g.conv) * wanted(gx.data, gw),
          [&] { inner_.conv2d_relu_maxpool_backward(gy, argmax, y, x, w, gx, gw, gbias, g); });
  }

  void batchnorm_sums(const float* x, double* sums, BatchNormShape s) override {
    timed("batchnorm fwd", "", 0, [&] { inner_.batchnorm_sums(x, sums, s); });
  }
  void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) override {
    timed("batchnorm fwd", "", 0, [&] { inner_.batchnorm_squares(x, sums, squares, s); });
  }
  void batchnorm_batch_stats(const double* sums, const double* squares, float* stats, float* running_mean,
                             float* running_var, int64_t channels, float eps, float momentum) override {
    timed("batchnorm fwd", "", 0, [&] {
      inner_.batchnorm_batch_stats(sums, squares, stats, running_mean, running_var, channels, eps, momentum);
    });
  }
  void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                               int64_t channels, float eps) override {
    timed("batchnorm fwd", "", 0,
          [&] { inner_.batchnorm_running_stats(running_mean, running_var, stats, channels, eps); });
  }
  void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta,
                           float* y, BatchNormShape s, BatchNormEpilogue epilogue) override {
    timed("batchnorm fwd", "", 0, [&] { inner_.batchnorm_normalize(x, stats, gamma, beta, y, s, epilogue); });
  }
  void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x, const float* stats,
                                 double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                                 BatchNormShape s) override {
    timed("batchnorm bwd", "", 0, [&] {
      inner_.batchnorm_backward_reduce(gy, relu_y, x, stats, grad_sums, ggamma, gbeta, gresidual, s);
    });
  }
  void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x, const float* stats,
                                const float* gamma, const double* grad_sums, const double* sums,
                                GradientOut gx, BatchNormShape s) override {
    timed("batchnorm bwd", "", 0,
          [&] { inner_.batchnorm_backward_input(gy, relu_y, x, stats, gamma, grad_sums, sums, gx, s); });
  }
  void batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                               double* squares, float* stats, float* running_mean, float* running_var,
                               float* y, BatchNormShape s, BatchNormEpilogue epilogue, float eps,
                               float momentum) override {
    timed("batchnorm fwd", "", 0, [&] {
      inner_.batchnorm_train_forward(x, gamma, beta, sums, squares, stats, running_mean, running_var, y, s,
                                     epilogue, eps, momentum);
    });
  }
  void batchnorm_train_backward(const float* gy, const float* relu_y, const float* x, const float* stats,
                                const float* gamma, const double* sums, double* grad_sums, float* ggamma,
                                float* gbeta, GradientOut gresidual, GradientOut gx,
                                BatchNormShape s) override {
    timed("batchnorm bwd", "", 0, [&] {
      inner_.batchnorm_train_backward(gy, relu_y, x, stats, gamma, sums, grad_sums, ggamma, gbeta, gresidual,
                                      gx, s);
    });
  }

  void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) override {
    timed("avgpool fwd", "", 0, [&] { inner_.mean_planes(x, y, planes, plane_size); });
  }
  void mean_planes_backward(const float* gy, float* gx, int64_t planes, int64_t plane_size) override {
    timed("avgpool bwd", "", 0, [&] { inner_.mean_planes_backward(gy, gx, planes, plane_size); });
  }
  void activation(Activation f, const float* x, float* y, int64_t n) override {
    timed(activation_name(f) + " fwd", "", 0, [&] { inner_.activation(f, x, y, n); });
  }
  void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx,
                           int64_t n) override {
    timed(activation_name(f) + " bwd", "", 0, [&] { inner_.activation_backward(f, x, y, gy, gx, n); });
  }
  void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) override {
    timed("dropout fwd", "", 0, [&] { inner_.dropout(x, y, mask, n, p, rng_state); });
  }
  void dropout_backward(const float* gy, const float* mask, float* gx, int64_t n) override {
    timed("dropout bwd", "", 0, [&] { inner_.dropout_backward(gy, mask, gx, n); });
  }
  void add(const float* x, float* y, int64_t n) override {
    timed("add", "", 0, [&] { inner_.add(x, y, n); });
  }
  void add_scalar(float* y, int64_t n, float value) override {
    timed("add", "", 0, [&] { inner_.add_scalar(y, n, value); });
  }

  void cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs, float* loss,
                     int64_t batch, int64_t classes) override {
    timed("loss fwd", "", 0, [&] { inner_.cross_entropy(logits, labels, probs, loss, batch, classes); });
  }
  void cross_entropy_backward(const float* probs, std::span<const int32_t> labels, const float* gloss,
                              float* glogits, int64_t batch, int64_t classes) override {
    timed("loss bwd", "", 0,
          [&] { inner_.cross_entropy_backward(probs, labels, gloss, glogits, batch, classes); });
  }
  void mse(const float* prediction, const float* target, float* loss, int64_t n) override {
    timed("loss fwd", "", 0, [&] { inner_.mse(prediction, target, loss, n); });
  }
  void mse_backward(const float* prediction, const float* target, const float* gloss, float* gprediction,
                    int64_t n) override {
    timed("loss bwd", "", 0, [&] { inner_.mse_backward(prediction, target, gloss, gprediction, n); });
  }
  void sum(const float* x, float* out, int64_t n) override {
    timed("loss fwd", "", 0, [&] { inner_.sum(x, out, n); });
  }
  void sum_backward(const float* gout, float* gx, int64_t n) override {
    timed("loss bwd", "", 0, [&] { inner_.sum_backward(gout, gx, n); });
  }

  void to_half(const float* x, uint16_t* y, int64_t n, float scale, HalfFormat format) override {
    timed("gradient sync", "", 0, [&] { inner_.to_half(x, y, n, scale, format); });
  }
  void from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) override {
    timed("gradient sync", "", 0, [&] { inner_.from_half(x, y, n, format); });
  }
  double sum_of_squares(const float* x, int64_t n) override {
    double sum = 0;
    timed("optimizer", "", 0, [&] { sum = inner_.sum_of_squares(x, n); });
    return sum;
  }
  bool all_finite(const float* x, int64_t n) override {
    bool finite = true;
    timed("gradient sync", "", 0, [&] { finite = inner_.all_finite(x, n); });
    return finite;
  }
  void mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value) override {
    timed("gradient sync", "", 0, [&] { inner_.mark_non_finite(x, n, flag, value); });
  }
  void count_correct(const float* logits, std::span<const int32_t> labels, int64_t classes,
                     float* out) override {
    timed("metrics", "", 0, [&] { inner_.count_correct(logits, labels, classes, out); });
  }
  void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                const SgdStep& s) override {
    timed("optimizer", "", 0, [&] { inner_.sgd_step(params, grads, momentum_buffer, n, s); });
  }
  void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                 const AdamStep& s) override {
    timed("optimizer", "", 0, [&] { inner_.adam_step(params, grads, exp_avg, exp_avg_sq, n, s); });
  }
  void release_cached() override { inner_.release_cached(); }

 private:
  template <typename Kernel>
  void timed(const std::string& kind, const std::string& shape, double flops, Kernel&& kernel) {
    // A device's queue is drained before the clock starts and after the op, so the time is this op's
    // alone, launch included (host backends return when their kernel has run: both are no-ops).
    inner_.synchronize();
    const auto start = std::chrono::steady_clock::now();
    kernel();
    inner_.synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    profile_.add(kind, shape, seconds, flops);
  }

  Backend& inner_;
  OpProfile& profile_;
};

void print_row(const std::string& name, const OpTotals& t, int64_t steps, double kernel_seconds,
               double gemm_flops_per_second) {
  std::printf("  %-34s %7.1f %9.2f %6.1f%%", name.c_str(), static_cast<double>(t.calls) / steps,
              1e3 * t.seconds / steps, 100 * t.seconds / kernel_seconds);
  if (t.flops > 0 && t.seconds > 0) {
    const double rate = t.flops / t.seconds;
    std::printf(" %8.1f", rate / 1e9);
    if (gemm_flops_per_second > 0) std::printf(" %6.0f%%", 100 * rate / gemm_flops_per_second);
  }
  std::printf("\n");
}

std::vector<std::pair<std::string, OpTotals>> by_time(const std::map<std::string, OpTotals>& totals) {
  std::vector<std::pair<std::string, OpTotals>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  return rows;
}

}  // namespace

void OpProfile::add(const std::string& kind, const std::string& shape, double seconds, double flops) {
  OpTotals& k = by_kind_[kind];
  ++k.calls, k.seconds += seconds, k.flops += flops;
  if (shape.empty()) return;
  OpTotals& s = by_conv_shape_[shape];
  ++s.calls, s.seconds += seconds, s.flops += flops;
}

void OpProfile::reset() {
  by_kind_.clear();
  by_conv_shape_.clear();
}

void OpProfile::print(int64_t steps, double step_seconds, double gemm_flops_per_second) const {
  steps = std::max<int64_t>(steps, 1);
  OpTotals all;
  for (const auto& [kind, t] : by_kind_) all.calls += t.calls, all.seconds += t.seconds, all.flops += t.flops;
  const double kernel_seconds = std::max(all.seconds, 1e-12);
  std::printf(
      "Per-op profile over %lld steps: kernels %.2f ms of %.2f ms per step (%.1f%%; the rest is the\n"
      "framework's: tape, tensors, the step's bookkeeping)\n",
      static_cast<long long>(steps), 1e3 * all.seconds / steps, 1e3 * step_seconds / steps,
      100 * all.seconds / std::max(step_seconds, 1e-12));
  const char* header = "  %-34s %7s %9s %7s %8s %7s\n";
  std::printf(header, "op", "calls", "ms/step", "share", "GFLOP/s", "of GEMM");
  for (const auto& [kind, t] : by_time(by_kind_))
    print_row(kind, t, steps, kernel_seconds, gemm_flops_per_second);
  print_row("all kernels", all, steps, kernel_seconds, gemm_flops_per_second);
  std::printf("Convolutions by shape (out channels, output plane, batch):\n");
  std::printf(header, "conv", "calls", "ms/step", "share", "GFLOP/s", "of GEMM");
  for (const auto& [shape, t] : by_time(by_conv_shape_))
    print_row(shape, t, steps, kernel_seconds, gemm_flops_per_second);
}

nlohmann::json OpProfile::summary(int64_t steps) const {
  steps = std::max<int64_t>(steps, 1);
  double flops = 0, seconds = 0;
  nlohmann::json calls = nlohmann::json::object();
  for (const auto& [kind, t] : by_kind_) {
    flops += t.flops, seconds += t.seconds;
    calls[kind] = static_cast<double>(t.calls) / steps;
  }
  return {{"flops_per_step", flops / steps},
          {"kernel_ms_per_step", 1e3 * seconds / steps},
          {"calls_per_step", calls}};
}

void profile_kernels(const trainer::Config& config, const distributed::World& world, OpProfile& profile) {
  const Device device = trainer::choose_run_device(config, world);
  DPTRAIN_CHECK(
      device.is_host() || world.size() == 1 || config.distributed.backend == trainer::CommBackend::kMpi,
      "--profile-ops on GPUs: NCCL needs the CUDA backend itself; run one rank, or set "
      "distributed.backend=\"mpi\"");
  interpose_backend(device,
                    [&](Backend& inner) { return std::make_shared<ProfilingBackend>(inner, profile); });
}

}  // namespace dptrain::bench
