#include "lockstep/collectives/mpi/mpi_progress.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/collectives/mpi/mpi_shutdown.h"

namespace lockstep::collectives::mpi {
namespace {

using Clock = Work::Clock;
using namespace std::chrono_literals;

// How the thread waits on sends and recvs in flight without taking a core
// from the compute threads: yield for the first 100 us after the last
// progress, then sleep an eighth of the time waited so far, at most 500 us.
// New calls and aborts wake it at once.
class Backoff {
 public:
  void reset() { waiting_ = false; }
  // How long to pause now; zero means yield.
  std::chrono::microseconds next() {
    const auto now = Clock::now();
    if (!waiting_) {
      waiting_ = true;
      since_ = now;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - since_);
    if (waited < 100us) return 0us;
    return std::min<std::chrono::microseconds>(waited / 8, 500us);
  }

 private:
  bool waiting_ = false;
  Clock::time_point since_;
};

}  // namespace

MpiProgress::MpiProgress(MPI_Comm comm, std::string where, std::shared_ptr<AbortState> abort)
    : comm_(comm), where_(std::move(where)), group_abort_(std::move(abort)) {}

void MpiProgress::start_thread() {
  // The thread co-owns the engine, so a thread detached inside MPI (see
  // shutdown) never touches freed memory.
  thread_ = std::thread([self = shared_from_this()] { self->loop(); });
}

void MpiProgress::submit(std::shared_ptr<MpiOp> op) {
  {
    std::lock_guard lock(mutex_);
    if (aborted_) {
      throw CollectiveError(fmt::format("{} on {} refused: the group was aborted earlier: {}",
                                        op->description, where_, abort_reason_));
    }
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
}

void MpiProgress::abort(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    abort_reason_ = why;
  }
  if (group_abort_) group_abort_->set(why);
  cv_.notify_all();
}

std::exception_ptr MpiProgress::failure(const MpiOp& op, const std::string& cause) const {
  return std::make_exception_ptr(
      CollectiveError(fmt::format("{} failed on {}: {}", op.description, where_, cause)));
}

void MpiProgress::loop() {
  Backoff backoff;
  for (;;) {
    std::shared_ptr<MpiOp> next;
    std::deque<std::shared_ptr<MpiOp>> dropped;
    bool aborted = false, stopping = false;
    std::string why;
    {
      std::unique_lock lock(mutex_);
      if (in_flight_.empty()) cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      aborted = aborted_;
      stopping = stop_;
      if (aborted) {
        dropped.swap(queue_);
        why = abort_reason_;
      } else if (!queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
        if (next->run) blocking_ = next.get();
      }
    }
    if (aborted) {
      fail_all(dropped, why);
      if (stopping) break;
      continue;
    }
    if (stopping && !next && in_flight_.empty()) break;

    bool progressed = next != nullptr;
    if (next && next->run) {
      run_blocking(*next);
    } else if (next) {
      start_nonblocking(next);
    }
    progressed = test_in_flight() || progressed;
    if (progressed) backoff.reset();
    if (in_flight_.empty() || progressed) continue;
    const auto pause = backoff.next();
    if (pause == 0us) {
      std::this_thread::yield();
    } else {
      // Wakes early for new calls or an abort (a stop waits: in-flight calls
      // are drained first).
      std::unique_lock lock(mutex_);
      cv_.wait_for(lock, pause, [&] { return aborted_ || !queue_.empty(); });
    }
  }
  {
    std::lock_guard lock(mutex_);
    exited_ = true;
  }
  cv_.notify_all();
}

void MpiProgress::run_blocking(MpiOp& op) {
  std::exception_ptr error;
  std::string cause;
  try {
    op.run(comm_);
    if (op.complete) op.complete(MPI_Status{});
  } catch (const CollectiveMismatch& e) {
    cause = e.what();  // worded already, the same on every rank
    error = std::current_exception();
  } catch (const std::exception& e) {
    cause = fmt::format("{} failed: {}", op.description, e.what());
    error = failure(op, e.what());
  }
  {
    std::lock_guard lock(mutex_);
    blocking_ = nullptr;
  }
  op.work->finish(error);
  if (error) abort(cause);
}

bool MpiProgress::start_nonblocking(std::shared_ptr<MpiOp>& op) {
  try {
    op->start(comm_, op->requests);
  } catch (const std::exception& e) {
    op->work->finish(failure(*op, e.what()));
    abort(fmt::format("{} could not be started: {}", op->description, e.what()));
    return false;
  }
  in_flight_.push_back(std::move(op));
  return true;
}

// Tests `op`'s requests in order until one is still pending; done when none
// is. One MPI_Test at a time: MPI_Testall on a send's two requests made a
// 4 MiB round trip about a third slower under the backoff.
int MpiProgress::test_requests(MpiOp& op, int& done) {
  done = 1;
  for (int k = 0; k < MpiOp::kRequests && done != 0; ++k) {
    if (op.requests[k] == MPI_REQUEST_NULL) continue;
    const int rc = MPI_Test(&op.requests[k], &done, &op.statuses[k]);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

bool MpiProgress::test_in_flight() {
  bool finished = false;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    MpiOp& op = **it;
    int done = 0;
    const int rc = test_requests(op, done);
    if (rc != MPI_SUCCESS) {
      std::string cause;
      try {
        check_mpi_result(rc, "MPI_Test", __FILE__, __LINE__);
      } catch (const std::exception& e) {
        cause = e.what();
      }
      // Once a recv's header has come, its completion check names a
      // mismatched message better than MPI's code does (a message longer
      // than the tensor fails in MPI, as a truncation).
      try {
        if (op.complete && op.requests[0] == MPI_REQUEST_NULL) op.complete(op.statuses[1]);
      } catch (const std::exception& e) {
        cause = e.what();
      }
      op.work->finish(failure(op, cause));
      abort(fmt::format("{} failed: {}", op.description, cause));
      // A request still live (MPI may write into its buffer) is kept by fail_all.
      const bool live = std::any_of(std::begin(op.requests), std::end(op.requests),
                                    [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
      if (live) {
        ++it;
      } else {
        it = in_flight_.erase(it);
      }
    } else if (done != 0) {
      std::exception_ptr error;
      try {
        if (op.complete) op.complete(op.statuses[1]);
      } catch (const std::exception& e) {
        error = failure(op, e.what());
      }
      op.work->finish(error);
      it = in_flight_.erase(it);
      finished = true;
    } else if (Clock::now() >= op.deadline) {
      op.work->finish(std::make_exception_ptr(CollectiveError(op.timeout_message)));
      abort(op.timeout_message);
      ++it;
    } else {
      ++it;
    }
  }
  return finished;
}

// After an abort every pending call fails. Requests MPI never completed are
// kept (with their tensors) until shutdown, since MPI may still write into
// those buffers.
void MpiProgress::fail_all(std::deque<std::shared_ptr<MpiOp>>& dropped, const std::string& why) {
  for (auto& op : in_flight_) {
    op->work->finish(failure(*op, "the group was aborted: " + why));
    abandoned_.push_back(std::move(op));
  }
  in_flight_.clear();
  for (auto& op : dropped) {
    op->work->finish(std::make_exception_ptr(CollectiveError(fmt::format(
        "{} on {} was not run: the group was aborted: {}", op->description, where_, why))));
  }
  dropped.clear();
  if (!abandoned_.empty()) {
    mark_unfinishable(fmt::format("a call on {} never completed ({})", where_,
                                  abandoned_.front()->description));
  }
}

void MpiProgress::shutdown() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;

  // Let the thread drain what was issued; a blocking call past its deadline,
  // or in an aborted group, will not return: give up on it.
  std::string stuck;
  {
    std::unique_lock lock(mutex_);
    while (!exited_) {
      if (blocking_ != nullptr && (aborted_ || Clock::now() >= blocking_->deadline)) {
        stuck = blocking_->timeout_message;
        break;
      }
      cv_.wait_for(lock, 20ms);
    }
  }
  if (!stuck.empty()) {
    abort(stuck);
    mark_unfinishable(stuck);
    thread_.detach();  // the communicator is left to it
    return;
  }
  thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!abandoned_.empty()) {
    // MPI may still write into these buffers: leak them, and the
    // communicator, rather than free memory MPI points at.
    new std::vector<std::shared_ptr<MpiOp>>(std::move(abandoned_));
  } else if (finalized == 0 && MPI_Comm_free(&comm_) != MPI_SUCCESS) {
    std::fprintf(stderr, "lockstep: MPI_Comm_free failed on %s\n", where_.c_str());
  }
}

}  // namespace lockstep::collectives::mpi
