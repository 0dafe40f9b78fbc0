// The thread that runs one mpi group's calls, in issue order.
//
// Collectives run as MPI's own blocking calls (MPI_Allreduce, ...) on this
// thread, so the caller gets its Work at once while Open MPI picks its tuned,
// shared-memory algorithms: its non-blocking collectives (libnbc) measured
// 1.7-2.4x slower than the blocking ones at 1-16 MiB. Point-to-point calls
// stay non-blocking (MPI_Isend/MPI_Irecv, tested until done), because a ring
// of sends and recvs needs several in flight at once; MPI progresses them
// inside any later blocking call too.
//
// A blocking call cannot be interrupted: its timeout is enforced by
// Work::wait(), which aborts the group. A thread still stuck in MPI when the
// group shuts down is detached (it owns this engine through a shared_ptr) and
// MPI_Finalize is skipped, since MPI may still use the call's buffers.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/work.h"

namespace lockstep::collectives::mpi {

// One issued call. Exactly one of `run` and `start` is set. The lambdas hold
// the tensors, so their buffers live as long as the op.
struct MpiOp {
  // A send or recv is two messages: its data, and a header saying what the
  // data is (see mpi_group.cpp).
  static constexpr int kRequests = 2;
  std::shared_ptr<Work> work;
  std::string description;
  Work::Clock::time_point deadline;
  std::string timeout_message;
  std::function<void(MPI_Comm)> run;                    // a blocking collective
  // A non-blocking send or recv: starts requests[0] (the header) and
  // requests[1] (the data).
  std::function<void(MPI_Comm, MPI_Request*)> start;
  // After success, with the data's status; may be empty. Also when the data's
  // request failed after the header came: what it throws then names the
  // failure better than MPI's error code.
  std::function<void(const MPI_Status&)> complete;
  MPI_Request requests[kRequests] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  MPI_Status statuses[kRequests] = {};  // each request's, once it completed
};

class MpiProgress : public std::enable_shared_from_this<MpiProgress> {
 public:
  // `where` names this rank and group in errors: "rank 1 of group 'g' (mpi, 2
  // ranks)". `abort`: the group's, set too when the group is aborted here.
  MpiProgress(MPI_Comm comm, std::string where, std::shared_ptr<AbortState> abort = nullptr);
  void start_thread();

  // Queues `op`; throws CollectiveError if the group was aborted.
  void submit(std::shared_ptr<MpiOp> op);
  // Every pending and later call fails with `why`. Idempotent.
  void abort(const std::string& why);
  // Drains what was issued, stops the thread and frees the communicator.
  void shutdown() noexcept;

 private:
  void loop();
  void run_blocking(MpiOp& op);
  bool start_nonblocking(std::shared_ptr<MpiOp>& op);  // false: failed to start
  static int test_requests(MpiOp& op, int& done);      // an MPI error code
  bool test_in_flight();                                // true: something finished
  void fail_all(std::deque<std::shared_ptr<MpiOp>>& fresh, const std::string& why);
  std::exception_ptr failure(const MpiOp& op, const std::string& cause) const;

  MPI_Comm comm_;
  const std::string where_;
  const std::shared_ptr<AbortState> group_abort_;
  std::thread thread_;
  std::vector<std::shared_ptr<MpiOp>> in_flight_;  // thread only
  std::vector<std::shared_ptr<MpiOp>> abandoned_;  // thread only, then shutdown()

  std::mutex mutex_;  // guards what follows
  std::condition_variable cv_;
  std::deque<std::shared_ptr<MpiOp>> queue_;  // issued, not yet started
  const MpiOp* blocking_ = nullptr;           // the blocking call now inside MPI
  bool stop_ = false;
  bool exited_ = false;
  bool shut_down_ = false;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace lockstep::collectives::mpi
