#include "lockstep/runtime/autograd/rebind.h"

#include "lockstep/runtime/autograd/detail/meta.h"

namespace lockstep::runtime {

void rebind(const Tensor& t, const Tensor& src, bool with_history) {
  TensorImpl* impl = t.impl_ptr();
  impl->storage = src.storage();
  impl->shape = src.shape();
  impl->strides = src.strides();
  impl->offset = src.storage_offset();
  impl->dtype = src.dtype();
  if (!with_history) return;
  AutogradMeta& meta = autograd_meta(*impl);
  meta.grad = Tensor();
  meta.requires_grad = false;
  meta.grad_accumulator.reset();
  meta.grad_fn = src.impl_ptr()->autograd ? src.impl_ptr()->autograd->grad_fn : nullptr;
}

}  // namespace lockstep::runtime
