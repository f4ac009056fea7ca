// Optimizers over flat parameter buffers (never layers): SGD with momentum/dampening/nesterov/weight
// decay and Adam/AdamW, with PyTorch's exact update formulas (core/update_rules.h). One step is one
// fused update over the whole flat buffer on the parameters' device; state is addressable by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/parameters.h"

namespace dptrain::optim {

class Optimizer {
 public:
  // `owned`: ZeRO-1 (distributed/shard_layout.h), this optimizer updates only these ranges of the flat
  // buffers and keeps state for them alone, packed in their order; empty: all of them.
  explicit Optimizer(const FlatParameters& parameters, std::vector<FlatRange> owned = {});
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update with learning rate `lr` from the gradients currently in the flat gradient buffer, each
  // multiplied by `grad_scale` first (gradient clipping's factor; the buffer is left as it is).
  void step(float lr, float grad_scale = 1.0f);
  void zero_grad() { parameters_.zero_grad(); }
  int64_t steps_taken() const { return steps_; }
  // Restores the step counter after the state was overwritten in place (resume, broadcast).
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  // An int32 in the parameters' memory: while it is nonzero the updates do nothing (a deferred
  // finiteness check flagged a step: GradientSync::update_skip_flag). Null: always update.
  void skip_updates_while_set(const int32_t* flag) { skip_flag_ = flag; }

  bool sharded() const { return sharded_; }
  // Bytes of optimizer state this rank holds.
  int64_t state_bytes() const;

  const std::vector<NamedTensor>& parameters() const { return parameters_.parameters(); }
  // Every state tensor, named "<parameter>.<slot>" (e.g. "0.weight.exp_avg"), slot after slot; with
  // steps_taken(), everything a checkpoint must carry. Unsharded only (see whole_state_buffers).
  std::vector<NamedTensor> state() const { return named_state(state_buffers()); }
  // The state buffers, one per slot: the parameters' flat layout, or this rank's ranges packed.
  const std::vector<Tensor>& state_buffers() const { return slots_; }
  // The tensor of one slot of one parameter's state, or undefined if there is no such slot.
  Tensor state_of(const std::string& parameter, const std::string& slot) const;

  // The state in the parameters' flat layout, one new buffer per slot, with this rank's ranges filled
  // in and zeros elsewhere (a sharded run gathers the other ranks' into them: ShardLayout::allgather).
  std::vector<Tensor> whole_state_buffers() const;
  // Takes this rank's ranges of whole buffers of that layout (a resume into a sharded run).
  void take_state_from(const std::vector<Tensor>& whole);
  // Buffers of the flat layout named per parameter and slot, as state() names them.
  std::vector<NamedTensor> named_state(const std::vector<Tensor>& whole) const;

 protected:
  // Applies update number steps_taken() (already counted) to every range of pieces() (this rank's
  // own ranges when sharded), each gradient multiplied by grad_scale as it is read.
  virtual void update(float lr, float grad_scale) = 0;
  // Called from subclass constructors: a zero buffer per slot.
  void add_slot(const std::string& slot);
  float* slot_ptr(std::size_t slot) const { return slots_.at(slot).data_ptr(); }
  // What update() runs over: ranges of the flat buffers, each with where its state starts in the
  // slot buffers.
  struct Piece {
    FlatRange range;
    int64_t state_offset = 0;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

  const FlatParameters& parameters_;
  Backend& backend_;
  int64_t steps_ = 0;  // updates taken so far, as PyTorch's per-parameter "step"
  const int32_t* skip_flag_ = nullptr;

 private:
  Tensor new_slot() const;

  std::vector<std::string> slot_names_;
  std::vector<Tensor> slots_;
  std::vector<Piece> pieces_;
  bool sharded_ = false;
};

struct SgdOptions {
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
};

class Sgd : public Optimizer {
 public:
  Sgd(const FlatParameters& parameters, SgdOptions options, std::vector<FlatRange> owned = {});

 private:
  void update(float lr, float grad_scale) override;
  SgdOptions options_;
};

struct AdamOptions {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // AdamW
};

class Adam : public Optimizer {
 public:
  Adam(const FlatParameters& parameters, AdamOptions options, std::vector<FlatRange> owned = {});

 private:
  void update(float lr, float grad_scale) override;
  AdamOptions options_;
};

}  // namespace dptrain::optim
