// The per-thread tape behind reverse-mode autodiff.
#include "core/autograd.h"

#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "core/tensor_access.h"

namespace dptrain {
namespace {

struct TapeEntry {
  std::function<void()> backward;
  TensorImpl* output;  // kept alive by the closure
  // Leaf inputs with gradient-ready hooks: after this entry runs they owe one use less.
  std::vector<std::shared_ptr<TensorImpl>> hooked_leaves;
};

struct Tape {
  std::vector<TapeEntry> entries;
  bool grad_enabled = true;
};

thread_local Tape tape;

void replay() {
  // The tape is in topological order, so walking it backwards visits an op only after every op that
  // consumed its output: the op is reachable from the root exactly when its output has received a
  // gradient by then. Unreached ops (another graph recorded meanwhile) stay for a later backward.
  std::vector<TapeEntry> entries = std::move(tape.entries);
  tape.entries.clear();
  std::vector<TapeEntry> unreached;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (!TensorAccess::grad(*it->output)) {
      unreached.push_back(std::move(*it));
      continue;
    }
    it->backward();
    it->backward = nullptr;  // free this op's saved activations as early as possible
    for (const std::shared_ptr<TensorImpl>& leaf : it->hooked_leaves)
      if (--TensorAccess::pending_grad_uses(*leaf) == 0) TensorAccess::run_grad_ready_hooks(*leaf);
  }
  tape.entries.assign(std::make_move_iterator(unreached.rbegin()), std::make_move_iterator(unreached.rend()));
}

}  // namespace

bool grad_enabled() {
  return tape.grad_enabled;
}

NoGradGuard::NoGradGuard() : previous_(tape.grad_enabled) {
  tape.grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  tape.grad_enabled = previous_;
}

namespace autograd {

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!tape.grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const Tensor& output, std::initializer_list<const Tensor*> inputs,
            std::function<void()> backward) {
  output.set_requires_grad(true);
  TapeEntry entry{std::move(backward), &TensorAccess::impl(output), {}};
  for (const Tensor* t : inputs) {
    if (!t->defined() || !t->requires_grad()) continue;
    TensorImpl& impl = TensorAccess::impl(*t);
    if (!TensorAccess::has_grad_ready_hooks(impl)) continue;
    ++TensorAccess::pending_grad_uses(impl);
    entry.hooked_leaves.push_back(TensorAccess::shared(*t));
  }
  tape.entries.push_back(std::move(entry));
}

void backward(const Tensor& root, float seed) {
  DPTRAIN_CHECK(root.numel() == 1, "backward() needs a scalar, got shape ", shape_str(root.shape()));
  DPTRAIN_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad");
  backend_for(root.device()).add_scalar(root.grad_ptr(), 1, seed);
  replay();
}

void backward(const Tensor& root, const Tensor& upstream) {
  DPTRAIN_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad");
  DPTRAIN_CHECK(upstream.numel() == root.numel() && upstream.device() == root.device(),
                "backward(): upstream ", shape_str(upstream.shape()), " on ", upstream.device().str(),
                " for a root ", shape_str(root.shape()), " on ", root.device().str());
  backend_for(root.device()).add(upstream.data_ptr(), root.grad_ptr(), root.numel());
  replay();
}

void clear_tape() {
  for (TapeEntry& entry : tape.entries)
    for (const std::shared_ptr<TensorImpl>& leaf : entry.hooked_leaves)
      --TensorAccess::pending_grad_uses(*leaf);
  tape.entries.clear();
}

std::size_t tape_size() {
  return tape.entries.size();
}

}  // namespace autograd

// Tensor's entry point into the engine: defined here, not in tensor.cpp, so that the tensor sits below
// the tape that records it.
void Tensor::backward(float seed) const {
  autograd::backward(*this, seed);
}

}  // namespace dptrain
