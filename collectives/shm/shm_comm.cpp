#include "lockstep/collectives/shm/shm_comm.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "lockstep/collectives/work.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace lockstep::collectives::shm {
namespace {

constexpr uint32_t kHeaderMagic = 0x6c6b7368;  // "lksh"
constexpr size_t kPage = 4096;
constexpr size_t kSlotBytes = 256;  // the counter and the identity on separate cache lines
// How long a sleeping wait sleeps before it looks at the deadline, the abort
// word and the awaited peer again.
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
// Bounds of one wait's spin (see wait_for).
constexpr auto kMinSpin = std::chrono::microseconds(5);
constexpr auto kMaxSpin = std::chrono::milliseconds(2);

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, Clock::duration for_at_most) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(for_at_most).count();
  timespec t{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  // Not FUTEX_PRIVATE: the word is shared between processes.
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAIT, seen, &t, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// The abort word while its reason is being written.
constexpr uint32_t kWriting = 0xffffffffu;

bool reached(uint32_t count, uint32_t target) { return static_cast<int32_t>(count - target) >= 0; }

}  // namespace

// The header and slots are part of the wire protocol: change
// distributed/wire_protocol.h's kWireProtocol with their layout.
struct Comm::Header {
  uint32_t magic;
  uint32_t world_size;
  uint64_t buffer_bytes;
  std::atomic<uint32_t> abort_word;  // 0, kWriting, or 1 + the rank that aborted first
  char abort_reason[1024];
};

struct Comm::Slot {
  alignas(64) std::atomic<uint32_t> arrivals;
  std::atomic<uint32_t> sleepers;  // ranks sleeping on `arrivals`
  // The last arrival, or wake-up inside a wait: steady clock (CLOCK_MONOTONIC,
  // node-wide). Recent: the rank is busy in collectives.
  std::atomic<int64_t> last_active_ns;
  // publish_view's: the pool (-1: none) and the offset in this rank's segment.
  std::atomic<int32_t> view_pool;
  std::atomic<int64_t> view_offset;
  // The call whose first barrier is this rank's arrival number a, at [a & 1]
  // (see the call check in shm_comm.h): its hash here, on the line a waiting
  // rank reads anyway, and its signature, read only when a hash differs.
  std::atomic<uint64_t> call_hash[2];
  // When this rank's group was destroyed (steady clock; 0: it was not): it
  // arrives no more.
  std::atomic<int64_t> left_ns;
  alignas(64) std::atomic<uint64_t> call[2][4];
  // The last call this rank completed (seq 0: none yet).
  alignas(64) std::atomic<uint64_t> done[4];
  alignas(64) ProcessIdentity identity;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

namespace {

void store_signature(std::atomic<uint64_t> (&to)[4], const PackedSignature& words) {
  for (size_t i = 0; i < 4; ++i) to[i].store(words[i], std::memory_order_relaxed);
}

CallSignature load_signature(const std::atomic<uint64_t> (&from)[4]) {
  PackedSignature words;
  for (size_t i = 0; i < 4; ++i) words[i] = from[i].load(std::memory_order_relaxed);
  return unpack(words);
}

}  // namespace

size_t Comm::segment_bytes(int size, size_t buffer_bytes) {
  return round_up(kPage + static_cast<size_t>(size) * kSlotBytes, kPage) +
         static_cast<size_t>(size) * 2 * buffer_bytes;
}

Comm::Comm(Segment segment, int rank, int size, size_t buffer_bytes, std::chrono::microseconds spin,
           bool create)
    : segment_(std::move(segment)), rank_(rank), size_(size), buffer_bytes_(buffer_bytes), spin_(spin) {
  static_assert(sizeof(Slot) <= kSlotBytes);
  static_assert(sizeof(Header) <= kPage);
  LOCKSTEP_ASSERT(segment_.size() >= segment_bytes(size, buffer_bytes));
  auto* base = static_cast<std::byte*>(segment_.data());
  buffers_ = base + round_up(kPage + static_cast<size_t>(size) * kSlotBytes, kPage);
  Header& h = header();
  if (create) {
    // The segment is fresh (zeroed): construct the atomics in place.
    new (&h) Header{};
    h.world_size = static_cast<uint32_t>(size);
    h.buffer_bytes = buffer_bytes;
    for (int q = 0; q < size; ++q) new (&slot(q)) Slot{};
    std::atomic_thread_fence(std::memory_order_release);
    h.magic = kHeaderMagic;
  } else {
    LOCKSTEP_CHECK(h.magic == kHeaderMagic && h.world_size == static_cast<uint32_t>(size) &&
                       h.buffer_bytes == buffer_bytes,
                   "shm segment {} was made for {} ranks and {}-byte buffers, not {} ranks and {}; "
                   "are two jobs using the same store and group name?",
                   segment_.name(), h.world_size, h.buffer_bytes, size, buffer_bytes);
  }
  slot(rank).identity = this_process();
}

void Comm::publish_view(const void* data, size_t bytes) {
  int32_t pool = -1;
  int64_t offset = 0;
  for (size_t i = 0; i < pools_.size() && pool < 0; ++i) {
    offset = pools_[i]->offset_of(data, bytes);
    if (offset >= 0) pool = static_cast<int32_t>(i);
  }
  // Relaxed: the barrier's arrival publishes them.
  slot(rank_).view_offset.store(offset, std::memory_order_relaxed);
  slot(rank_).view_pool.store(pool, std::memory_order_relaxed);
}

std::byte* Comm::peer_view(int q) const {
  const int32_t pool = slot(q).view_pool.load(std::memory_order_relaxed);
  if (pool < 0 || static_cast<size_t>(pool) >= pools_.size()) return nullptr;
  return pools_[static_cast<size_t>(pool)]->at(q, slot(q).view_offset.load(std::memory_order_relaxed));
}

void Comm::watch_peers() {
  peers_.clear();
  identities_.clear();
  for (int q = 0; q < size_; ++q) {
    identities_.push_back(slot(q).identity);
    peers_.emplace_back(q == rank_ ? ProcessIdentity{} : slot(q).identity);
  }
}

Comm::Header& Comm::header() const { return *static_cast<Header*>(segment_.data()); }

Comm::Slot& Comm::slot(int q) const {
  auto* base = static_cast<std::byte*>(segment_.data()) + kPage;
  return *reinterpret_cast<Slot*>(base + static_cast<size_t>(q) * kSlotBytes);
}

std::byte* Comm::buffer(int q, int half) const {
  return buffers_ + (static_cast<size_t>(q) * 2 + static_cast<size_t>(half)) * buffer_bytes_;
}

void Comm::begin_call(const Call& call) {
  call_ = &call;
  call_words_ = pack(call.signature);
  call_hash_ = call_hash(call.signature);
  check_pending_ = size_ > 1;
  stall_reported_ = false;
  call_start_ = Clock::now();
}

void Comm::end_call(bool completed) {
  if (completed && call_ != nullptr) store_signature(slot(rank_).done, call_words_);
  call_ = nullptr;
  check_pending_ = false;
}

void Comm::barrier(Clock::time_point deadline) {
  ++arrived_;
  Slot& mine = slot(rank_);
  const bool check = check_pending_;
  // Published by the arrival's seq_cst store below.
  if (check) {
    store_signature(mine.call[arrived_ & 1], call_words_);
    mine.call_hash[arrived_ & 1].store(call_hash_, std::memory_order_relaxed);
  }
  mine.last_active_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  mine.arrivals.store(arrived_, std::memory_order_seq_cst);
  const bool woke = mine.sleepers.load(std::memory_order_seq_cst) != 0;
  if (woke) futex_wake_all(mine.arrivals);
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) wait_for(q, arrived_, deadline, woke);
  }
  if (check) check_same_call();
}

void Comm::check_same_call() {
  check_pending_ = false;
  bool same = true;
  for (int q = 0; q < size_ && same; ++q) {
    same = q == rank_ || slot(q).call_hash[arrived_ & 1].load(std::memory_order_relaxed) == call_hash_;
  }
  if (same) return;
  std::vector<CallSignature> every_rank;
  for (int q = 0; q < size_; ++q) every_rank.push_back(load_signature(slot(q).call[arrived_ & 1]));
  const std::string message = mismatch_message(*call_, every_rank);
  abort(message);
  throw CollectiveMismatch(message);
}

std::string Comm::who_is_missing(uint32_t target) const {
  std::vector<std::string> missing;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || reached(slot(q).arrivals.load(std::memory_order_acquire), target)) continue;
    const CallSignature done = load_signature(slot(q).done);
    const std::string pid =
        identities_.size() == static_cast<size_t>(size_)
            ? fmt::format(" (pid {})", identities_[static_cast<size_t>(q)].pid)
            : std::string();
    const std::string name = rank_name(q);
    missing.push_back(done.seq == 0
                          ? fmt::format("{}{} did not join it and has completed no "
                                        "collective on this group",
                                        name, pid)
                          : fmt::format("{}{} did not join it; the last collective it "
                                        "completed was #{} {}",
                                        name, pid, done.seq, done.text()));
  }
  if (missing.empty()) return "every rank arrived just as the time ran out";
  std::string text = missing.front();
  for (size_t i = 1; i < missing.size(); ++i) text += "; " + missing[i];
  return text + " (a rank stopped, deadlocked, or still computing)";
}

void Comm::report_stall(uint32_t target) {
  if (stall_reported_ || call_ == nullptr) return;
  const auto waited = Clock::now() - call_start_;
  if (waited < call_->stall_report) return;
  stall_reported_ = true;
  const std::string where = fmt::format("rank {} of {}", call_->signature.rank, *call_->group);
  fmt::print(stderr, "{}\n", stall_message(*call_, where, waited, who_is_missing(target)));
  std::fflush(stderr);
}

void Comm::wait_for(int q, uint32_t target, Clock::time_point deadline, bool woke_peers) {
  Slot& s = slot(q);
  if (reached(s.arrivals.load(std::memory_order_acquire), target)) return;
  // Spin while rank q is busy with collectives (it arrived somewhere, or woke
  // up in a wait, within the last spin_) and a thread of this rank waits for
  // the result, never longer than kMaxSpin: the peer is then microseconds
  // away, and waking from a futex costs far more (tens of microseconds,
  // hundreds in a busy VM). A rank still computing has been silent longer,
  // and while nobody here waits this rank's own compute needs the core more:
  // then sleep at once. A rank this one has just woken is on its way too,
  // however long it slept: waiting for it asleep would make both ranks pay a
  // futex wake-up at every barrier from then on.
  const auto start = Clock::now();
  for (uint32_t i = 1;; ++i) {
    cpu_relax();
    if (reached(s.arrivals.load(std::memory_order_acquire), target)) return;
    if ((i & 63) != 0) continue;
    const auto now = Clock::now();
    if (now - start < kMinSpin) continue;
    const Clock::time_point last{Clock::duration(s.last_active_ns.load(std::memory_order_relaxed))};
    const bool urgent = waiters_ == nullptr || waiters_->load(std::memory_order_relaxed) > 0;
    if (!urgent || now - start >= kMaxSpin || (!woke_peers && now - last >= spin_)) break;
  }
  for (;;) {
    if (reached(s.arrivals.load(std::memory_order_acquire), target)) return;
    check_abort();
    const auto now = Clock::now();
    if (now >= deadline) throw DeadlineExceeded(who_is_missing(target));
    report_stall(target);
    const std::string gone = peer_gone(q, target);
    if (!gone.empty()) {
      // Both named as the caller knows them: a composite's member call
      // carries the composite's ranks.
      const std::string reason = fmt::format(
          "{} (pid {}) {} while rank {} waited for it in a collective", rank_name(q),
          s.identity.pid, gone, call_ != nullptr ? call_->signature.rank : rank_);
      abort(reason);
      throw Error(reason);
    }
    s.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = s.arrivals.load(std::memory_order_seq_cst);
    if (!reached(seen, target)) futex_wait(s.arrivals, seen, std::min<Clock::duration>(kSleepSlice, deadline - now));
    s.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(s.arrivals.load(std::memory_order_acquire), target)) {
      slot(rank_).last_active_ns.store(Clock::now().time_since_epoch().count(),
                                       std::memory_order_relaxed);
      return;
    }
  }
}

std::string Comm::rank_name(int q) const {
  return call_ != nullptr ? call_->rank_name(q) : fmt::format("rank {}", q);
}

// Its process exited, or it dropped its group some time ago: it will never
// arrive. A process usually drops its groups as it ends: for a while it
// counts as exiting, so that the launcher learns of its end (and its exit
// code) before the others fail because of it.
std::string Comm::peer_gone(int q, uint32_t target) const {
  if (peers_.size() == static_cast<size_t>(size_) && peers_[static_cast<size_t>(q)].exited())
    return "exited";
  // Its arrivals come before `left_ns`: one made before leaving is seen here.
  const Slot& s = slot(q);
  const int64_t left = s.left_ns.load(std::memory_order_acquire);
  if (left != 0 && !reached(s.arrivals.load(std::memory_order_acquire), target) &&
      Clock::now() - Clock::time_point(Clock::duration(left)) >= kLeftGroupGrace) {
    return "dropped its group";
  }
  return "";
}

void Comm::leave() {
  slot(rank_).left_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
  futex_wake_all(slot(rank_).arrivals);
}

void Comm::abort(const std::string& reason) {
  Header& h = header();
  uint32_t expected = 0;
  if (h.abort_word.load(std::memory_order_acquire) == 0) {
    // Write the reason before publishing the word; a racing aborter loses.
    static thread_local char scratch[sizeof h.abort_reason];
    std::snprintf(scratch, sizeof scratch, "%s", reason.c_str());
    if (h.abort_word.compare_exchange_strong(expected, kWriting)) {
      std::memcpy(h.abort_reason, scratch, sizeof scratch);
      h.abort_word.store(static_cast<uint32_t>(rank_) + 1, std::memory_order_release);
    }
  }
  for (int q = 0; q < size_; ++q) futex_wake_all(slot(q).arrivals);
}

std::string Comm::abort_reason() const {
  const uint32_t word = header().abort_word.load(std::memory_order_acquire);
  if (word == 0 || word == kWriting) return "";
  const Header& h = header();
  return std::string(h.abort_reason, strnlen(h.abort_reason, sizeof h.abort_reason));
}

void Comm::check_abort() const {
  const std::string reason = abort_reason();
  if (!reason.empty()) throw Error(fmt::format("the group was aborted: {}", reason));
}

}  // namespace lockstep::collectives::shm
