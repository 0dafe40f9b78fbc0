#include "lockstep/nn/ddp/device_timeline.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "lockstep/runtime/device_backend.h"

namespace lockstep::nn {
namespace {

// The marks of one iteration: four fixed ones, then two per bucket.
enum Mark : size_t { kForwardStart, kForwardEnd, kBackwardEnd, kWaited, kFirstBucket };
size_t launched_mark(size_t bucket) { return kFirstBucket + 2 * bucket; }
size_t done_mark(size_t bucket) { return kFirstBucket + 2 * bucket + 1; }

}  // namespace

DeviceTimeline::DeviceTimeline(runtime::Device device)
    : marks_(runtime::device_backend(device).timing_marks(device)) {}
DeviceTimeline::~DeviceTimeline() = default;

void DeviceTimeline::forward_started() {
  marks_->record(kForwardStart);
  timeable_ = true;
  complete_ = false;
  launched_ = 0;
}

void DeviceTimeline::forward_ended() { marks_->record(kForwardEnd); }

void DeviceTimeline::bucket_launched(size_t index, collectives::Work& work) {
  if (index != launched_) return;  // out of step: leave this iteration host-timed
  if (!work.waits_on_device()) {
    timeable_ = false;  // a host-side backend: host clocks are the truth
    return;
  }
  marks_->record(launched_mark(index));
  try {
    // The side stream waits for the collective; the host does not.
    marks_->record_after_on_side(done_mark(index), [&work] { work.wait(); });
  } catch (...) {
    // The error surfaces again where the reducer waits for the bucket.
    timeable_ = false;
    return;
  }
  ++launched_;
}

void DeviceTimeline::backward_ended() { marks_->record(kBackwardEnd); }

void DeviceTimeline::buckets_waited() {
  marks_->record(kWaited);
  complete_ = timeable_ && launched_ > 0;
}

bool DeviceTimeline::resolve(DdpStats& stats) {
  if (!complete_) return false;
  marks_->synchronize(kWaited);
  std::vector<std::pair<double, double>> intervals;  // ms after forward's end
  for (size_t i = 0; i < launched_; ++i) {
    marks_->synchronize(done_mark(i));
    const double start = marks_->elapsed_ms(kForwardEnd, launched_mark(i));
    intervals.emplace_back(start, std::max(start, marks_->elapsed_ms(kForwardEnd, done_mark(i))));
  }
  stats.forward_ms = marks_->elapsed_ms(kForwardStart, kForwardEnd);
  stats.backward_ms = marks_->elapsed_ms(kForwardEnd, kBackwardEnd);
  stats.comm_ms = union_length(std::move(intervals));
  stats.exposed_comm_ms = marks_->elapsed_ms(kBackwardEnd, kWaited);
  stats.device_clock = true;
  complete_ = false;  // resolved once; the values now live in stats
  return true;
}

}  // namespace lockstep::nn
