// The per-thread tape behind reverse-mode autodiff.
#include "core/autograd.h"

#include <vector>

#include "core/error.h"

namespace dptrain {
namespace {

struct TapeEntry {
  std::function<void()> backward;
  TensorImpl* output;  // kept alive by the closure
  // Leaf inputs with a grad-ready hook: after this entry runs they owe one use less.
  std::vector<TensorImpl*> hooked_leaves;
};

struct Tape {
  std::vector<TapeEntry> entries;
  bool grad_enabled = true;
};

thread_local Tape tape;

}  // namespace

bool grad_enabled() { return tape.grad_enabled; }

NoGradGuard::NoGradGuard() : previous_(tape.grad_enabled) { tape.grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tape.grad_enabled = previous_; }

namespace autograd {

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!tape.grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const Tensor& output, std::initializer_list<const Tensor*> inputs, std::function<void()> backward) {
  output.set_requires_grad(true);
  TapeEntry entry{std::move(backward), output.impl(), {}};
  for (const Tensor* t : inputs) {
    if (t->defined() && t->requires_grad() && t->impl()->on_grad_ready) {
      ++t->impl()->pending_grad_uses;
      entry.hooked_leaves.push_back(t->impl());
    }
  }
  tape.entries.push_back(std::move(entry));
}

void backward(const Tensor& root, float seed) {
  DPTRAIN_CHECK(root.numel() == 1, "backward() needs a scalar, got shape ", shape_str(root.shape()));
  DPTRAIN_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad");
  root.grad_data()[0] += seed;
  // The tape is in topological order, so walking it backwards visits an op only after every op that
  // consumed its output: the op is reachable from the root exactly when its output has received a
  // gradient by then. Unreached ops (another graph recorded meanwhile) stay for a later backward.
  std::vector<TapeEntry> entries = std::move(tape.entries);
  tape.entries.clear();
  std::vector<TapeEntry> unreached;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (!it->output->grad) {
      unreached.push_back(std::move(*it));
      continue;
    }
    it->backward();
    it->backward = nullptr;  // free this op's saved activations as early as possible
    for (TensorImpl* leaf : it->hooked_leaves)
      if (--leaf->pending_grad_uses == 0) leaf->on_grad_ready();
  }
  tape.entries.assign(std::make_move_iterator(unreached.rbegin()), std::make_move_iterator(unreached.rend()));
}

void clear_tape() {
  for (TapeEntry& entry : tape.entries)
    for (TensorImpl* leaf : entry.hooked_leaves) --leaf->pending_grad_uses;
  tape.entries.clear();
}

std::size_t tape_size() { return tape.entries.size(); }

}  // namespace autograd
}  // namespace dptrain
