// This node's flight-record files: one per rank in a private directory (in
// /dev/shm where there is one: the ranks write it at every collective),
// removed with this object, and by GroupReaper when the launcher is killed.
//
// A launcher killed together with its reaper (a cgroup's SIGKILL, `pkill
// -KILL -P`) cannot remove its directory, and /dev/shm is memory. So the
// directory names its launcher in a file `owner` (pid, start time, pid
// namespace and boot), and each new launcher removes the directories of this
// user whose launcher is gone. A directory is left alone when its owner
// cannot be told (no or an unreadable `owner`, another pid namespace or
// boot): a pid there means nothing here.
//
// The directory goes in /dev/shm, else in TMPDIR, else in /tmp. Where none is
// writable (a read-only root file system) the job runs without the files:
// each rank records its calls in its own memory only, and a failure's report
// has no calls of this node's ranks to show (it says why).
#pragma once

#include <string>

namespace lockstep::launcher {

class FlightRecorderFiles {
 public:
  // Makes the directory and removes stale ones beside it. Where it cannot be
  // made, dir() is empty and unavailable() says why.
  FlightRecorderFiles();
  ~FlightRecorderFiles();
  FlightRecorderFiles(const FlightRecorderFiles&) = delete;
  FlightRecorderFiles& operator=(const FlightRecorderFiles&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& unavailable() const { return unavailable_; }
  // Empty where there is no directory: the rank then gets no file.
  std::string path(int rank) const;
  // Removes every rank's file: an attempt must not report its predecessor's.
  void clear() const;

 private:
  std::string dir_;
  std::string unavailable_;
};

}  // namespace lockstep::launcher
