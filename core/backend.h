// Backend: everything a device provides, in one table. The ops (core/ops.h) check shapes, allocate
// outputs on their inputs' device and record backward on the tape, then call these kernels through
// the backend of that device; so a new device is a new Backend plus a registration, and nothing
// above core changes. Kernels take raw pointers into the device's memory (from Tensor::data_ptr())
// and geometry structs; `g*` pointers that may be null mean "this gradient is not wanted". Backward
// kernels add into the gradients they write (gradients accumulate over uses and passes), except
// that a GradientOut may ask to be written instead; forward kernels overwrite their outputs. Kernels
// may run asynchronously on the device: a result becomes visible to the host through copy_to_host(),
// which waits for it.
//
// A new backend implements every pure virtual below (the fused ops have defaults composed of the
// others) and passes tests/core/backend_conformance_test
// (every op, forward and each input gradient, and both optimizers, against the reference backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/device.h"
#include "core/half.h"
#include "core/update_rules.h"

namespace dptrain {

// y [m, n] = a [m, k] b [k, n]
struct MatmulShape {
  int64_t m, k, n;
};
// y [batch, out] = x [batch, in] w [out, in]^T (+ bias [out])
struct LinearShape {
  int64_t batch, in, out;
};
// y [outer, channels, inner] = x + bias [channels] broadcast over outer and inner
struct BiasShape {
  int64_t outer, channels, inner;
};
// x [batch, channels, height, width] * w [out_channels, channels, kernel_h, kernel_w] (+ bias)
//   -> y [batch, out_channels, out_h, out_w]; with fuse_relu, y = max(0, conv + bias).
struct Conv2dGeometry {
  int64_t batch, channels, height, width;
  int64_t out_channels, kernel_h, kernel_w;
  int64_t out_h, out_w;
  int stride, padding;
  bool fuse_relu;

  int64_t patch() const { return channels * kernel_h * kernel_w; }  // inputs per output element
  int64_t pixels() const { return out_h * out_w; }                  // outputs per sample and channel
};
// Max pooling of `planes` planes [height, width] -> [out_h, out_w]; window (i, j) covers input rows
// i * stride - padding + [0, kernel) (and columns alike), positions outside the plane taking no part
// (PyTorch's implicit -inf padding).
struct Pool2dGeometry {
  int64_t planes, height, width, out_h, out_w;
  int kernel, stride, padding;
};
// conv2d with fuse_relu, then max pooling of its output planes (pool.planes = batch * out_channels,
// pool.height / width = conv.out_h / out_w): y = maxpool(relu(conv2d(x))) [batch, out_channels,
// pool.out_h, pool.out_w]. The conv output (the largest tensor of a small CNN) need not exist.
struct ConvPoolGeometry {
  Conv2dGeometry conv;
  Pool2dGeometry pool;
};
// Batch normalisation of x [batch, channels, inner] per channel over batch and inner (inner = H*W).
// Its statistics travel in small device buffers so that SyncBatchNorm can add them across ranks
// between kernels (PyTorch's batch_norm_stats / _elemt / _backward_reduce / _backward_elemt split).
// The sums are double: N ranks' partial sums added in double round to the same float statistics as
// one rank's sum over the whole batch (all but about one value in 10^8), so SyncBN on N ranks
// normalises exactly as one rank would, and its outputs do not land on the other side of a ReLU.
//   sums [channels + 1]:   sum of x per channel, then the element count per channel
//   squares [channels]:    sum of (x - mean)^2 per channel, mean = sum / count
//   stats [2 * channels]:  mean, then invstd = 1 / sqrt(var + eps), what normalisation used
//   grad_sums [2 * channels]: sum of gy, then sum of gy * (x - mean), per channel
struct BatchNormShape {
  int64_t batch, channels, inner;
};
// What the normalising pass does after the affine transform: y = relu(bn(x) + residual), either
// part optional (ResNet's bn -> relu and bn -> + shortcut -> relu), so that neither bn(x) nor the
// sum is stored and read back. Backward takes the ReLU's mask from y: the normalisation's own
// gradient is 0 + gy * (y > 0 ? 1 : 0), what ReLU's backward adds to a zeroed buffer, bit for bit
// (Inf upstream of an inactive unit still gives NaN there), and the residual's gradient gets it added.
struct BatchNormEpilogue {
  const float* residual = nullptr;
  bool relu = false;
};

enum class Activation { kRelu, kTanh, kSigmoid };

// An input gradient that a backward kernel adds into, or, with `overwrite`, writes: the buffer was
// just made for this, its first contribution, and holds garbage rather than zeros. The values are
// those of adding into zeros (a -0 may stay -0). Where it applies (the large activation gradients of
// convolutions and BatchNorm), the zeroing pass and the kernel's read of those zeros are saved: on a
// GPU, two passes over every activation gradient of a step. From a float*, it adds.
struct GradientOut {
  float* data = nullptr;
  bool overwrite = false;

  GradientOut() = default;
  GradientOut(float* gradient) : data(gradient) {}  // NOLINT(google-explicit-constructor): adds
  GradientOut(float* gradient, bool write) : data(gradient), overwrite(write) {}
  explicit operator bool() const { return data != nullptr; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- memory on this device ----
  // Uninitialised, 64-byte aligned; never null for bytes > 0 (throws instead).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* pointer, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  // A new buffer (freed by release()) holding a copy of `bytes` of host memory, whose copy need not
  // wait for the work queued before it: a GPU copies the next batch while the step before still
  // runs, where copy_from_host() into a buffer of the running step would wait for that step. The
  // default: allocate(), then copy_from_host().
  virtual void* upload(const void* host_src, std::size_t bytes);
  // Host memory that upload() reads in place, for buffers uploaded again and again (the loader's
  // batch slots): page-locked on a GPU, whose copy engine then reads it while the host goes on, so
  // that no thread of the step copies the batch into staging first. Such memory may be rewritten
  // once wait_for_uploads() has returned. The default: aligned host memory, uploads that have read
  // their source when they return.
  virtual void* allocate_host(std::size_t bytes);
  virtual void release_host(void* pointer);
  virtual void wait_for_uploads() {}
  // Returns once the bytes are on the host (after all work queued before it).
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;  // both on this device
  virtual void fill(float* dst, int64_t n, float value) = 0;
  virtual void synchronize() = 0;  // returns when all queued work has finished

  // ---- dense algebra ----
  virtual void matmul(const float* a, const float* b, float* y, MatmulShape s) = 0;
  // ga += gy b^T, gb += a^T gy
  virtual void matmul_backward(const float* gy, const float* a, const float* b, float* ga, float* gb,
                               MatmulShape s) = 0;
  virtual void linear(const float* x, const float* w, const float* bias, float* y, LinearShape s) = 0;
  // gx += gy w, gw += gy^T x, gbias += column sums of gy
  virtual void linear_backward(const float* gy, const float* x, const float* w, float* gx, float* gw,
                               float* gbias, LinearShape s) = 0;
  virtual void add_bias(const float* x, const float* bias, float* y, BiasShape s) = 0;
  virtual void add_bias_backward(const float* gy, float* gx, float* gbias, BiasShape s) = 0;

  // ---- convolution and pooling ----
  virtual void conv2d(const float* x, const float* w, const float* bias, float* y,
                      const Conv2dGeometry& g) = 0;
  // `y` is the forward output, read only with fuse_relu (the gradient passes where y > 0).
  virtual void conv2d_backward(const float* gy, const float* x, const float* w, const float* y,
                               GradientOut gx, float* gw, float* gbias, const Conv2dGeometry& g) = 0;
  // `argmax` (may be null): each output's winner as an index into its input plane. Ties go to the
  // first maximum in row-major window order and NaN wins, as in PyTorch.
  virtual void maxpool2d(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g) = 0;
  virtual void maxpool2d_backward(const float* gy, const int32_t* argmax, float* gx,
                                  const Pool2dGeometry& g) = 0;
  // The fused conv2d -> ReLU -> max pooling. Results equal those of conv2d (fuse_relu) followed by
  // maxpool2d, argmax (may be null) included, and backward's those of maxpool2d_backward followed by
  // conv2d_backward. `y` is the pooled output; it and argmax are all backward needs (the gradient
  // passes to a window's winner where the pooled value is > 0). The defaults run those kernels
  // through temporaries the size of the conv output (backward scatters y to stand in for it in
  // conv2d_backward's mask); a backend overrides them to keep that tensor out of memory (the CPU
  // backend pools each chunk of the batch while it is in cache).
  virtual void conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y,
                                   int32_t* argmax, const ConvPoolGeometry& g);
  virtual void conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y,
                                            const float* x, const float* w, GradientOut gx, float* gw,
                                            float* gbias, const ConvPoolGeometry& g);

  // ---- batch normalisation (buffers as in BatchNormShape) ----
  virtual void batchnorm_sums(const float* x, double* sums, BatchNormShape s) = 0;
  virtual void batchnorm_squares(const float* x, const double* sums, double* squares, BatchNormShape s) = 0;
  // Training: stats from sums and squares (biased variance); running_mean / running_var, when not
  // null, move by `momentum` towards the batch's mean and unbiased variance (count / (count - 1)).
  virtual void batchnorm_batch_stats(const double* sums, const double* squares, float* stats,
                                     float* running_mean, float* running_var, int64_t channels, float eps,
                                     float momentum) = 0;
  // Evaluation: stats from the running estimates.
  virtual void batchnorm_running_stats(const float* running_mean, const float* running_var, float* stats,
                                       int64_t channels, float eps) = 0;
  // y = (x - mean) * invstd * gamma + beta, then the epilogue
  virtual void batchnorm_normalize(const float* x, const float* stats, const float* gamma, const float* beta,
                                   float* y, BatchNormShape s, BatchNormEpilogue epilogue) = 0;
  // In both backward kernels g is the normalisation's gradient: gy, or with relu_y (the output of an
  // epilogue with relu) gy masked as BatchNormEpilogue says.
  // grad_sums from g and x; ggamma += sum g (x - mean) invstd, gbeta += sum g, gresidual += g (each
  // may be null).
  virtual void batchnorm_backward_reduce(const float* gy, const float* relu_y, const float* x,
                                         const float* stats, double* grad_sums, float* ggamma, float* gbeta,
                                         GradientOut gresidual, BatchNormShape s) = 0;
  // With grad_sums (batch statistics; count = sums[channels]):
  //   gx += gamma invstd (g - sum_g / count - (x - mean) invstd^2 sum_g_xmu / count);
  // with grad_sums and sums null (fixed statistics, evaluation mode): gx += gamma invstd g.
  virtual void batchnorm_backward_input(const float* gy, const float* relu_y, const float* x,
                                        const float* stats, const float* gamma, const double* grad_sums,
                                        const double* sums, GradientOut gx, BatchNormShape s) = 0;
  // Training with the batch's own statistics (no SyncBatchNorm, whose sums are added across ranks
  // between the kernels): each direction's kernels as one call, with their results bit for bit.
  // Forward: sums, squares, batch_stats, normalize. Backward: backward_reduce, then (gx not null)
  // backward_input. The defaults run them in turn; a backend overrides them to take the passes over
  // a channel while it is in cache (the CPU's).
  virtual void batchnorm_train_forward(const float* x, const float* gamma, const float* beta, double* sums,
                                       double* squares, float* stats, float* running_mean, float* running_var,
                                       float* y, BatchNormShape s, BatchNormEpilogue epilogue, float eps,
                                       float momentum);
  virtual void batchnorm_train_backward(const float* gy, const float* relu_y, const float* x,
                                        const float* stats, const float* gamma, const double* sums,
                                        double* grad_sums, float* ggamma, float* gbeta, GradientOut gresidual,
                                        GradientOut gx, BatchNormShape s);

  // ---- global average pooling: y [planes] = mean of each plane of `plane_size` elements ----
  virtual void mean_planes(const float* x, float* y, int64_t planes, int64_t plane_size) = 0;
  virtual void mean_planes_backward(const float* gy, float* gx, int64_t planes,
                                    int64_t plane_size) = 0;  // gx += gy / plane_size

  // ---- pointwise ----
  virtual void activation(Activation f, const float* x, float* y, int64_t n) = 0;
  // gx += gy * f'(x), with f' written in terms of x and y = f(x)
  virtual void activation_backward(Activation f, const float* x, const float* y, const float* gy, float* gx,
                                   int64_t n) = 0;
  // mask[i] = 1 / (1 - p) if uniform_from_bits(splitmix64_draw(rng_state, i)) >= p else 0, and
  // y = x * mask: the masks a CPU Rng at `rng_state` draws, element by element (core/rng.h).
  virtual void dropout(const float* x, float* y, float* mask, int64_t n, float p, uint64_t rng_state) = 0;
  virtual void dropout_backward(const float* gy, const float* mask, float* gx,
                                int64_t n) = 0;                   // gx += gy * mask
  virtual void add(const float* x, float* y, int64_t n) = 0;      // y += x
  virtual void add_scalar(float* y, int64_t n, float value) = 0;  // y += value

  // ---- losses and reductions: scalars (the loss, its upstream gradient) stay on the device ----
  // probs = softmax(logits) row by row (kept for backward), loss = mean over rows of -log probs[label].
  // Labels are host memory, checked to lie in [0, classes) by the caller.
  virtual void cross_entropy(const float* logits, std::span<const int32_t> labels, float* probs, float* loss,
                             int64_t batch, int64_t classes) = 0;
  // glogits += gloss[0] / batch * (probs - onehot(labels))
  virtual void cross_entropy_backward(const float* probs, std::span<const int32_t> labels, const float* gloss,
                                      float* glogits, int64_t batch, int64_t classes) = 0;
  virtual void mse(const float* prediction, const float* target, float* loss,
                   int64_t n) = 0;  // mean (p - t)^2
  virtual void mse_backward(const float* prediction, const float* target, const float* gloss,
                            float* gprediction, int64_t n) = 0;
  virtual void sum(const float* x, float* out, int64_t n) = 0;
  virtual void sum_backward(const float* gout, float* gx, int64_t n) = 0;  // gx += gout[0]

  // ---- gradient reduction ----
  virtual void to_half(const float* x, uint16_t* y, int64_t n, float scale,
                       HalfFormat format) = 0;  // y = half(x * scale)
  virtual void from_half(const uint16_t* x, float* y, int64_t n, HalfFormat format) = 0;
  // Whether every element is neither Inf nor NaN.
  virtual bool all_finite(const float* x, int64_t n) = 0;
  // The sum of x[i]^2 in double, to the host (gradient clipping's norm; waits for the device). Its
  // order depends on n alone, never on the thread count.
  virtual double sum_of_squares(const float* x, int64_t n) = 0;
  // Sets *flag (an int32 in this backend's memory) to `value` if it is still 0 and an element is Inf
  // or NaN, without the host waiting: an update given the flag (SgdStep::skip_if_set) is then
  // skipped, and the host reads the flag when it synchronizes anyway. The default reads on the host.
  virtual void mark_non_finite(const float* x, int64_t n, int32_t* flag, int32_t value);

  // ---- metrics ----
  // out[0] (this backend's memory) = how many rows of logits [labels.size(), classes] have their
  // first largest entry at labels[row], as a float (exact below 2^24 rows), without the host
  // waiting. A NaN never counts as largest unless it comes first (std::max_element's order). The
  // default computes on the host.
  virtual void count_correct(const float* logits, std::span<const int32_t> labels, int64_t classes,
                             float* out);

  // ---- optimizers: one fused update over flat buffers (core/update_rules.h) ----
  virtual void sgd_step(float* params, const float* grads, float* momentum_buffer, int64_t n,
                        const SgdStep& s) = 0;
  virtual void adam_step(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, int64_t n,
                         const AdamStep& s) = 0;

  // Frees what the backend keeps between calls (a GPU's scratch, staging and library handles). At the
  // end of a program, while it still runs main(): no op may follow, only buffers' releases.
  virtual void release_cached() {}
};

// The backend of `device`. "cpu" and "reference" are always there; others exist once registered.
// Throws naming the device when none is.
Backend& backend_for(Device device);
bool has_backend(Device device);
// Makes `backend` the one for backend->device() (e.g. the CUDA backend, once per GPU it drives).
void register_backend(std::shared_ptr<Backend> backend);
// Puts wrap(the backend of `device`) in its place for the rest of the program: a decorator that sees
// every kernel call (bench/op_profile.h). Call before any component holds that backend.
void interpose_backend(Device device, const std::function<std::shared_ptr<Backend>(Backend& inner)>& wrap);
// Switches of the CPU backend, for the whole process (the config's cpu section).
struct CpuOptions {
  // 3x3 convolutions at stride 1 by Winograd's minimal filtering where it applies
  // (core/cpu/conv_winograd.h): fewer products, rounded differently; off, by the direct and im2col forms.
  bool winograd = true;
  // The outputs a side of its tiles in the forward and the input gradient: 2, F(2x2, 3x3), or 4,
  // F(4x4, 3x3), with 0.56x the products and 5-7x the roundings (the weight gradient is always
  // F(4x4, 3x3)'s). set_cpu_options throws std::invalid_argument for any other.
  int winograd_tile = 2;
};
void set_cpu_options(const CpuOptions& options);
CpuOptions cpu_options();
// The vector instructions that the CPU kernels were compiled for ("AVX-512", "AVX2", "AVX", "SSE2",
// "NEON" or "none"): what a benchmark names beside its figures (a build with DPTRAIN_NATIVE=OFF and
// -march=haswell runs AVX2 on an AVX-512 machine), and the floats in one of its vectors.
const char* cpu_vector_isa();
int cpu_vector_floats();
// release_cached() on every registered backend: what a program calls before main() returns, so that
// compute-sanitizer's leak check (which does not see frees made in exit handlers) sees only leaks.
void release_backend_caches();

}  // namespace dptrain
