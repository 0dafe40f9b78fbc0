#include "lockstep/train/run_dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "lockstep/runtime/error.h"

namespace lockstep::train {

namespace {

constexpr const char* kLockFile = ".lockstep-run.lock";

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "an unknown host";
  return name;
}

// Who holds the lock, as it wrote itself into the file, else by the pid
// the kernel reports.
std::string holder(int fd, pid_t pid) {
  char text[512] = {};
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  std::string said(text, n > 0 ? static_cast<size_t>(n) : 0);
  while (!said.empty() && (said.back() == '\n' || said.back() == '\0')) said.pop_back();
  if (!said.empty()) return said;
  return pid > 0 ? fmt::format("process {}", pid) : std::string("another process");
}

// The lock files this process holds, each through one descriptor that every
// RunDirLock of it shares: closing any descriptor of a file drops the
// process's record locks on it, so a second one must never be opened and
// closed while the lock is held.
struct Held {
  int fd = -1;
  int users = 0;
  pid_t pid = 0;  // a child made by fork() has the table but not the locks
};
std::mutex held_mutex;
std::map<std::pair<dev_t, ino_t>, Held>& held_files() {
  static std::map<std::pair<dev_t, ino_t>, Held> files;
  return files;
}

}  // namespace

RunDirLock RunDirLock::acquire(const std::filesystem::path& dir) {
  const std::string path = (dir / kLockFile).string();
  const std::lock_guard<std::mutex> guard(held_mutex);
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    const auto it = held_files().find({st.st_dev, st.st_ino});
    if (it != held_files().end() && it->second.pid == getpid()) {
      ++it->second.users;
      return RunDirLock(it->second.fd);
    }
  }
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  // In a sticky shared directory, fs.protected_regular refuses O_CREAT of
  // another user's file even where its mode lets this user write it.
  if (fd < 0 && errno == EACCES) fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    // A lock left by another user's run, made under a umask that kept the
    // group from writing it: the directory itself may be writable.
    struct stat there {};
    LOCKSTEP_CHECK(!(error == EACCES && stat(path.c_str(), &there) == 0 &&
                     there.st_uid != geteuid()),
                   "cannot open the run lock {} (mode {:o}, owned by uid {}, group {}): {}; it "
                   "was made by another user's run; have that user let this one write it "
                   "(chmod g+w, with this user in its group) or remove it, and run with umask "
                   "002 in a directory shared by a group",
                   path, there.st_mode & 07777, there.st_uid, there.st_gid,
                   std::strerror(error));
    throw Error(fmt::format("cannot open the run lock {}: {}; pick a checkpoint directory this "
                            "user can write",
                            path, std::strerror(error)));
  }
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (fcntl(fd, F_SETLK, &lock) != 0) {
    const int error = errno;
    if (error == EACCES || error == EAGAIN) {
      struct flock who {};
      who.l_type = F_WRLCK;
      who.l_whence = SEEK_SET;
      const pid_t pid = fcntl(fd, F_GETLK, &who) == 0 ? who.l_pid : 0;
      const std::string by = holder(fd, pid);
      close(fd);
      throw Error(fmt::format(
          "checkpoint directory {} is in use by another run: {} holds its lock {}. Two runs "
          "writing one directory would interleave their checkpoints and delete each other's. "
          "Wait for that run to end (or stop it), or use another checkpoint directory",
          dir.string(), by, path));
    }
    close(fd);  // no locks on this file system: run unlocked
    return {};
  }
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char since[32] = {};
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", &utc);
  const std::string me = fmt::format("process {} on {} since {}", getpid(), host_name(), since);
  if (ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t n = pwrite(fd, me.data(), me.size(), 0);
  }
  if (fstat(fd, &st) == 0) held_files()[{st.st_dev, st.st_ino}] = {fd, 1, getpid()};
  return RunDirLock(fd);
}

void RunDirLock::release() noexcept {
  if (fd_ < 0) return;
  const std::lock_guard<std::mutex> guard(held_mutex);
  auto& files = held_files();
  for (auto it = files.begin(); it != files.end(); ++it) {
    if (it->second.fd != fd_) continue;
    if (--it->second.users > 0) {
      fd_ = -1;  // another RunDirLock of this process still holds it
      return;
    }
    files.erase(it);
    break;
  }
  close(fd_);  // closing drops the lock
  fd_ = -1;
}

RunDirLock& RunDirLock::operator=(RunDirLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() { release(); }

}  // namespace lockstep::train
