// DDP's timings on a device, where host clocks only see kernel launches; the
// marks are the device backend's (runtime/device_backend.h: DeviceMarks).
//
// Events on the compute stream mark the start and end of forward, the end of
// backward's computation and the end of the wait for the buckets. For each
// bucket whose collective completes on the device (NCCL), a side stream waits
// for it and records an event, so its completion is timed without holding
// back the compute stream. Nothing blocks until resolve() is asked for the
// numbers; an iteration nobody asks about costs a few event records.
#pragma once

#include <cstddef>
#include <memory>

#include "lockstep/collectives/work.h"
#include "lockstep/nn/ddp/ddp_stats.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::runtime {
class DeviceMarks;
}

namespace lockstep::nn {

class DeviceTimeline {
 public:
  explicit DeviceTimeline(runtime::Device device);
  ~DeviceTimeline();
  DeviceTimeline(const DeviceTimeline&) = delete;
  DeviceTimeline& operator=(const DeviceTimeline&) = delete;

  void forward_started();
  void forward_ended();
  // Bucket `index` (launch order) handed `work` to the communication hook.
  void bucket_launched(size_t index, collectives::Work& work);
  void backward_ended();
  void buckets_waited();

  // Overwrites forward, backward, communication and exposed times in `stats`
  // with device times, when this iteration was fully timed on the device;
  // blocks until its events completed. False (stats untouched) otherwise.
  bool resolve(DdpStats& stats);

 private:
  std::unique_ptr<runtime::DeviceMarks> marks_;
  size_t launched_ = 0;    // buckets timed this iteration
  bool complete_ = false;  // every mark of the iteration recorded
  bool timeable_ = false;  // every bucket so far completes on the device
};

}  // namespace lockstep::nn
