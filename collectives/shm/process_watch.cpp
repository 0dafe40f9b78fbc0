#include "lockstep/collectives/shm/process_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <utility>

#include <fmt/format.h>

namespace lockstep::collectives::shm {

std::optional<uint64_t> process_start_time(int64_t pid) {
  // Plain read(): the file vanishes with the process, and a read that fails
  // with ESRCH must mean "gone", not throw (as std::ifstream's does).
  const int fd = ::open(fmt::format("/proc/{}/stat", pid).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buffer[1024];
  const ssize_t got = ::read(fd, buffer, sizeof buffer - 1);
  ::close(fd);
  if (got <= 0) return std::nullopt;
  const std::string text(buffer, static_cast<size_t>(got));
  const auto close = text.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos || close + 2 > text.size()) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));  // field 3 onwards
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  try {
    return std::stoull(field);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

ProcessIdentity this_process() {
  ProcessIdentity me;
  me.pid = ::getpid();
  me.start_time = process_start_time(me.pid).value_or(0);
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) == 0) me.pid_namespace = ns.st_ino;
  return me;
}

ProcessWatch::ProcessWatch(const ProcessIdentity& who) : who_(who) {
  const ProcessIdentity me = this_process();
  // Same process (ranks as threads) or another pid namespace: nothing to watch.
  watchable_ = who.pid > 0 && who.pid != me.pid && who.pid_namespace == me.pid_namespace;
  if (!watchable_) return;
#ifdef SYS_pidfd_open
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(who.pid), 0));
#endif
}

ProcessWatch::ProcessWatch(ProcessWatch&& other) noexcept { *this = std::move(other); }

ProcessWatch& ProcessWatch::operator=(ProcessWatch&& other) noexcept {
  if (this != &other) {
    if (pidfd_ >= 0) ::close(pidfd_);
    who_ = other.who_;
    watchable_ = std::exchange(other.watchable_, false);
    pidfd_ = std::exchange(other.pidfd_, -1);
  }
  return *this;
}

ProcessWatch::~ProcessWatch() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

bool ProcessWatch::exited() const {
  if (!watchable_) return false;
  // The pid must still name the process that was watched (not a reused pid).
  const auto start = process_start_time(who_.pid);
  if (!start || *start != who_.start_time) return true;
  if (pidfd_ < 0) return ::kill(static_cast<pid_t>(who_.pid), 0) != 0 && errno == ESRCH;
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;  // readable once the process has exited
}

}  // namespace lockstep::collectives::shm
