// The backend registry: the host backends built in, others (one per GPU) registered at run time.
#include "core/backend.h"

#include <mutex>
#include <vector>

#include "core/cpu/backend.h"
#include "core/error.h"
#include "core/reference/backend.h"
#include "core/storage.h"

namespace dptrain {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<Backend>> backends;  // registered ones (GPUs)
};

// Never destroyed, as the built-in backends: storages in other statics may release memory through
// a registered backend at exit, and a GPU backend's teardown could wait on a stuck stream there.
Registry& registry() {
  static Registry* const instance = new Registry;
  return *instance;
}

Backend* find(Device device) {
  // Never destroyed: storages in other statics may release memory through them at exit.
  static Backend* const cpu_backend = new cpu::CpuBackend;
  static Backend* const reference_backend = new reference::ReferenceBackend;
  if (device == Device::cpu()) return cpu_backend;
  if (device == Device::reference()) return reference_backend;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const std::shared_ptr<Backend>& b : r.backends)
    if (b->device() == device) return b.get();
  return nullptr;
}

}  // namespace

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kReference:
      return "reference";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(index);
  }
  return "?";
}

void Backend::conv2d_relu_maxpool(const float* x, const float* w, const float* bias, float* y,
                                  int32_t* argmax, const ConvPoolGeometry& g) {
  DPTRAIN_CHECK(g.conv.fuse_relu, "conv2d_relu_maxpool: the geometry must have fuse_relu set");
  Storage conv_out(sizeof(float) * g.conv.batch * g.conv.out_channels * g.conv.pixels(), device());
  conv2d(x, w, bias, conv_out.as<float>(), g.conv);
  maxpool2d(conv_out.as<float>(), y, argmax, g.pool);
}

void Backend::conv2d_relu_maxpool_backward(const float* gy, const int32_t* argmax, const float* y,
                                           const float* x, const float* w, float* gx, float* gw, float* gbias,
                                           const ConvPoolGeometry& g) {
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

Backend& backend_for(Device device) {
  Backend* b = find(device);
  DPTRAIN_CHECK(
      b != nullptr, "no backend for device ", device.str(),
      device.type == DeviceType::kCuda ? " (is this build made with CUDA, and does the device exist?)" : "");
  return *b;
}

bool has_backend(Device device) {
  return find(device) != nullptr;
}

void register_backend(std::shared_ptr<Backend> backend) {
  DPTRAIN_CHECK(backend != nullptr, "register_backend: null backend");
  const Device device = backend->device();
  DPTRAIN_CHECK(!has_backend(device), "register_backend: ", device.str(), " already has a backend");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.backends.push_back(std::move(backend));
}

}  // namespace dptrain
