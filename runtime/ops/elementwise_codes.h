// The op codes of the device backends' elementwise kernels
// (device_backend.h: DeviceBackend::unary and binary).
#pragma once

#include <cstdint>

namespace lockstep::runtime {

enum class UnaryOp : uint8_t {
  neg, exp, log, sqrt, abs,
  add_scalar,  // x + scalar
  mul_scalar,  // x * scalar
  pow_scalar,  // x ^ scalar
  relu, sigmoid, tanh,
  gelu,        // exact (erf) form
  sign,        // -1, 0 or 1
};

enum class BinaryOp : uint8_t {
  add,  // a + alpha * b
  sub, mul, div, maximum, minimum,
  eq, ne, gt, ge, lt, le,  // out is bool
  relu_backward,     // a (grad) where b (input) > 0, else 0
  sigmoid_backward,  // a (grad) * b (output) * (1 - b)
  tanh_backward,     // a (grad) * (1 - b (output)^2)
  gelu_backward,     // a (grad) * gelu'(b (input))
};

}  // namespace lockstep::runtime
