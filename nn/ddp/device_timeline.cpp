#include "lockstep/nn/ddp/device_timeline.h"

#include "lockstep/config.h"

#if LOCKSTEP_HAVE_CUDA

#include <algorithm>
#include <utility>
#include <vector>

#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::nn {

namespace cuda = runtime::cuda;

struct DeviceTimeline::Events {
  explicit Events(int device) : device(device), side(device) {}
  int device;
  cuda::Stream side;  // waits for each bucket's collective, nothing else
  cuda::Event forward_start{{.timing = true}}, forward_end{{.timing = true}},
      backward_end{{.timing = true}}, waited{{.timing = true}};
  std::vector<std::pair<cuda::Event, cuda::Event>> buckets;  // launched, done
  size_t launched = 0;
  bool complete = false;  // every mark of the iteration recorded
  bool timeable = false;  // every bucket so far completes on the device
};

namespace {

cuda::Event timing_event() { return cuda::Event({.timing = true}); }

}  // namespace

DeviceTimeline::DeviceTimeline(int device) : events_(std::make_unique<Events>(device)) {}
DeviceTimeline::~DeviceTimeline() = default;

void DeviceTimeline::forward_started() {
  Events& e = *events_;
  e.forward_start.record(cuda::current_stream(e.device));
  e.timeable = true;
  e.complete = false;
  e.launched = 0;
}

void DeviceTimeline::forward_ended() {
  events_->forward_end.record(cuda::current_stream(events_->device));
}

void DeviceTimeline::bucket_launched(size_t index, collectives::Work& work) {
  Events& e = *events_;
  if (index != e.launched) return;  // out of step: leave this iteration host-timed
  if (!work.waits_on_device()) {
    e.timeable = false;  // a host-side backend: host clocks are the truth
    return;
  }
  if (e.buckets.size() <= index) e.buckets.emplace_back(timing_event(), timing_event());
  auto& [launched, done] = e.buckets[index];
  launched.record(cuda::current_stream(e.device));
  try {
    cuda::StreamGuard on_side(e.side);
    work.wait();  // the side stream waits for the collective; the host does not
    done.record(e.side);
  } catch (...) {
    // The error surfaces again where the reducer waits for the bucket.
    e.timeable = false;
    return;
  }
  ++e.launched;
}

void DeviceTimeline::backward_ended() {
  events_->backward_end.record(cuda::current_stream(events_->device));
}

void DeviceTimeline::buckets_waited() {
  Events& e = *events_;
  e.waited.record(cuda::current_stream(e.device));
  e.complete = e.timeable && e.launched > 0;
}

bool DeviceTimeline::resolve(DdpStats& stats) {
  Events& e = *events_;
  if (!e.complete) return false;
  e.waited.synchronize();
  std::vector<std::pair<double, double>> intervals;  // ms after forward's end
  for (size_t i = 0; i < e.launched; ++i) {
    auto& [launched, done] = e.buckets[i];
    done.synchronize();
    const double start = e.forward_end.elapsed_ms(launched);
    intervals.emplace_back(start, std::max(start, double{e.forward_end.elapsed_ms(done)}));
  }
  stats.forward_ms = e.forward_start.elapsed_ms(e.forward_end);
  stats.backward_ms = e.forward_end.elapsed_ms(e.backward_end);
  stats.comm_ms = union_length(std::move(intervals));
  stats.exposed_comm_ms = e.backward_end.elapsed_ms(e.waited);
  stats.device_clock = true;
  e.complete = false;  // resolved once; the values now live in stats
  return true;
}

}  // namespace lockstep::nn

#else  // a build without CUDA has no device to time; the reducer never makes one

namespace lockstep::nn {

struct DeviceTimeline::Events {};
DeviceTimeline::DeviceTimeline(int) {}
DeviceTimeline::~DeviceTimeline() = default;
void DeviceTimeline::forward_started() {}
void DeviceTimeline::forward_ended() {}
void DeviceTimeline::bucket_launched(size_t, collectives::Work&) {}
void DeviceTimeline::backward_ended() {}
void DeviceTimeline::buckets_waited() {}
bool DeviceTimeline::resolve(DdpStats&) { return false; }

}  // namespace lockstep::nn

#endif  // LOCKSTEP_HAVE_CUDA
