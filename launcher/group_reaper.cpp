#include "launcher/group_reaper.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "launcher/process_identity.h"
#include "lockstep/runtime/error.h"

namespace lockstep::launcher {
namespace {

// One message on the pipe. A RemoveDir record is followed by `length` bytes
// of the path in the same write; all of it is smaller than PIPE_BUF, so it
// is written and read whole.
struct Record {
  enum Kind : int32_t { Watch = 1, Disarm = 2, RemoveDir = 3 };
  int32_t kind = 0;
  int32_t pgid = 0;         // Watch; the path's length for RemoveDir
  uint64_t start_time = 0;  // of the group's leader, in clock ticks since boot
};
constexpr size_t kMaxPath = 4000;

// Reads exactly `size` bytes; false at end of file or on an error.
bool read_whole(int fd, void* data, size_t size) {
  auto* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, at, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void reaper_main(int read_fd) {
  setpgid(0, 0);
  prctl(PR_SET_NAME, "lockstep-reaper");
  const int devnull = open("/dev/null", O_RDWR);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) dup2(devnull, fd);
  dup2(read_fd, 3);
  close_range(4, ~0U, 0);  // the pipe's write end too, or its end of file never comes

  std::vector<Record> groups;
  std::vector<std::string> dirs;
  bool disarmed = false;
  Record record;
  // Until end of file: the launcher is gone.
  while (read_whole(3, &record, sizeof record)) {
    if (record.kind == Record::Watch) groups.push_back(record);
    if (record.kind == Record::Disarm) disarmed = true;
    if (record.kind == Record::RemoveDir) {
      std::string path(static_cast<size_t>(record.pgid), '\0');
      if (record.pgid < 0 || static_cast<size_t>(record.pgid) > kMaxPath ||
          !read_whole(3, path.data(), path.size()))
        break;
      dirs.push_back(std::move(path));
    }
  }
  if (!disarmed) {
    for (const Record& group : groups) {
      const auto now = process_start_time(group.pgid);
      if (!now || *now == group.start_time) kill(-group.pgid, SIGKILL);
    }
  }
  // After the kills: a rank that still had a file open writes to an
  // unlinked one, and cannot make new ones.
  for (const std::string& dir : dirs) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  _exit(0);
}

void send(int fd, const Record& record, const std::string& tail = {}) {
  std::string message(reinterpret_cast<const char*>(&record), sizeof record);
  message += tail;
  ssize_t n;
  do {
    n = write(fd, message.data(), message.size());
  } while (n < 0 && errno == EINTR);
  // A reaper that is gone (EPIPE) cannot be helped; the ranks still die with
  // the launcher by PR_SET_PDEATHSIG.
}

}  // namespace

GroupReaper GroupReaper::start() {
  int fds[2];
  LOCKSTEP_CHECK(pipe2(fds, O_CLOEXEC) == 0, "cannot create the pipe to the rank reaper: {}",
                 std::strerror(errno));
  const pid_t pid = fork();
  if (pid == 0) reaper_main(fds[0]);
  const int error = errno;
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    throw Error(fmt::format("cannot fork the rank reaper process: {}", std::strerror(error)));
  }
  return GroupReaper(fds[1]);
}

GroupReaper::GroupReaper(GroupReaper&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

GroupReaper::~GroupReaper() {
  if (fd_ >= 0) close(fd_);
}

void GroupReaper::watch(pid_t pgid) {
  // The rank is our unreaped child, so its start time is its own, not a
  // reused pid's.
  send(fd_, {.kind = Record::Watch,
             .pgid = static_cast<int32_t>(pgid),
             .start_time = process_start_time(pgid).value_or(0)});
}

void GroupReaper::remove_at_exit(const std::string& dir) {
  LOCKSTEP_CHECK(!dir.empty() && dir.front() == '/' && dir.size() <= kMaxPath,
                 "GroupReaper: '{}' is not an absolute path shorter than {} bytes", dir,
                 kMaxPath);
  send(fd_, {.kind = Record::RemoveDir, .pgid = static_cast<int32_t>(dir.size())}, dir);
}

void GroupReaper::disarm() { send(fd_, {.kind = Record::Disarm}); }

}  // namespace lockstep::launcher
