// The flight recorder: this process's last collectives, readable by another
// process even after this one stopped, hung or died.
//
// Every collective a ProcessGroup issues is recorded when it is issued and
// again when it ends (collectives/process_group.cpp, work.cpp): its group
// (name, size, and this rank's rank in it), op, number in the group's
// sequence, dtype, element count, root, and when it started and ended. The
// last kFlightRecorderEntries stay. Under lockstep-run
// (LOCKSTEP_FLIGHT_RECORDER names a file) the entries live in that file,
// mapped shared, so the launcher reads them after a failure or a hang
// without the rank's help and prints one post-mortem (launcher/postmortem.h);
// otherwise they live in this process's memory, and LOCKSTEP_POSTMORTEM_DIR
// has the first failed collective write them out (rank_postmortem.h).
//
// Recording costs two clock reads, an uncontended lock and a few stores per
// collective (and a hash of a group name over 31 bytes). A reader never
// blocks a writer: each entry carries a version that is odd while it is
// written, and a reader copies an entry until it reads the same even version
// before and after (a seqlock), pausing between tries for 5 ms at most. The
// newest call's entry still odd after that (its writer was stopped or died
// mid-write) is read as a torn record.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::distributed {

inline constexpr int kFlightRecorderEntries = 256;

struct FlightRecord {
  // torn: the newest call's entry was being written and stayed so; only its
  // ordinal is known, the call before it is not the last.
  enum class State { running, finished, failed, torn };

  uint64_t ordinal = 0;  // 1, 2, ...: this process's order of issue, over all its groups
  // "default"; a name over 31 bytes as its first 22 at most, "~" and 8 hex
  // digits of a hash of the whole: "data_parallel_replicas~9e095867".
  std::string group;
  int32_t group_size = 0;   // its ranks; 0: not known
  int32_t group_rank = -1;  // this process's rank in it; -1: not known
  std::string op;        // "allreduce", "broadcast", ..., "send", "recv"
  uint64_t seq = 0;      // the call's number in its group; 0 for send and recv
  std::string dtype;     // "f32"; empty for a barrier
  int64_t count = 0;     // elements
  int32_t root = -1;     // broadcast and reduce; else -1 (send/recv: the peer)
  int64_t start_ns = 0;  // CLOCK_MONOTONIC: comparable across the processes of one host
  int64_t end_ns = 0;    // 0 while running
  State state = State::running;
};

std::string_view to_string(FlightRecord::State state);

// What one call looks like when it is recorded.
struct FlightCall {
  std::string_view group, op, dtype;
  int32_t group_size = 0, group_rank = -1;
  uint64_t seq = 0;
  int64_t count = 0;
  int32_t root = -1;
};

// CLOCK_MONOTONIC in nanoseconds, the recorder's clock.
int64_t monotonic_ns();

class FlightRecorder {
 public:
  // The process's recorder: in the file LOCKSTEP_FLIGHT_RECORDER names
  // (created, or emptied), else in memory. A file that cannot be made is
  // said once on standard error and the recorder lives in memory: a
  // diagnostic never stops a training run.
  static FlightRecorder& instance();

  // Records a call as issued now; returns its ordinal for ended().
  uint64_t started(const FlightCall& call);
  // Marks ordinal's call ended now (ok or failed), unless newer calls have
  // taken its entry since.
  void ended(uint64_t ordinal, bool ok);

  // The entries still held, oldest first.
  std::vector<FlightRecord> snapshot() const;
  // Whether the entries live in the file LOCKSTEP_FLIGHT_RECORDER named, which
  // lockstep-run reads itself.
  bool in_launcher_file() const { return in_launcher_file_; }

  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  struct Layout;  // the shared memory's layout (flight_recorder.cpp)

 private:
  explicit FlightRecorder(const std::optional<std::string>& path);
  void start_afresh_in_memory();  // in a forked child

  Layout* layout_ = nullptr;
  std::mutex writers_;  // one writer at a time; readers take no lock
  size_t mapped_bytes_ = 0;
  bool in_launcher_file_ = false;
};

// Reads the recorder file of another process (the launcher's side). nullopt
// when the file is absent (the process never issued a collective); throws
// when it is not a recorder file.
std::optional<std::vector<FlightRecord>> read_flight_recorder_file(const std::string& path);

}  // namespace lockstep::distributed
