// Telling whether another process of this node is still alive, robust to pid
// reuse: its start time pins the pid to one process, and a pidfd (Linux
// >= 5.3) reports its exit even while it is an unreaped zombie.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace lockstep::collectives::shm {

// Who a process is: enough for another process of the node to watch it.
struct ProcessIdentity {
  int64_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid
};

ProcessIdentity this_process();
// nullopt when no process `pid` exists (as this process sees pids).
std::optional<uint64_t> process_start_time(int64_t pid);

// Watches one process. A process in another pid namespace (a container
// sharing /dev/shm) cannot be watched: exited() stays false there, and the
// group's timeout is what ends a wait on it.
class ProcessWatch {
 public:
  ProcessWatch() = default;
  explicit ProcessWatch(const ProcessIdentity& who);
  ProcessWatch(ProcessWatch&& other) noexcept;
  ProcessWatch& operator=(ProcessWatch&& other) noexcept;
  ~ProcessWatch();

  bool exited() const;

 private:
  ProcessIdentity who_;
  bool watchable_ = false;
  int pidfd_ = -1;  // -1: no pidfd; fall back to the pid and start time
};

}  // namespace lockstep::collectives::shm
