// GroupReaper: ends the ranks' process groups when the launcher dies without
// stopping them itself (SIGKILL, a crash).
//
// PR_SET_PDEATHSIG (spawn.h) reaches only a rank's own process: what a rank
// starts through a wrapper that does not exec (`sh -c 'train; true'`) would
// outlive the launcher. So the launcher forks a small reaper process first;
// the reaper reads a pipe on which the launcher registers each rank's process
// group. When that pipe reaches end of file, the launcher is gone, however it
// died; unless the launcher disarmed it first (a normal end, its ranks already
// stopped and reaped), the reaper SIGKILLs every registered group. Either way
// it then removes the directories registered with it (a SIGKILLed launcher
// cannot remove its scratch files in /dev/shm, which is memory), and exits.
//
// The reaper leads a process group of its own, so a terminal's Ctrl-C or a
// SIGKILL to the launcher's group does not take it along, and it holds none of
// the launcher's descriptors but the pipe (stdio goes to /dev/null), so whoever
// reads the launcher's output sees it end with the launcher. A registered
// group is spared only when its leader's pid now names a process started
// later: the pid was reused, so the group it led is empty and the new one is
// not ours.
#pragma once

#include <sys/types.h>

#include <string>

namespace lockstep::launcher {

class GroupReaper {
 public:
  // Forks the reaper. Call while the launcher has one thread (the child uses
  // the heap before it settles). Throws lockstep::Error when it cannot.
  static GroupReaper start();

  GroupReaper(GroupReaper&& other) noexcept;
  GroupReaper& operator=(GroupReaper&&) = delete;
  // Closes the pipe: without disarm(), the registered groups are killed.
  ~GroupReaper();

  // Registers the process group a rank leads (its pid), right after its fork.
  void watch(pid_t pgid);
  // Removes `dir` and what it holds once the launcher is gone, however it
  // ended. An absolute path shorter than 4000 bytes.
  void remove_at_exit(const std::string& dir);
  // The launcher ends normally: the reaper exits without killing anything.
  void disarm();

 private:
  explicit GroupReaper(int fd) : fd_(fd) {}
  int fd_ = -1;  // write end of the pipe
};

}  // namespace lockstep::launcher
