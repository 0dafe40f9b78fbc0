// Work: the handle a collective returns at once.
//
// The collective runs in the background (a backend thread, MPI's progress, a
// CUDA stream). Contract:
//   is_completed()  never blocks; true once the collective has finished,
//                   successfully or not.
//   wait()          blocks until it finished, then rethrows its error if it
//                   failed. If the collective's deadline (issue time plus its
//                   timeout) passes first, throws CollectiveError saying it
//                   timed out; the group is then unusable (aborted).
//                   Returns at once on later calls.
//   exception()     the error, or nullptr; valid once is_completed().
// In a child forked while the collective was in flight, wait() throws at
// once: the collective runs on the parent's threads.
// The tensors given to the collective must stay alive and untouched until
// wait() has returned.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/runtime/error.h"

namespace lockstep::collectives {

// What failed: the op ("allreduce #12 (f32, 1000 elements, sum)"), this rank,
// the group, and the cause.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// The ranks issued different collectives at the same point of the group's
// sequence (call.h's mismatch_message words it); every rank involved gets it.
class CollectiveMismatch : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// Thrown inside a backend when a call's deadline passed; what() is the
// detail (who did not arrive), which the group words into its timeout
// message.
class DeadlineExceeded : public Error {
 public:
  using Error::Error;
};

class Work {
 public:
  using Clock = std::chrono::steady_clock;

  // `description` names the op for error messages; `deadline` is when wait()
  // gives up, throwing CollectiveError(`timeout_message`) after calling
  // `on_timeout` once (the backend marks its group aborted there).
  Work(std::string description, Clock::time_point deadline, std::string timeout_message,
       std::function<void()> on_timeout = {});
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  virtual bool is_completed();
  // Counts as waiting for other ranks, not as a hang of this one
  // (runtime/liveness.h), whoever's wait_until_done() runs.
  void wait();
  std::exception_ptr exception();
  const std::string& description() const { return description_; }
  // When finish() was called (the epoch before that): DDP's overlap statistics.
  Clock::time_point finished_at();
  // True when wait() does not block the host but orders the caller's current
  // device stream after the collective (NCCL): host clocks then say nothing
  // about when it ran, and DDP times it with device events instead.
  virtual bool waits_on_device() const { return false; }

  // Called by the backend exactly once when the collective has finished.
  void finish(std::exception_ptr error = nullptr);

  // Marks flight recorder entry `record` (distributed/flight_recorder.h) ended
  // when this Work ends: finished, failed or timed out. ProcessGroup::issue
  // calls it, once per group that returns this Work as its call's (shm's send
  // and recv return their gloo group's), so every group's entry ends.
  void record_end_as(uint64_t record);

 protected:
  // wait()'s blocking part: until finish() or the deadline (the default),
  // or whatever the backend must do first (run the call on this thread, copy
  // the results back).
  virtual void wait_until_done();
  // What wait() throws when the deadline passes (by default the message given
  // at construction), and what it does next (by default on_timeout); a
  // subclass may word the message only then, as few calls ever time out.
  virtual std::string timeout_text() { return timeout_message_; }
  virtual void timed_out(const std::string& /*message*/) {
    if (on_timeout_) on_timeout_();
  }

  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  Clock::time_point finished_at_{};
  uint64_t record_ = 0;  // the flight recorder's entry; 0: none
  // Those of the groups that returned this Work as their own after the group
  // that made it (record_): ended with it.
  std::vector<uint64_t> outer_records_;

 private:
  // Ends record_ and outer_records_ (ok or not), with mutex_ held.
  void end_records_locked(bool ok);

  std::string description_;
  Clock::time_point deadline_;
  std::string timeout_message_;
  std::function<void()> on_timeout_;
  pid_t owner_;  // the process that started the collective (wait())
};

}  // namespace lockstep::collectives
