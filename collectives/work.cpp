#include "lockstep/collectives/work.h"

#include <utility>

#include <fmt/format.h>

#include "lockstep/distributed/flight_recorder.h"
#include "lockstep/runtime/liveness.h"
#include "lockstep/runtime/process_id.h"

namespace lockstep::collectives {

Work::Work(std::string description, Clock::time_point deadline, std::string timeout_message,
           std::function<void()> on_timeout)
    : description_(std::move(description)),
      deadline_(deadline),
      timeout_message_(std::move(timeout_message)),
      on_timeout_(std::move(on_timeout)),
      owner_(runtime::this_process_id()) {}

bool Work::is_completed() {
  std::lock_guard lock(mutex_);
  return done_;
}

void Work::wait() {
  // A child forked while the collective was in flight holds a copy of this
  // Work, but the collective runs on the parent's threads, which the child
  // does not have: nothing would finish it before the deadline. Read without
  // the mutex, which another of the parent's threads may have held at the
  // fork; only this thread runs in the child.
  if (runtime::this_process_id() != owner_) {
    if (!done_) {
      throw CollectiveError(fmt::format(
          "{}: waited for in process {}, forked from process {} while the collective was in "
          "flight; it runs in that process, so its result never reaches this one. Wait for "
          "it before forking, or make a group of the child's own (init_process_group)",
          description_, runtime::this_process_id(), owner_));
    }
    if (error_) std::rethrow_exception(error_);
    return;
  }
  // Waiting for the other ranks is not a hang of this one (runtime/liveness.h),
  // whether this thread only waits or runs the collective itself.
  const runtime::BusyScope waiting_for_peers;
  wait_until_done();
}

void Work::wait_until_done() {
  std::unique_lock lock(mutex_);
  if (!done_cv_.wait_until(lock, deadline_, [&] { return done_; })) {
    // Timed out: the backend's thread may still be inside the collective.
    // Record the timeout as this Work's error so later waits rethrow it.
    const std::string message = timeout_text();
    error_ = std::make_exception_ptr(CollectiveError(message));
    done_ = true;
    end_records_locked(/*ok=*/false);
    lock.unlock();
    timed_out(message);
    std::rethrow_exception(error_);
  }
  if (error_) std::rethrow_exception(error_);
}

std::exception_ptr Work::exception() {
  std::lock_guard lock(mutex_);
  return error_;
}

Work::Clock::time_point Work::finished_at() {
  std::lock_guard lock(mutex_);
  return finished_at_;
}

// The flight recorder's entry ends under mutex_, with done_: whoever sees the
// Work done finds the entry ended.
void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;  // already timed out; the late result is dropped
    error_ = std::move(error);
    done_ = true;
    finished_at_ = Clock::now();
    end_records_locked(error_ == nullptr);
  }
  done_cv_.notify_all();
}

void Work::record_end_as(uint64_t record) {
  if (record == 0) return;  // not recorded here (a wrapper's inner group records it)
  std::lock_guard lock(mutex_);
  if (done_) {
    distributed::FlightRecorder::instance().ended(record, error_ == nullptr);  // ended already
  } else if (record_ == 0) {
    record_ = record;
  } else {
    outer_records_.push_back(record);
  }
}

void Work::end_records_locked(bool ok) {
  auto& recorder = distributed::FlightRecorder::instance();
  recorder.ended(std::exchange(record_, 0), ok);
  for (uint64_t record : outer_records_) recorder.ended(record, ok);
  outer_records_.clear();
}

}  // namespace lockstep::collectives
