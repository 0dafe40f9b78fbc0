// Process-wide numeric modes of the CUDA ops.
//
// TF32: on Ampere and later GPUs, f32 matrix products and convolutions can
// run on tensor cores with inputs rounded to 10 mantissa bits (about 1e-3
// relative error instead of 1e-6), several times faster. Off by default, so
// that f32 on CUDA means f32 accuracy; turn it on explicitly where speed
// matters more. Read by the cuBLAS matmul (CUBLAS_COMPUTE_32F_FAST_TF32) and
// the cuDNN convolutions (CUDNN_DEFAULT_MATH instead of CUDNN_FMA_MATH) at
// each call, so a change takes effect with the next op.
#pragma once

namespace lockstep::runtime::cuda {

void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace lockstep::runtime::cuda
