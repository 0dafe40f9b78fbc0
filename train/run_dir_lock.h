// One run at a time in a checkpoint directory. Two runs writing one
// directory (a job started twice, a --resume while the run is still going)
// would interleave their checkpoints, and each one's retention would delete
// the other's. So rank 0 of a run holds a lock on DIR/.lockstep-run.lock
// while the run lives, and a second run is refused at its start, naming the
// process that holds it.
//
// The lock is a POSIX record lock (fcntl F_SETLK): the kernel drops it when
// its process ends, however it ends (SIGKILL included), so a dead run never
// leaves a stale lock; it works on NFS through the lock manager. It belongs
// to the process, so one process may take it again (tests open one run
// directory many times); the process's holders share one descriptor, as
// closing any descriptor of the file would drop the lock for all of them,
// and the lock goes when the last of them does. A file system without locks
// runs unlocked.
#pragma once

#include <filesystem>

namespace lockstep::train {

class RunDirLock {
 public:
  RunDirLock() = default;  // holds nothing
  // Takes the lock of `dir` (which exists) for this process, or throws
  // naming the process that holds it and the ways out.
  static RunDirLock acquire(const std::filesystem::path& dir);

  RunDirLock(RunDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&& other) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();

  bool held() const { return fd_ >= 0; }

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  void release() noexcept;
  int fd_ = -1;
};

}  // namespace lockstep::train
