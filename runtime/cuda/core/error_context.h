// The context every CUDA-side error message carries: the rank of this process
// and file:line. CUDA-free, so it builds (and is tested) without CUDA; the
// per-library checking macros (cuda/device.h, cuda/cublas_check.h,
// cuda/cudnn_check.h, collectives/nccl/nccl_check.h) format through it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep::runtime::cuda {

// The rank this process runs as, for error messages. The value given to
// set_process_rank() if any; otherwise the rank runtime/env reads from the
// launcher's variables (LOCKSTEP_RANK, RANK, OMPI_COMM_WORLD_RANK, ...), 0 when
// no launcher is found, -1 when those variables are malformed.
int process_rank();

// Overrides the rank that process_rank() returns (init() knows it for sure,
// e.g. when the rank was assigned through MPI). Thread-safe.
void set_process_rank(int rank);

// "<library> error on rank <r> at <file>:<line>: <expr> failed: <detail>".
// `library` is "CUDA", "cuBLAS", "cuDNN" or "NCCL"; `file` as __FILE__ gives it.
std::string library_error_message(std::string_view library, std::string_view expr,
                                  std::string_view file, int line, std::string_view detail);

// 1536 -> "1.50 KiB", 3 << 30 -> "3.00 GiB"; for memory statistics in messages.
std::string format_bytes(std::size_t bytes);

}  // namespace lockstep::runtime::cuda
