// dst = src * scale, written in place without autograd: DDP's copy of a
// gradient into its bucket, averaged on the way.
#pragma once

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

// One pass over memory where it can (contiguous f32 on the CPU, one kernel on
// a device), else copy_ then mul_; the rounding is theirs in every case (the
// factor rounded to dst's dtype first). Bumps dst's version.
void scale_into(Tensor& dst, const Tensor& src, double scale);

}  // namespace lockstep::runtime
