// Autocast: a thread-local scope in which ops choose their compute dtype, as
// torch.autocast. Off by default; nestable (an inner scope may change the
// dtype or turn autocast off for a region).
//
//   {
//     auto amp = runtime::autocast({.dtype = DType::bf16});
//     Tensor loss = cross_entropy(model(x), y);  // linear in bf16, the loss in f32
//   }
//   loss.backward();  // each op's backward at the dtype its forward ran at
//
// The policy, applied where each op checks its arguments (its dispatch point):
//   lower  (the scope's dtype, f32 accumulation): matmul, linear, conv2d,
//          scaled_dot_product_attention;
//   f32:   softmax, log_softmax, cross_entropy, mse_loss, layer_norm,
//          batch_norm (and SyncBatchNorm), sum, mean, exp, log, pow;
//   widest input: every other op (elementwise ops promote as always; cat,
//          which refuses mixed dtypes outside a scope, casts to its widest).
// Parameters stay f32 (the master weights): a cast of a leaf that requires
// grad is cached for the outermost scope, so one forward casts each weight
// once, and its gradient arrives in f32 through the cast. f64 and integer
// tensors are never cast. backward() runs without autocast, wherever it is
// called. On the CPU, bf16 and f16 compute in f32 and round on store
// (runtime/ops/detail/reduced_float.h), so every path runs and is tested here.
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

struct AutocastOptions {
  DType dtype = DType::bf16;               // bf16 or f16
  std::optional<DeviceType> device;        // ops on this device type; every device when unset
  bool enabled = true;                     // false: a region without autocast inside a scope
};

// The calling thread's autocast setting: what the innermost scope said.
struct AutocastState {
  bool enabled = false;
  DType dtype = DType::bf16;
  std::optional<DeviceType> device;
  bool applies_to(Device d) const { return enabled && (!device || *device == d.type); }
};
AutocastState autocast_state();

// Sets `state` for the calling thread until destroyed, then restores the one
// before. Used to carry a scope into another thread (DataParallel's replicas)
// or into a later recomputation (activation checkpointing).
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastState& state);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

// Opens an autocast scope; bad options (a dtype other than bf16 or f16) throw.
[[nodiscard]] AutocastGuard autocast(const AutocastOptions& options = {});

namespace detail {

// promote: every floating input to the widest floating input's dtype, for
// ops that need one dtype (cat of a bf16 matmul output and an f32 tensor).
enum class CastPolicy { lower, f32, promote };

// `inputs` cast for an op under `policy`, or nullopt when the op runs as it
// is (autocast off or for another device, or every floating input already at
// the policy's dtype). Undefined and non-floating inputs pass through. The op
// then calls itself again with the cast inputs.
std::optional<std::vector<Tensor>> autocast_inputs(CastPolicy policy,
                                                   std::initializer_list<Tensor> inputs);
std::optional<std::vector<Tensor>> autocast_inputs(CastPolicy policy,
                                                   const std::vector<Tensor>& inputs);

}  // namespace detail

}  // namespace lockstep::runtime
