// The context every CUDA-side error message carries: the rank of this process
// and file:line. CUDA-free, so it builds (and is tested) without CUDA; the
// per-library checking macros (cuda/device.h, cuda/cublas_check.h,
// cuda/cudnn_check.h, collectives/nccl/nccl_check.h) format through it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep::runtime::cuda {

// The rank this process runs as, for error messages ("rank ?" where -1): the
// value last given to set_process_rank(), -1 before any. select_device() and
// init_process_group() give it, from the launcher's variables or (init) MPI.
int process_rank();

// Sets the rank that process_rank() returns. Thread-safe.
void set_process_rank(int rank);

// "rank 3", or "rank ?" where the rank is not known yet.
std::string process_rank_text();

// "<library> error on rank <r> at <file>:<line>: <expr> failed: <detail>".
// `library` is "CUDA", "cuBLAS", "cuDNN" or "NCCL"; `file` as __FILE__ gives it.
std::string library_error_message(std::string_view library, std::string_view expr,
                                  std::string_view file, int line, std::string_view detail);

// 1536 -> "1.50 KiB", 3 << 30 -> "3.00 GiB"; for memory statistics in messages.
std::string format_bytes(std::size_t bytes);

}  // namespace lockstep::runtime::cuda
