// CUDA streams and events (RAII), and the current stream of each device.
//
// The current stream is per thread and per device; StreamGuard sets it for a
// scope. Until set it is the device's legacy default stream (handle nullptr),
// as in PyTorch: it is what cuBLAS, cuDNN and plain CUDA calls use when given no
// stream, so lockstep work and such calls stay ordered without extra events.
// The legacy stream synchronises with blocking streams, but every Stream made
// here is non-blocking, so side streams (e.g. communication) overlap with it.
// Work that should overlap runs on its own Stream, ordered with events.
#pragma once

#include <optional>

#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::runtime::cuda {

// A stream and its device, not owned. {nullptr, d}: device d's legacy default stream.
struct StreamView {
  cudaStream_t handle = nullptr;
  int device = 0;
  bool operator==(const StreamView&) const = default;
};

struct StreamOptions {
  // Lower numbers are higher priorities (CUDA's convention); must lie in the
  // device's range (cudaDeviceGetStreamPriorityRange). nullopt: the default.
  std::optional<int> priority;
};

// An owned non-blocking stream (cudaStreamNonBlocking). Move-only.
class Stream {
 public:
  explicit Stream(int device, StreamOptions options = {});
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t handle() const { return handle_; }
  int device() const { return device_; }
  int priority() const { return priority_; }
  StreamView view() const { return {handle_, device_}; }
  operator StreamView() const { return view(); }  // NOLINT: a Stream is usable where a view is

  void synchronize() const;  // blocks the host until all queued work is done
  bool query() const;        // true when all queued work is done; never blocks

 private:
  cudaStream_t handle_ = nullptr;
  int device_ = 0;
  int priority_ = 0;
};

// Blocks the host until `stream`'s queued work is done.
void synchronize(StreamView stream);

// The calling thread's current stream on `device` (see above).
StreamView current_stream(int device);
// ... on the calling thread's current device.
StreamView current_stream();

// Makes `stream` the current stream of its device, and its device the current
// device, for a scope; restores both when it ends.
class StreamGuard {
 public:
  explicit StreamGuard(StreamView stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  DeviceGuard device_guard_;
  StreamView previous_;
};

struct EventOptions {
  bool timing = false;  // needed for elapsed_ms; off makes record and wait cheaper
};

// An owned CUDA event, created on the device of the first stream it is
// recorded on. Move-only.
class Event {
 public:
  explicit Event(EventOptions options = {}) : options_(options) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued on `stream` so far. Re-recording replaces the
  // capture; the stream must be on the event's device.
  void record(StreamView stream);
  // Makes `stream` wait (on the device, host not blocked) until the captured
  // work is done. No-op for an event never recorded.
  void wait(StreamView stream) const;
  // Blocks the host until the captured work is done.
  void synchronize() const;
  // True when the captured work is done, or nothing was recorded; never blocks.
  bool query() const;
  // Milliseconds from this event to `end`; both timing events, recorded, and
  // `end` complete (throws lockstep::Error otherwise).
  float elapsed_ms(const Event& end) const;

  bool recorded() const { return handle_ != nullptr; }
  cudaEvent_t handle() const { return handle_; }
  int device() const { return device_; }

 private:
  EventOptions options_;
  cudaEvent_t handle_ = nullptr;
  int device_ = -1;
};

}  // namespace lockstep::runtime::cuda
