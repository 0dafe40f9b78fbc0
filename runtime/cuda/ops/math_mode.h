// Process-wide numeric modes of the CUDA ops.
//
// TF32: on Ampere and later GPUs, f32 matrix products and convolutions can
// run on tensor cores with inputs rounded to 10 mantissa bits (about 1e-3
// relative error instead of 1e-6), several times faster. Off by default, so
// that f32 on CUDA means f32 accuracy; turn it on explicitly where speed
// matters more. Read by the cuBLAS matmul (CUBLAS_COMPUTE_32F_FAST_TF32) and
// the cuDNN convolutions (CUDNN_DEFAULT_MATH instead of CUDNN_FMA_MATH) at
// each call, so a change takes effect with the next op.
//
// cuDNN benchmark mode (PyTorch's torch.backends.cudnn.benchmark): each
// convolution's first run at a new shape times several of the engines cuDNN
// offers and keeps the fastest, instead of taking its heuristics' first
// choice. Worth it where shapes repeat (training); it costs that first run,
// and the choice may differ between runs. Off by default, on with
// set_cudnn_benchmark(true) or LOCKSTEP_CUDNN_BENCHMARK=1 (read once). Read
// by the convolutions on cuDNN's graph API (cudnn_graph_conv.h); its legacy
// fallback keeps its heuristic choice.
#pragma once

namespace lockstep::runtime::cuda {

void set_allow_tf32(bool allow);
bool allow_tf32();

void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();

}  // namespace lockstep::runtime::cuda
