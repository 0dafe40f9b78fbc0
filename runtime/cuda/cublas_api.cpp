#include "lockstep/runtime/cuda/cublas_api.h"

#include <dlfcn.h>

#include <exception>
#include <mutex>
#include <type_traits>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

#ifndef LOCKSTEP_CUBLAS_SONAME
#error "LOCKSTEP_CUBLAS_SONAME is set by runtime/CMakeLists.txt"
#endif
#ifndef LOCKSTEP_CUBLAS_LIBRARY
#error "LOCKSTEP_CUBLAS_LIBRARY is set by runtime/CMakeLists.txt"
#endif

// The exported name of an entry point: cublas_v2.h maps several names to
// their _v2 symbols by macro, so the name is expanded before it is quoted.
#define LOCKSTEP_SYMBOL_NAME(fn) LOCKSTEP_QUOTE(fn)
#define LOCKSTEP_QUOTE(fn) #fn

namespace lockstep::runtime::cuda {

// The Ex types name exactly one of cuBLAS's declarations (this does not
// compile otherwise; decltype keeps it from needing the library at link time).
static_assert(std::is_same_v<decltype(static_cast<CublasApi::GemmEx>(&cublasGemmEx)),
                             CublasApi::GemmEx>);
static_assert(
    std::is_same_v<decltype(static_cast<CublasApi::GemmStridedBatchedEx>(
                       &cublasGemmStridedBatchedEx)),
                   CublasApi::GemmStridedBatchedEx>);

std::vector<std::string> default_cublas_candidates() {
  return {LOCKSTEP_CUBLAS_SONAME, LOCKSTEP_CUBLAS_LIBRARY};
}

namespace {

// Every entry point from `library`, or why not.
bool resolve(void* library, CublasApi& api, std::string& why) {
  bool ok = true;
  auto get = [&](auto& entry, const char* name) {
    if (!ok) return;  // the first missing one is the reason
    void* symbol = dlsym(library, name);
    if (symbol == nullptr) {
      why = fmt::format("it has no {}", name);
      ok = false;
      return;
    }
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(symbol);
  };
  get(api.create, LOCKSTEP_SYMBOL_NAME(cublasCreate));
  get(api.set_stream, LOCKSTEP_SYMBOL_NAME(cublasSetStream));
  get(api.set_workspace, LOCKSTEP_SYMBOL_NAME(cublasSetWorkspace));
  get(api.gemm_ex, LOCKSTEP_SYMBOL_NAME(cublasGemmEx));
  get(api.gemm_strided_batched_ex, LOCKSTEP_SYMBOL_NAME(cublasGemmStridedBatchedEx));
  get(api.dgemm, LOCKSTEP_SYMBOL_NAME(cublasDgemm));
  get(api.dgemm_strided_batched, LOCKSTEP_SYMBOL_NAME(cublasDgemmStridedBatched));
  get(api.get_status_string, LOCKSTEP_SYMBOL_NAME(cublasGetStatusString));
  get(api.get_status_name, LOCKSTEP_SYMBOL_NAME(cublasGetStatusName));
  return ok;
}

}  // namespace

CublasApi load_cublas(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& name : candidates) {
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why;
    if (library == nullptr) {
      const char* error = dlerror();
      why = error != nullptr ? error : "dlopen failed";
    } else {
      CublasApi api;
      if (resolve(library, api, why)) return api;  // stays open for the process
      dlclose(library);
    }
    tried += fmt::format("\n  {}: {}", name, why);
  }
  throw Error(fmt::format(
      "cuBLAS (for matmul on CUDA) could not be loaded; tried:{}\nInstall the CUDA toolkit's "
      "cuBLAS ({}), or add the folder that holds it to LD_LIBRARY_PATH",
      tried, LOCKSTEP_CUBLAS_SONAME));
}

const CublasApi& cublas() {
  static std::once_flag once;
  static CublasApi api;
  static std::exception_ptr failure;
  std::call_once(once, [] {
    try {
      api = load_cublas(default_cublas_candidates());
    } catch (...) {
      failure = std::current_exception();
    }
  });
  if (failure) std::rethrow_exception(failure);
  return api;
}

}  // namespace lockstep::runtime::cuda
