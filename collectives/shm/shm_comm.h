// One rank's view of a shm group's segment: the layout, the arrival counters
// the ranks synchronise on, and the staging buffers the algorithms use.
//
// Layout (after the segment's stamp page):
//   header page        world size, buffer size, the abort word and reason
//   one slot per rank  its arrival counter (a futex word), how many ranks
//                      sleep on it, and its process identity
//   staging buffers    per rank, two halves of buffer_bytes each
//
// Synchronisation: rank r's counter counts its arrivals; every rank arrives
// the same number of times in the same order, so "rank q has arrived k times"
// is a point in q's program. barrier() arrives and waits for every other
// rank's counter to reach the same k. A wait spins only while a thread of
// this rank is blocked on the result and the awaited rank is busy in
// collectives, so microseconds away (it arrived, or woke up in a wait,
// moments ago, or this rank's arrival has just woken it), and at most 2 ms;
// otherwise it sleeps on the futex in slices, checking between slices the
// deadline, the abort word and whether the awaited peer's process has
// exited or its group was destroyed. An arriving rank wakes the futex only
// when someone sleeps on it.
//
// Shared tensor pools (shm_pool.h) added to the Comm let a collective read a
// peer's data in place: each rank publishes in its slot where its data lies
// (which pool, what offset) before a barrier, and reads the others' after it.
//
// The call check: before the first barrier of each collective every rank
// writes the call's signature (call.h) into its slot, at the half of its
// two signature places that the barrier's arrival number selects, and after
// that barrier compares every other rank's with its own, before it reads any
// peer's data. All ranks compare at the same barrier (every collective
// arrives at least once, so arrival numbers and calls stay paired until the
// first difference), so a difference fails every rank there, with the same
// message. Two places, because a rank may write its next call's signature
// before a slower rank has read this one; it cannot write the one after
// before that rank arrives again. Each rank also keeps in its slot the last
// call it completed, which a waiting rank names when it gives up or reports
// a stall.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/collectives/call.h"
#include "lockstep/collectives/shm/process_watch.h"
#include "lockstep/collectives/shm/shm_pool.h"
#include "lockstep/collectives/shm/shm_segment.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives::shm {

using Clock = std::chrono::steady_clock;

class Comm {
 public:
  // A waiting rank spins while the rank it waits for arrived somewhere within
  // this long; past it, it sleeps.
  static constexpr std::chrono::microseconds kDefaultSpin{300};

  // Segment bytes a group of `size` ranks needs.
  static size_t segment_bytes(int size, size_t buffer_bytes);

  // Rank 0 passes create = true and initialises the header; the others check
  // it. Every rank then publishes its process identity in its slot.
  Comm(Segment segment, int rank, int size, size_t buffer_bytes, std::chrono::microseconds spin,
       bool create);
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Once every rank has published its identity: start watching the others.
  void watch_peers();
  // Waits spin only while *waiters > 0 (a thread of this rank is blocked on
  // a result); null: always.
  void set_waiters(const std::atomic<int>* waiters) { waiters_ = waiters; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  // Rank q's staging buffer `half` (0 or 1).
  std::byte* buffer(int q, int half) const;
  // The half the next round stages in: rounds alternate halves, so a rank may
  // fill one while slower ranks still read the other (see shm_algorithms.h).
  int next_half() { return static_cast<int>(round_++ & 1); }

  // Arrive, then wait until every rank has arrived as often. Throws
  // DeadlineExceeded past `deadline` (naming the ranks that did not arrive
  // and the last call each completed), and lockstep::Error naming the rank
  // when a peer's process exited, a peer left (leave()) or some rank aborted
  // the group.
  void barrier(Clock::time_point deadline);

  // The collective now running: the next barrier checks that every rank is
  // in the same call (see the top), and long waits name it. The Call must
  // outlive the collective.
  void begin_call(const Call& call);
  // True while the check is still to happen: a collective that did not
  // arrive anywhere (nothing to move) arrives once more so that it does.
  bool check_pending() const { return check_pending_; }
  // The collective finished on this rank; when it `completed`, it is
  // recorded for the others to name.
  void end_call(bool completed);

  // Pools in reservation order (the same on every rank, added at the same
  // point of the collective sequence).
  void add_pool(std::shared_ptr<Pool> pool) { pools_.push_back(std::move(pool)); }
  bool has_pools() const { return !pools_.empty(); }
  // Publishes where [data, data + bytes) lies among this rank's pools (or
  // that it lies in none), for the others to read after the next barrier.
  void publish_view(const void* data, size_t bytes);
  // After that barrier, and before this rank's next arrival: where rank q's
  // published data lies in this process, or nullptr when it lies in no pool.
  std::byte* peer_view(int q) const;

  // This rank is done with the group (its group is being destroyed, no call
  // running): a rank waiting for its arrival fails within seconds, naming
  // it (as exited, if its process ends meanwhile).
  void leave();
  // Marks the group failed for every rank (first reason wins) and wakes them.
  void abort(const std::string& reason);
  // The reason the group was aborted (by any rank), or "".
  std::string abort_reason() const;
  Segment& segment() { return segment_; }

 private:
  struct Header;
  struct Slot;
  Header& header() const;
  Slot& slot(int q) const;
  // `woke_peers`: this rank's arrival just woke ranks asleep on it.
  void wait_for(int q, uint32_t target, Clock::time_point deadline, bool woke_peers);
  void check_abort() const;
  // Why rank q will never arrive `target` times ("exited", ...), or "".
  std::string peer_gone(int q, uint32_t target) const;
  // "rank q", or as the running call names it (a composite's rank).
  std::string rank_name(int q) const;
  // After a barrier: every rank's signature of this call, compared.
  void check_same_call();
  // The ranks that have not arrived `target` times, with the last call each
  // completed: "rank 1 (pid 42) did not join it; the last collective it
  // completed was #7 allreduce(f32, 10 elements, sum)".
  std::string who_is_missing(uint32_t target) const;
  // Once per call, a wait longer than the call's stall_report prints a line.
  void report_stall(uint32_t target);

  Segment segment_;
  int rank_;
  int size_;
  size_t buffer_bytes_;
  std::chrono::microseconds spin_;
  std::byte* buffers_ = nullptr;
  uint32_t arrived_ = 0;
  uint64_t round_ = 0;
  std::vector<ProcessWatch> peers_;
  std::vector<ProcessIdentity> identities_;
  const std::atomic<int>* waiters_ = nullptr;
  std::vector<std::shared_ptr<Pool>> pools_;
  const Call* call_ = nullptr;  // begin_call's, until end_call
  PackedSignature call_words_{};  // call_'s signature, packed
  uint64_t call_hash_ = 0;        // and hashed
  bool check_pending_ = false;
  bool stall_reported_ = false;
  Clock::time_point call_start_{};
};

}  // namespace lockstep::collectives::shm
