#include "lockstep/runtime/cuda/activity_trace.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

#if LOCKSTEP_HAVE_CUPTI
#include <cupti.h>
#endif

namespace lockstep::runtime::cuda {

#if LOCKSTEP_HAVE_CUPTI

namespace {

// The entry points a trace uses (decltype: the header's declarations, not
// the library, at link time).
struct CuptiApi {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

CuptiApi api;
std::mutex records_mutex;
std::vector<DeviceActivity> records;  // from the completed buffers of the trace running
std::atomic<bool> tracing{false};

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  return out;
}

// Kineto's names for copies and fills, so that both sides group alike.
std::string memcpy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "Memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "Memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "Memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "Memcpy PtoP";
    default: return "Memcpy";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;  // 0: CUPTI drops records, it does not fail
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<DeviceActivity> got;
  CUpti_Activity* record = nullptr;
  while (api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      got.push_back({demangled(k->name), k->start / 1e3, k->end / 1e3});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      got.push_back({memcpy_name(m->copyKind), m->start / 1e3, m->end / 1e3});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      got.push_back({"Memset", m->start / 1e3, m->end / 1e3});
    }
  }
  std::free(buffer);
  std::lock_guard lock(records_mutex);
  records.insert(records.end(), std::make_move_iterator(got.begin()),
                 std::make_move_iterator(got.end()));
}

std::string result_text(CUptiResult result) {
  const char* text = nullptr;
  if (api.result_string == nullptr || api.result_string(result, &text) != CUPTI_SUCCESS ||
      text == nullptr) {
    return fmt::format("CUPTI error {}", static_cast<int>(result));
  }
  return text;
}

void check(CUptiResult result, const char* what) {
  if (result != CUPTI_SUCCESS) {
    throw Error(fmt::format("cannot trace the GPU's activity: {} failed: {}", what,
                            result_text(result)));
  }
}

// Opens CUPTI and registers the buffer callbacks, once; "" or why not.
std::string load_cupti() {
  static const std::string why = [] {
    std::vector<std::string> candidates;
    if (const auto file = process_env()("LOCKSTEP_CUPTI_LIBRARY"); file && !file->empty()) {
      candidates.push_back(*file);
    } else {
      candidates = {LOCKSTEP_CUPTI_SONAME, LOCKSTEP_CUPTI_LIBRARY};
    }
    std::string tried;
    for (const std::string& name : candidates) {
      if (name.empty()) continue;
      void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library == nullptr) {
        const char* error = dlerror();
        // dlerror() names the file itself.
        tried += error != nullptr ? fmt::format("; {}", error) : fmt::format("; {}: not found", name);
        continue;
      }
      CuptiApi found;
      bool ok = true;
      auto get = [&](auto& entry, const char* symbol) {
        void* address = dlsym(library, symbol);
        if (address == nullptr && ok) {
          tried += fmt::format("; {}: it has no {}", name, symbol);
          ok = false;
        }
        entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(address);
      };
      get(found.register_callbacks, "cuptiActivityRegisterCallbacks");
      get(found.enable, "cuptiActivityEnable");
      get(found.disable, "cuptiActivityDisable");
      get(found.flush_all, "cuptiActivityFlushAll");
      get(found.next_record, "cuptiActivityGetNextRecord");
      get(found.result_string, "cuptiGetResultString");
      if (!ok) {
        dlclose(library);
        continue;
      }
      api = found;  // the library stays open for the process
      CUptiResult r = api.register_callbacks(buffer_requested, buffer_completed);
      return r == CUPTI_SUCCESS ? std::string()
                                : "cuptiActivityRegisterCallbacks: " + result_text(r);
    }
    return fmt::format("cannot open CUPTI{} (set LOCKSTEP_CUPTI_LIBRARY to the path of "
                       "libcupti.so)",
                       tried.empty() ? "" : " (" + tried.substr(2) + ")");
  }();
  return why;
}

class CuptiTrace final : public DeviceActivityTrace {
 public:
  CuptiTrace() {
    std::vector<CUpti_ActivityKind> enabled;
    try {
      for (CUpti_ActivityKind kind : kKinds) {
        check(api.enable(kind), "cuptiActivityEnable");
        enabled.push_back(kind);
      }
    } catch (...) {
      for (CUpti_ActivityKind kind : enabled) api.disable(kind);
      tracing = false;
      throw;
    }
  }
  ~CuptiTrace() override {
    if (running_) end();
  }

  std::vector<DeviceActivity> stop() override {
    LOCKSTEP_CHECK(running_, "this device activity trace was already stopped");
    LOCKSTEP_CUDA_CHECK(cudaDeviceSynchronize());  // the current device's work is recorded
    end();
    std::vector<DeviceActivity> out;
    {
      std::lock_guard lock(records_mutex);
      out.swap(records);
    }
    std::sort(out.begin(), out.end(), [](const DeviceActivity& a, const DeviceActivity& b) {
      return a.start_us < b.start_us;
    });
    return out;
  }

 private:
  void end() {
    api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (CUpti_ActivityKind kind : kKinds) api.disable(kind);
    api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    running_ = false;
    tracing = false;
  }

  bool running_ = true;
};

}  // namespace

std::unique_ptr<DeviceActivityTrace> start_activity_trace() {
  const std::string why = load_cupti();
  if (!why.empty()) throw Error("cannot trace the GPU's activity: " + why);
  LOCKSTEP_CHECK(!tracing.exchange(true),
                 "a device activity trace is already running; stop it before starting another");
  {
    std::lock_guard lock(records_mutex);
    records.clear();
  }
  return std::make_unique<CuptiTrace>();
}

#else

std::unique_ptr<DeviceActivityTrace> start_activity_trace() {
  throw Error(
      "cannot trace the GPU's activity: this build of lockstep found no CUPTI headers "
      "(cupti.h, in the CUDA toolkit or Python's nvidia-cuda-cupti wheel; pass CUPTI_ROOT)");
}

#endif

}  // namespace lockstep::runtime::cuda
