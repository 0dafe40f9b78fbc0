// Rebinding a tensor in place: every handle of `t` (a module's member and its
// registered slot alike) then reads `src`'s data. Module::to moves a
// parameter this way (PyTorch's `param.data = ...`); nn::DataParallel makes
// each replica's parameter a differentiable copy of the original's, history
// included, so that backward through the replica reaches the original.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// t's storage, shape, strides, offset and dtype become src's. With
// `with_history`, t also takes src's autograd history: t becomes an output of
// src's grad_fn (a non-leaf; its own gradient and requires_grad flag are
// dropped), or a leaf needing no gradient when src has none.
void rebind(const Tensor& t, const Tensor& src, bool with_history = false);

}  // namespace lockstep::runtime
