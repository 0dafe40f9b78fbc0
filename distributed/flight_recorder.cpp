#include "lockstep/distributed/flight_recorder.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "lockstep/distributed/rank_postmortem.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/stable_hash.h"

namespace lockstep::distributed {
namespace {

constexpr uint64_t kMagic = 0x3130'4452'4346'4b4cULL;  // "LKFCRD01"
constexpr uint32_t kLayoutVersion = 2;

using Word = std::atomic<uint64_t>;
static_assert(Word::is_always_lock_free, "the recorder's words are read by another process");

// A short string in words another process may read while this one writes.
template <size_t N>
struct Text {
  std::array<Word, N> words{};

  void store(std::string_view s) {
    char bytes[N * 8] = {};
    size_t kept = std::min(s.size(), N * 8 - 1);
    // Cut before a UTF-8 character, not inside one: a name cut inside one is
    // not UTF-8, and the post-mortem's JSON could not hold it.
    if (kept < s.size()) {
      while (kept > 0 && (static_cast<unsigned char>(s[kept]) & 0xC0) == 0x80) --kept;
    }
    // An empty view may have no data at all (a barrier's dtype).
    if (kept > 0) std::memcpy(bytes, s.data(), kept);
    for (size_t i = 0; i < N; ++i) {
      uint64_t w;
      std::memcpy(&w, bytes + 8 * i, 8);
      words[i].store(w, std::memory_order_relaxed);
    }
  }
  std::string load() const {
    char bytes[N * 8];
    for (size_t i = 0; i < N; ++i) {
      const uint64_t w = words[i].load(std::memory_order_relaxed);
      std::memcpy(bytes + 8 * i, &w, 8);
    }
    return std::string(bytes, strnlen(bytes, N * 8));
  }
};

// A group's name as recorded: a name longer than its entry holds keeps a
// readable start and a hash of the whole, so that groups whose names share
// the start stay apart in a post-mortem. Only a long name pays for the hash.
constexpr size_t kGroupBytes = 31;
std::string_view recorded_group(std::string_view name, std::array<char, kGroupBytes>& buffer) {
  if (name.size() <= kGroupBytes) return name;
  constexpr size_t kHashBytes = 9;  // "~" and 8 hex digits
  size_t kept = kGroupBytes - kHashBytes;
  // Cut before a UTF-8 character, not inside one (see Text::store).
  while (kept > 0 && (static_cast<unsigned char>(name[kept]) & 0xC0) == 0x80) --kept;
  const uint64_t h = runtime::hash_bytes(name.data(), name.size());  // mixes every byte
  const auto end = fmt::format_to_n(buffer.data(), buffer.size(), "{}~{:08x}",
                                    name.substr(0, kept), static_cast<uint32_t>(h ^ (h >> 32)));
  return {buffer.data(), static_cast<size_t>(end.out - buffer.data())};
}

struct Slot {
  Word version{0};  // odd while being written
  Word ordinal{0};
  Word seq{0};
  Word count{0};
  Word root{0};
  Word start_ns{0};
  Word end_ns{0};
  Word state{0};
  Word group_place{0};  // group size << 32 | this rank's rank in it
  Text<(kGroupBytes + 1) / 8> group;
  Text<2> op;
  Text<1> dtype;
};

uint64_t as_word(int64_t v) { return static_cast<uint64_t>(v); }
int64_t as_int(uint64_t w) { return static_cast<int64_t>(w); }

uint64_t group_place(int32_t size, int32_t rank) {
  return uint64_t{static_cast<uint32_t>(size)} << 32 | static_cast<uint32_t>(rank);
}

// A seqlock's writer side; the caller holds the recorder's mutex.
template <class Write>
void write_slot(Slot& slot, Write&& write) {
  const uint64_t v = slot.version.load(std::memory_order_relaxed);
  slot.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  write();
  slot.version.store(v + 2, std::memory_order_release);
}

// How long a reader waits, in all, for entries being written. A writer keeps
// an entry odd for well under a microsecond unless it is preempted, stopped
// or killed mid-write; a report must not wait long for one that never ends.
constexpr auto kTornWait = std::chrono::milliseconds(5);
constexpr auto kTornPause = std::chrono::microseconds(50);

// The reader side: a consistent copy, or nullopt when the entry is empty or
// was still being written at `deadline` (by a process that may have died
// mid-write). Spins first, then pauses between tries, so that a writer
// preempted mid-write gets the processor to finish.
std::optional<FlightRecord> read_slot(const Slot& slot,
                                      std::chrono::steady_clock::time_point deadline) {
  for (int attempt = 0;; ++attempt) {
    if (attempt >= 100) {
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(kTornPause);
    }
    const uint64_t v1 = slot.version.load(std::memory_order_acquire);
    if (v1 & 1) continue;
    FlightRecord r;
    r.ordinal = slot.ordinal.load(std::memory_order_relaxed);
    r.seq = slot.seq.load(std::memory_order_relaxed);
    r.count = as_int(slot.count.load(std::memory_order_relaxed));
    r.root = static_cast<int32_t>(as_int(slot.root.load(std::memory_order_relaxed)));
    r.start_ns = as_int(slot.start_ns.load(std::memory_order_relaxed));
    r.end_ns = as_int(slot.end_ns.load(std::memory_order_relaxed));
    const uint64_t state = slot.state.load(std::memory_order_relaxed);
    const uint64_t place = slot.group_place.load(std::memory_order_relaxed);
    r.group_size = static_cast<int32_t>(static_cast<uint32_t>(place >> 32));
    r.group_rank = static_cast<int32_t>(static_cast<uint32_t>(place));
    r.group = slot.group.load();
    r.op = slot.op.load();
    r.dtype = slot.dtype.load();
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.version.load(std::memory_order_relaxed) != v1) continue;
    if (r.ordinal == 0 || state > 2) return std::nullopt;
    r.state = static_cast<FlightRecord::State>(state);
    return r;
  }
}

}  // namespace

struct FlightRecorder::Layout {
  Word magic{0};  // set last: a reader that sees it sees an initialised layout
  uint64_t layout_version = kLayoutVersion;
  uint64_t capacity = kFlightRecorderEntries;
  Word issued{0};
  Slot slots[kFlightRecorderEntries];
};

namespace {

std::vector<FlightRecord> read_layout(const FlightRecorder::Layout& layout) {
  // Read before the entries: a call issued while they are read is newer.
  const uint64_t issued = layout.issued.load(std::memory_order_acquire);
  const auto deadline = std::chrono::steady_clock::now() + kTornWait;
  std::vector<FlightRecord> records;
  for (const Slot& slot : layout.slots) {
    if (auto r = read_slot(slot, deadline)) records.push_back(std::move(*r));
  }
  std::sort(records.begin(), records.end(),
            [](const FlightRecord& a, const FlightRecord& b) { return a.ordinal < b.ordinal; });
  // The newest call's entry never became readable: its writer stopped or
  // died mid-write. Said, or the call before it would pass for the last.
  const uint64_t newest = records.empty() ? 0 : records.back().ordinal;
  if (issued > newest) {
    records.push_back(FlightRecord{.ordinal = issued, .state = FlightRecord::State::torn});
  }
  return records;
}

}  // namespace

std::string_view to_string(FlightRecord::State state) {
  switch (state) {
    case FlightRecord::State::running: return "running";
    case FlightRecord::State::finished: return "finished";
    case FlightRecord::State::failed: return "failed";
    case FlightRecord::State::torn: return "torn";
  }
  return "?";
}

int64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

namespace {
FlightRecorder* the_recorder = nullptr;
}

FlightRecorder& FlightRecorder::instance() {
  // Never destroyed: collectives may end on other threads during exit.
  static FlightRecorder* recorder = [] {
    auto* r = new FlightRecorder(runtime::process_env()("LOCKSTEP_FLIGHT_RECORDER"));
    // The file is this process's: a program it starts is not this rank.
    ::unsetenv("LOCKSTEP_FLIGHT_RECORDER");
    the_recorder = r;
    // A forked child (lockstep::spawn's ranks) records in memory of its own,
    // not in this process's file, with a lock no parent thread holds.
    ::pthread_atfork(nullptr, nullptr, [] { the_recorder->start_afresh_in_memory(); });
    return r;
  }();
  return *recorder;
}

void FlightRecorder::start_afresh_in_memory() {
  void* memory = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return;  // keeps the parent's: only its post-mortem suffers
  ::munmap(layout_, mapped_bytes_);
  in_launcher_file_ = false;
  layout_ = new (memory) Layout();
  layout_->magic.store(kMagic, std::memory_order_release);
  new (&writers_) std::mutex();
}

FlightRecorder::FlightRecorder(const std::optional<std::string>& path) {
  mapped_bytes_ = sizeof(Layout);
  void* memory = nullptr;
  if (path && !path->empty()) {
    const int fd = ::open(path->c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int error = fd < 0 ? errno : 0;
    // The pages reserved, not only the size set: with /dev/shm (or TMPDIR)
    // full, that fails here and the rank records in memory, where a sparse
    // file would kill it with SIGBUS at the first write below.
    if (error == 0) error = ::posix_fallocate(fd, 0, static_cast<off_t>(mapped_bytes_));
    if (error == 0) {
      memory = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (memory == MAP_FAILED) {
        error = errno;
        memory = nullptr;
      }
    }
    in_launcher_file_ = memory != nullptr;
    if (fd >= 0) ::close(fd);
    if (memory == nullptr) {
      fmt::print(stderr,
                 "lockstep: the flight recorder file {} (LOCKSTEP_FLIGHT_RECORDER) could not be "
                 "made ({}); this rank's collectives are recorded in memory only, so a "
                 "post-mortem will not show them\n",
                 *path, std::strerror(error));
    }
  }
  if (memory == nullptr) {
    memory = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                    -1, 0);
    LOCKSTEP_CHECK(memory != MAP_FAILED, "flight recorder: mmap of {} bytes failed: {}",
                   mapped_bytes_, std::strerror(errno));
  }
  layout_ = new (memory) Layout();
  layout_->magic.store(kMagic, std::memory_order_release);
}

FlightRecorder::~FlightRecorder() { ::munmap(layout_, mapped_bytes_); }

uint64_t FlightRecorder::started(const FlightCall& call) {
  watch_for_postmortems();  // one atomic load after the first call
  const int64_t now = monotonic_ns();
  std::array<char, kGroupBytes> name_buffer;
  const std::string_view group = recorded_group(call.group, name_buffer);
  std::lock_guard lock(writers_);
  const uint64_t ordinal = layout_->issued.load(std::memory_order_relaxed) + 1;
  layout_->issued.store(ordinal, std::memory_order_relaxed);
  Slot& slot = layout_->slots[(ordinal - 1) % kFlightRecorderEntries];
  write_slot(slot, [&] {
    slot.ordinal.store(ordinal, std::memory_order_relaxed);
    slot.seq.store(call.seq, std::memory_order_relaxed);
    slot.count.store(as_word(call.count), std::memory_order_relaxed);
    slot.root.store(as_word(call.root), std::memory_order_relaxed);
    slot.start_ns.store(as_word(now), std::memory_order_relaxed);
    slot.end_ns.store(0, std::memory_order_relaxed);
    slot.state.store(static_cast<uint64_t>(FlightRecord::State::running),
                     std::memory_order_relaxed);
    slot.group_place.store(group_place(call.group_size, call.group_rank),
                           std::memory_order_relaxed);
    slot.group.store(group);
    slot.op.store(call.op);
    slot.dtype.store(call.dtype);
  });
  return ordinal;
}

void FlightRecorder::ended(uint64_t ordinal, bool ok) {
  if (ordinal == 0) return;
  const int64_t now = monotonic_ns();
  {
    std::lock_guard lock(writers_);
    Slot& slot = layout_->slots[(ordinal - 1) % kFlightRecorderEntries];
    if (slot.ordinal.load(std::memory_order_relaxed) != ordinal) return;  // overwritten since
    write_slot(slot, [&] {
      slot.end_ns.store(as_word(now), std::memory_order_relaxed);
      const auto state = ok ? FlightRecord::State::finished : FlightRecord::State::failed;
      slot.state.store(static_cast<uint64_t>(state), std::memory_order_relaxed);
    });
  }
  if (!ok) on_collective_failed(ordinal);
}

std::vector<FlightRecord> FlightRecorder::snapshot() const { return read_layout(*layout_); }

std::optional<std::vector<FlightRecord>> read_flight_recorder_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    LOCKSTEP_CHECK(errno == ENOENT, "cannot open the flight recorder file {}: {}", path,
                   std::strerror(errno));
    return std::nullopt;
  }
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0 && st.st_size == static_cast<off_t>(sizeof(FlightRecorder::Layout));
  void* memory = sized ? ::mmap(nullptr, sizeof(FlightRecorder::Layout), PROT_READ, MAP_SHARED, fd, 0)
                       : MAP_FAILED;
  ::close(fd);
  if (!sized && st.st_size == 0) return std::vector<FlightRecord>{};  // created, not yet laid out
  LOCKSTEP_CHECK(memory != MAP_FAILED,
                 "{} is not a flight recorder file of this lockstep ({} bytes, expected {})", path,
                 static_cast<int64_t>(st.st_size), sizeof(FlightRecorder::Layout));
  const auto& layout = *static_cast<const FlightRecorder::Layout*>(memory);
  std::vector<FlightRecord> records;
  const uint64_t magic = layout.magic.load(std::memory_order_acquire);
  if (magic == kMagic && layout.layout_version == kLayoutVersion &&
      layout.capacity == kFlightRecorderEntries) {
    records = read_layout(layout);
  }
  ::munmap(memory, sizeof(FlightRecorder::Layout));
  return records;
}

}  // namespace lockstep::distributed
