// cuBLAS, opened on first use. lockstep does not link libcublas: loading it
// (with libcublasLt) costs a process about 0.6 s of start-up, which every
// process of a CUDA build would pay whether it multiplies a matrix or not.
// The first CUDA matmul opens it instead, through these entry points.
#pragma once

#include <string>
#include <vector>

#include <cublas_v2.h>

namespace lockstep::runtime::cuda {

struct CublasApi {
  // The C entry points (in C++ the Ex functions also have inline overloads
  // taking a cudaDataType compute type).
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                    int, int, const void*, const void*, cudaDataType, int,
                                    const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedBatchedEx = cublasStatus_t (*)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
      const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
      const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
      cublasGemmAlgo_t);

  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSetWorkspace) set_workspace = nullptr;
  GemmEx gemm_ex = nullptr;
  GemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
  decltype(&cublasDgemm) dgemm = nullptr;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
  decltype(&cublasGetStatusString) get_status_string = nullptr;
  decltype(&cublasGetStatusName) get_status_name = nullptr;
};

// The library names tried in order: the soname this build was compiled
// against (found as the dynamic linker would), then the file CMake found.
std::vector<std::string> default_cublas_candidates();

// Opens the first candidate that loads and resolves every entry point;
// throws lockstep::Error naming each candidate and why it failed.
CublasApi load_cublas(const std::vector<std::string>& candidates);

// load_cublas(default_cublas_candidates()), once per process (thread-safe;
// a failure is thrown again on every call).
const CublasApi& cublas();

}  // namespace lockstep::runtime::cuda
