#include "lockstep/runtime/cuda/stream.h"

#include <utility>
#include <vector>

#include "lockstep/runtime/error.h"

namespace lockstep::runtime::cuda {
namespace {

// Per thread, per device: the current stream's handle (nullptr: legacy default).
thread_local std::vector<cudaStream_t> t_current_streams;

void set_current_stream(StreamView stream) {
  LOCKSTEP_CHECK(stream.device >= 0, "CUDA stream: device index {} is negative", stream.device);
  const auto index = static_cast<std::size_t>(stream.device);
  if (t_current_streams.size() <= index) t_current_streams.resize(index + 1, nullptr);
  t_current_streams[index] = stream.handle;
}

}  // namespace

// ---- Stream -------------------------------------------------------------------

Stream::Stream(int device, StreamOptions options) : device_(device) {
  DeviceGuard guard(device);
  int least = 0;
  int greatest = 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  priority_ = options.priority.value_or(least);
  LOCKSTEP_CHECK(priority_ <= least && priority_ >= greatest,
                 "CUDA stream priority {} is outside device {}'s range [{}, {}] (lower numbers "
                 "are higher priorities)",
                 priority_, device, greatest, least);
  LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithPriority(&handle_, cudaStreamNonBlocking, priority_));
}

Stream::~Stream() {
  if (handle_ == nullptr) return;
  // Destroying a stream with queued work is allowed: the work still completes.
  if (const cudaError_t error = cudaStreamDestroy(handle_); error != cudaSuccess) {
    detail::warn_cuda_error(error, "cudaStreamDestroy in ~Stream");
  }
}

Stream::Stream(Stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      device_(other.device_),
      priority_(other.priority_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    priority_ = other.priority_;
  }
  return *this;
}

void Stream::synchronize() const { cuda::synchronize(view()); }

bool Stream::query() const {
  const cudaError_t status = cudaStreamQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LOCKSTEP_CUDA_CHECK(status);
  return true;
}

void synchronize(StreamView stream) {
  DeviceGuard guard(stream.device);  // for the legacy stream, whose device is the current one
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(stream.handle));
}

// ---- current stream -------------------------------------------------------------

StreamView current_stream(int device) {
  const auto index = static_cast<std::size_t>(device);
  if (device < 0 || index >= t_current_streams.size()) return {nullptr, device};
  return {t_current_streams[index], device};
}

StreamView current_stream() { return current_stream(current_device()); }

StreamGuard::StreamGuard(StreamView stream)
    : device_guard_(stream.device), previous_(current_stream(stream.device)) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  try {
    set_current_stream(previous_);
  } catch (...) {
    // Cannot fail: the slot exists since the constructor.
  }
}

// ---- Event ----------------------------------------------------------------------

Event::~Event() {
  if (handle_ == nullptr) return;
  if (const cudaError_t error = cudaEventDestroy(handle_); error != cudaSuccess) {
    detail::warn_cuda_error(error, "cudaEventDestroy in ~Event");
  }
}

Event::Event(Event&& other) noexcept
    : options_(other.options_),
      handle_(std::exchange(other.handle_, nullptr)),
      device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    options_ = other.options_;
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Event::record(StreamView stream) {
  DeviceGuard guard(stream.device);
  if (handle_ == nullptr) {
    const unsigned flags = options_.timing ? cudaEventDefault : cudaEventDisableTiming;
    LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, flags));
    device_ = stream.device;
  }
  LOCKSTEP_CHECK(device_ == stream.device,
                 "CUDA event of device {} cannot be recorded on a stream of device {}", device_,
                 stream.device);
  LOCKSTEP_CUDA_CHECK(cudaEventRecord(handle_, stream.handle));
}

void Event::wait(StreamView stream) const {
  if (handle_ == nullptr) return;
  DeviceGuard guard(stream.device);
  LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(stream.handle, handle_, 0));
}

void Event::synchronize() const {
  if (handle_ == nullptr) return;
  LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(handle_));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  const cudaError_t status = cudaEventQuery(handle_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LOCKSTEP_CUDA_CHECK(status);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  LOCKSTEP_CHECK(options_.timing && end.options_.timing,
                 "Event::elapsed_ms needs two events made with EventOptions{{.timing = true}}");
  LOCKSTEP_CHECK(recorded() && end.recorded(),
                 "Event::elapsed_ms: both events must be recorded first");
  float ms = 0.0f;
  LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_));
  return ms;
}

}  // namespace lockstep::runtime::cuda
