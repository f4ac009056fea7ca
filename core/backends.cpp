// The registry of backends: the host backends built in, others (one per GPU) registered at run time.
// A file of its own, above every backend it lists, so that core/backend.h's implementation does not
// depend on its implementations.
#include <atomic>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "core/cpu/backend.h"
#include "core/error.h"
#include "core/reference/backend.h"

namespace dptrain {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<Backend>> backends;    // registered ones (GPUs)
  std::vector<std::shared_ptr<Backend>> interposed;  // decorators, in place of the backend they wrap
  std::atomic<bool> any_interposed = false;          // so that the host devices skip the lock otherwise
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
  Registry& r = registry();
  if (r.any_interposed.load(std::memory_order_acquire)) {
    std::lock_guard lock(r.mutex);
    // The newest first: it may wrap an earlier one, which therefore stays.
    for (auto b = r.interposed.rbegin(); b != r.interposed.rend(); ++b)
      if ((*b)->device() == device) return b->get();
  }
  if (device == Device::cpu()) return cpu_backend;
  if (device == Device::reference()) return reference_backend;
  std::lock_guard lock(r.mutex);
  for (const std::shared_ptr<Backend>& b : r.backends)
    if (b->device() == device) return b.get();
  return nullptr;
}

}  // namespace

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

void release_backend_caches() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (const std::shared_ptr<Backend>& b : r.backends) b->release_cached();
}

void interpose_backend(Device device, const std::function<std::shared_ptr<Backend>(Backend& inner)>& wrap) {
  std::shared_ptr<Backend> wrapper = wrap(backend_for(device));
  DPTRAIN_CHECK(wrapper != nullptr && wrapper->device() == device, "interpose_backend: the wrapper of ",
                device.str(), " must be a backend of that device");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.interposed.push_back(std::move(wrapper));
  r.any_interposed.store(true, std::memory_order_release);
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
