// The built-in communication hooks (declared in ddp_options.h).
#include "lockstep/nn/ddp/ddp_options.h"

#include "lockstep/runtime/autograd/grad_mode.h"

namespace lockstep::nn::comm_hooks {
namespace {

// The buffer already holds gradients scaled by 1/divisor (the world size, or
// the active ranks under a Join), so compressing it cannot overflow where the
// full-precision sum would not.
CommHook compress_to(runtime::DType wire) {
  return [wire](GradBucket& bucket) -> CommHookResult {
    runtime::Tensor compressed = bucket.buffer.to(wire);
    auto work = bucket.group.allreduce(compressed, {.op = collectives::ReduceOp::Sum});
    runtime::Tensor buffer = bucket.buffer;
    return {work, [buffer, compressed]() mutable {
              runtime::NoGradGuard no_grad;
              buffer.copy_(compressed);
            }};
  };
}

}  // namespace

CommHook allreduce() {
  return [](GradBucket& bucket) -> CommHookResult {
    return {bucket.group.allreduce(bucket.buffer, {.op = collectives::ReduceOp::Sum}), nullptr};
  };
}

CommHook fp16_compress() { return compress_to(runtime::DType::f16); }
CommHook bf16_compress() { return compress_to(runtime::DType::bf16); }

}  // namespace lockstep::nn::comm_hooks
