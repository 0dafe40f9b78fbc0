// matmul on cuBLAS; see the header for the row-major / column-major mapping.
#include "lockstep/runtime/cuda/ops/cublas_matmul.h"

#include <climits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cublas_v2.h>

#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/cublas_api.h"
#include "lockstep/runtime/cuda/cublas_check.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/ops/math_mode.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/cuda/tensor_args.h"

namespace lockstep::runtime::cuda {
namespace {

// ---- handles -------------------------------------------------------------
//
// cuBLAS handles are not safe to share between threads that use them at the
// same time, and creating one is slow, so each thread takes one handle per
// device from a process-wide pool and gives it back when the thread ends.
// Handles are never destroyed (at process exit the CUDA context may already
// be gone). Each call binds the handle to the current stream and to a
// workspace from the caching allocator owned by that (device, stream): with
// its own workspace per stream, work on two streams cannot race on scratch
// memory, and cuBLAS never calls cudaMalloc itself.

std::mutex& pool_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<int, std::vector<cublasHandle_t>>& pool() {
  static auto* p = new std::unordered_map<int, std::vector<cublasHandle_t>>;
  return *p;
}

// What cuBLAS recommends: 32 MiB on Hopper and later, 4 MiB before.
std::size_t workspace_bytes(int device) {
  int major = 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
}

constexpr std::size_t kMaxWorkspaces = 4;

struct ThreadHandles {
  std::unordered_map<int, cublasHandle_t> by_device;
  std::map<std::pair<int, cudaStream_t>, DeviceBuffer> workspaces;

  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    workspaces.clear();
    std::lock_guard<std::mutex> lock(pool_mutex());
    for (auto& [device, handle] : by_device) pool()[device].push_back(handle);
  }

  cublasHandle_t handle(int device) {
    auto it = by_device.find(device);
    if (it != by_device.end()) return it->second;
    cublasHandle_t h = nullptr;
    {
      std::lock_guard<std::mutex> lock(pool_mutex());
      auto& free = pool()[device];
      if (!free.empty()) h = free.back(), free.pop_back();
    }
    if (h == nullptr) {
      DeviceGuard guard(device);
      LOCKSTEP_CUBLAS_CHECK(cublas().create(&h));
    }
    by_device.emplace(device, h);
    return h;
  }

  DeviceBuffer& workspace(StreamView stream) {
    const auto key = std::make_pair(stream.device, stream.handle);
    auto it = workspaces.find(key);
    if (it != workspaces.end()) return it->second;
    // A thread that goes through many streams keeps a few workspaces, not
    // one per stream ever used. Freeing one is safe while work queued on its
    // stream still uses it (the allocator reuses it only after that work).
    if (workspaces.size() >= kMaxWorkspaces) workspaces.erase(workspaces.begin());
    return workspaces.emplace(key, DeviceBuffer(workspace_bytes(stream.device), stream))
        .first->second;
  }
};

// The calling thread's handle for the device, bound to its current stream.
cublasHandle_t bound_handle(int device) {
  thread_local ThreadHandles handles;
  const StreamView stream = current_stream(device);
  cublasHandle_t h = handles.handle(device);
  LOCKSTEP_CUBLAS_CHECK(cublas().set_stream(h, stream.handle));
  // cublasSetStream resets the workspace to cuBLAS's own; set ours after it.
  DeviceBuffer& ws = handles.workspace(stream);
  LOCKSTEP_CUBLAS_CHECK(cublas().set_workspace(h, ws.data(), ws.size()));
  return h;
}

// ---- operands --------------------------------------------------------------

int checked_int(int64_t v, const char* what) {
  LOCKSTEP_CHECK(v >= 0 && v <= INT_MAX,
                 "matmul on CUDA: {} = {} does not fit cuBLAS's 32-bit sizes; split the "
                 "product into smaller ones",
                 what, v);
  return static_cast<int>(v);
}

// How cuBLAS reads a row-major [r, c] matrix with strides (s0, s1): the
// tensor it reads (the view itself, or a contiguous copy when neither layout
// fits), the op to apply to the column-major matrix in memory so that it
// becomes the transpose of the row-major one (see the header), and its
// leading dimension. `t` may be 3-D; then r, c, s0, s1 are its last two dims.
struct Operand {
  Tensor t;
  cublasOperation_t op;
  int64_t ld;
};

Operand operand(const Tensor& x) {
  const int64_t d = x.dim();
  const int64_t r = x.size(d - 2), c = x.size(d - 1);
  const int64_t s0 = x.stride(d - 2), s1 = x.stride(d - 1);
  // Row-major with unit column stride: in memory the column-major [c, r].
  if ((s1 == 1 || c == 1) && (s0 >= std::max<int64_t>(c, 1) || r == 1))
    return {x, CUBLAS_OP_N, r == 1 ? std::max<int64_t>(c, 1) : s0};
  // Stored transposed (unit row stride): in memory the column-major [r, c].
  if ((s0 == 1 || r == 1) && (s1 >= std::max<int64_t>(r, 1) || c == 1))
    return {x, CUBLAS_OP_T, c == 1 ? std::max<int64_t>(r, 1) : s1};
  return {x.contiguous(), CUBLAS_OP_N, std::max<int64_t>(c, 1)};
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default:
      throw Error(fmt::format("matmul on CUDA: dtype {} is not supported; use f32, f64, bf16 "
                              "or f16 (convert with .to())",
                              dtype_name(d)));
  }
}

// One (possibly batched) product in row-major terms: C [m, n] = alpha A [m, k]
// B [k, n] + beta C, `batch` times with the given element strides between
// matrices. Issued as the column-major C^T = B^T A^T.
struct Product {
  Operand a, b;
  void* c;
  int64_t ldc;
  int64_t m, n, k;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
};

void run(const Product& p, DType dtype, int device) {
  const int m = checked_int(p.m, "m"), n = checked_int(p.n, "n"), k = checked_int(p.k, "k");
  const int lda = checked_int(p.a.ld, "lda"), ldb = checked_int(p.b.ld, "ldb");
  const int ldc = checked_int(p.ldc, "ldc"), batch = checked_int(p.batch, "batch");
  const void* a = p.a.t.raw_data();
  const void* b = p.b.t.raw_data();
  DeviceGuard guard(device);
  cublasHandle_t h = bound_handle(device);
  if (dtype == DType::f64) {
    const double alpha = p.alpha, beta = p.beta;
    const auto* ad = static_cast<const double*>(a);
    const auto* bd = static_cast<const double*>(b);
    auto* cd = static_cast<double*>(p.c);
    if (batch == 1) {
      LOCKSTEP_CUBLAS_CHECK(cublas().dgemm(h, p.b.op, p.a.op, n, m, k, &alpha, bd, ldb, ad, lda,
                                           &beta, cd, ldc));
    } else {
      LOCKSTEP_CUBLAS_CHECK(cublas().dgemm_strided_batched(
          h, p.b.op, p.a.op, n, m, k, &alpha, bd, ldb, p.stride_b, ad, lda, p.stride_a, &beta, cd,
          ldc, p.stride_c, batch));
    }
    return;
  }
  const cudaDataType_t type = cuda_type(dtype);
  const cublasComputeType_t compute = dtype == DType::f32 && allow_tf32()
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  if (batch == 1) {
    LOCKSTEP_CUBLAS_CHECK(cublas().gemm_ex(h, p.b.op, p.a.op, n, m, k, &alpha, b, type, ldb, a,
                                           type, lda, &beta, p.c, type, ldc, compute,
                                           CUBLAS_GEMM_DEFAULT));
  } else {
    LOCKSTEP_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(
        h, p.b.op, p.a.op, n, m, k, &alpha, b, type, ldb, p.stride_b, a, type, lda, p.stride_a,
        &beta, p.c, type, ldc, p.stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
  }
}

void check_operands(const Tensor& a, const Tensor& b, const Tensor& c) {
  LOCKSTEP_CHECK(a.device().is_cuda(), "matmul on CUDA: operand is on {}", a.device().str());
  check_device("matmul", a.device(), {&a, &b, &c});
  LOCKSTEP_CHECK(a.dtype() == b.dtype() && a.dtype() == c.dtype(),
                 "matmul: dtypes differ ({} and {}); convert one with .to()", dtype_name(a.dtype()),
                 dtype_name(b.dtype()));
  (void)cuda_type(a.dtype());
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, double alpha, double beta) {
  LOCKSTEP_ASSERT(a.dim() == 2 && b.dim() == 2 && c.dim() == 2);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  LOCKSTEP_ASSERT(b.size(0) == k && c.size(0) == m && c.size(1) == n);
  LOCKSTEP_ASSERT(c.stride(1) == 1 || n <= 1);
  check_operands(a, b, c);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0) c.zero_();
    else c.mul_(beta);
    return;
  }
  Product p{operand(a), operand(b), c.raw_data(), m == 1 ? std::max<int64_t>(n, 1) : c.stride(0),
            m, n, k};
  p.alpha = alpha, p.beta = beta;
  run(p, a.dtype(), a.device().index);
  c.storage()->bump_version();
}

void gemm_batched(const Tensor& a, const Tensor& b, Tensor& c) {
  LOCKSTEP_ASSERT(a.dim() == 3 && b.dim() == 3 && c.dim() == 3 && c.is_contiguous());
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  LOCKSTEP_ASSERT(b.size(0) == batch && b.size(1) == k && c.size(0) == batch &&
                  c.size(1) == m && c.size(2) == n);
  check_operands(a, b, c);
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {
    c.zero_();
    return;
  }
  Product p{operand(a), operand(b), c.raw_data(), std::max<int64_t>(n, 1), m, n, k};
  p.batch = batch;
  // A contiguous copy made by operand() has its own batch stride.
  p.stride_a = batch == 1 ? 0 : p.a.t.stride(0);
  p.stride_b = batch == 1 ? 0 : p.b.t.stride(0);
  p.stride_c = m * n;
  run(p, a.dtype(), a.device().index);
  c.storage()->bump_version();
}

Tensor sum_rows(const Tensor& x) {
  LOCKSTEP_ASSERT(x.dim() == 2);
  const int64_t r = x.size(0), n = x.size(1);
  Tensor out = Tensor::empty({n, 1}, x.dtype(), x.device());
  const Tensor ones = Tensor::ones({r, 1}, x.dtype(), x.device());
  gemm(x.t(), ones, out);  // [n, r] @ [r, 1]; x.t() is read transposed, not copied
  return out.view({n});
}

}  // namespace lockstep::runtime::cuda
