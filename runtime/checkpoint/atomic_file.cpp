#include "lockstep/runtime/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "lockstep/runtime/checkpoint/file_io.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/liveness.h"

namespace lockstep::runtime {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempMarker = ".tmp-";

// The pid in ".<name>.tmp-<pid>-<n>", or 0 when the name is not one of ours.
pid_t temp_file_pid(std::string_view name) {
  if (name.empty() || name[0] != '.') return 0;
  const size_t at = name.rfind(kTempMarker);
  if (at == std::string_view::npos || at < 2) return 0;
  const char* begin = name.data() + at + kTempMarker.size();
  const char* end = name.data() + name.size();
  pid_t pid = 0;
  auto [p, ec] = std::from_chars(begin, end, pid);
  if (ec != std::errc() || pid <= 0 || p == end || *p != '-') return 0;
  unsigned seq = 0;
  auto [q, ec2] = std::from_chars(p + 1, end, seq);
  return ec2 == std::errc() && q == end ? pid : 0;
}

// A writer that can write no more: no such process, or one that has exited
// and waits only to be reaped (state Z or X in /proc/<pid>/stat). A process
// we may not signal (EPERM) still runs.
bool writer_is_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;  // no /proc: trust kill()
  // "<pid> (<command, may hold spaces and parentheses>) <state> ..."
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

// The next temporary name for `file_name` in `dir`; the sequence number keeps two
// threads of one process apart.
void check_names_a_file(const fs::path& path) {
  std::error_code ec;
  if (!path.has_filename() || fs::is_directory(path, ec)) {
    throw Error(fmt::format("cannot write the file {}: it names a directory; give the path of "
                            "a file (in it, or elsewhere)",
                            path.string()));
  }
}

std::string temp_name_for(const fs::path& dir, const std::string& file_name) {
  static std::atomic<unsigned> sequence{0};
  return (dir / fmt::format(".{}{}{}-{}", file_name, kTempMarker, ::getpid(), sequence++)).string();
}

// The temporary files this process is writing, by device and inode. A file
// that carries this process's pid but is not among them was left by an
// earlier process that had the same pid (a restarted container numbers its
// processes alike) and is stale. The mutex is held from a file's creation to
// its registration, and while remove_stale_temp_files judges one of ours, so
// no file is judged before it is registered.
struct InFlight {
  std::mutex mutex;
  std::set<std::pair<dev_t, ino_t>> files;
};
InFlight& in_flight() {
  static InFlight registry;
  return registry;
}

std::optional<std::pair<dev_t, ino_t>> file_id(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return std::pair{st.st_dev, st.st_ino};
}

// A writer holds an open-file-description lock on its temporary file until
// the file is renamed into place. A process that cannot see the writer's pid
// (another node on a shared file system, another container's pid namespace:
// an evaluation sidecar) sees the lock, which the kernel drops however the
// writer ends. A file system without locks goes without.
void lock_as_writing(int fd) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  (void)::fcntl(fd, F_OFD_SETLK, &lock);
}

// Whether a writer holds `path`'s lock (lock_as_writing).
bool writer_holds_lock(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return false;
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  return ::fcntl(fd.get(), F_OFD_GETLK, &lock) == 0 && lock.l_type != F_UNLCK;
}

// Creates `temp` (O_EXCL), locked as being written, and registers it as in
// flight; -1 with errno on failure.
int create_in_flight(const std::string& temp, std::optional<std::pair<dev_t, ino_t>>& id) {
  const std::lock_guard<std::mutex> guard(in_flight().mutex);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return fd;
  lock_as_writing(fd);
  id = file_id(fd);
  if (id) in_flight().files.insert(*id);
  return fd;
}

void forget_in_flight(const std::optional<std::pair<dev_t, ino_t>>& id) {
  if (!id) return;
  const std::lock_guard<std::mutex> guard(in_flight().mutex);
  in_flight().files.erase(*id);
}

// remove_stale_temp_files, of the temporary files of `file_name` only when
// it is not empty.
std::vector<fs::path> remove_stale(const fs::path& dir, const std::string& file_name) {
  const std::string own = file_name.empty() ? "" : fmt::format(".{}{}", file_name, kTempMarker);
  std::vector<fs::path> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const pid_t pid = temp_file_pid(name);
    if (pid == 0 || !name.starts_with(own)) continue;
    if (pid == ::getpid()) {
      // Ours only if this process is writing it; else an earlier process's,
      // or a live writer's in another pid namespace with the same pid (each
      // container's program is pid 1), which holds its lock.
      const std::lock_guard<std::mutex> guard(in_flight().mutex);
      struct stat st {};
      if (::lstat(entry.path().c_str(), &st) != 0 ||
          in_flight().files.count({st.st_dev, st.st_ino}) || writer_holds_lock(entry.path()))
        continue;
      if (fs::remove(entry.path(), ec)) removed.push_back(entry.path());
      continue;
    }
    if (!writer_is_gone(pid) || writer_holds_lock(entry.path())) continue;
    if (fs::remove(entry.path(), ec)) removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace

bool is_temp_file_name(std::string_view name) { return temp_file_pid(name) != 0; }

void fsync_directory(const fs::path& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw_errno("cannot open directory", dir.string());
  fsync_or_throw(fd.get(), dir.string());
}

void write_file_atomically(const fs::path& path,
                           const std::function<void(int fd, const std::string& temp_path)>& fill) {
  // Writing and syncing many GB may use little CPU: not a hang.
  const BusyScope writing;
  check_names_a_file(path);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  // A writer killed mid-write (a rank stopped because another failed) left a
  // partial copy, as large as the file: each such kill would leave another.
  remove_stale(dir, path.filename().string());
  const std::string temp = temp_name_for(dir, path.filename().string());
  std::optional<std::pair<dev_t, ino_t>> id;
  UniqueFd fd(create_in_flight(temp, id));
  if (!fd) throw_errno("cannot create temporary checkpoint file", temp);
  // Keeps the file's description, and so its lock, open until the rename:
  // `fd` is closed before it, to report a failed close.
  const UniqueFd locked(::dup(fd.get()));
  try {
    fill(fd.get(), temp);
    fsync_or_throw(fd.get(), temp);
    fd.close(temp);
    if (::rename(temp.c_str(), path.c_str()) != 0)
      throw_errno(fmt::format("cannot rename {} to", temp), path.string());
  } catch (...) {
    fd.reset();
    ::unlink(temp.c_str());
    forget_in_flight(id);
    throw;
  }
  forget_in_flight(id);
  fsync_directory(dir);
}

std::vector<fs::path> remove_stale_temp_files(const fs::path& dir) {
  return remove_stale(dir, "");
}

void check_can_create_files(const fs::path& dir) {
  const std::string probe = temp_name_for(dir, "write-check");
  std::optional<std::pair<dev_t, ino_t>> id;
  UniqueFd fd(create_in_flight(probe, id));
  if (!fd) throw_errno("cannot create files in", dir.string());
  fd.reset();
  ::unlink(probe.c_str());
  forget_in_flight(id);
}

void check_can_write_file(const fs::path& path) {
  check_names_a_file(path);
  check_can_create_files(path.has_parent_path() ? path.parent_path() : fs::path("."));
}

}  // namespace lockstep::runtime
