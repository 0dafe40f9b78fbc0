#include "lockstep/collectives/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/shm/process_watch.h"
#include "lockstep/runtime/error.h"

namespace lockstep::collectives::shm {
namespace {

// The first page of every segment: who made it. The caller's bytes follow.
struct Stamp {
  char magic[8];
  int64_t creator_pid;
  uint64_t creator_start;  // /proc/<pid>/stat start time, to tell a reused pid
};
constexpr char kMagic[8] = {'l', 'o', 'c', 'k', 's', 't', 'e', 'p'};
constexpr size_t kStampBytes = 4096;
// An unstamped file may be one a live process is creating right now; only
// one this old is taken for a crash leftover.
constexpr time_t kUnstampedGraceSeconds = 60;

std::string errno_text() { return std::strerror(errno); }

// What /dev/shm is here, for a message about a segment it could not take:
// its size and free space (Docker gives 64 MiB unless told --shm-size).
std::string dev_shm_state() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0)
    return fmt::format("/dev/shm is not usable here ({})", errno_text());
  constexpr double kMiB = 1 << 20;
  return fmt::format("/dev/shm holds {:.1f} MiB, {:.1f} MiB of it free{}",
                     static_cast<double>(fs.f_blocks) * fs.f_frsize / kMiB,
                     static_cast<double>(fs.f_bavail) * fs.f_frsize / kMiB,
                     (fs.f_flag & ST_RDONLY) != 0 ? ", and is mounted read-only" : "");
}

bool creator_alive(const Stamp& stamp) {
  if (stamp.creator_pid <= 0) return false;
  if (::kill(static_cast<pid_t>(stamp.creator_pid), 0) != 0 && errno == ESRCH) return false;
  const auto start = process_start_time(stamp.creator_pid);
  return start && *start == stamp.creator_start;
}

// True when the segment file `name` (under /dev/shm) was left by a process
// that is gone.
bool is_stale(const std::string& file) {
  const int fd = ::open(("/dev/shm/" + file).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  Stamp stamp{};
  const ssize_t got = ::pread(fd, &stamp, sizeof stamp, 0);
  struct stat info {};
  const bool have_info = ::fstat(fd, &info) == 0;
  ::close(fd);
  if (got == static_cast<ssize_t>(sizeof stamp) && std::memcmp(stamp.magic, kMagic, 8) == 0) {
    return !creator_alive(stamp);
  }
  return have_info && ::time(nullptr) - info.st_mtime > kUnstampedGraceSeconds;
}

void check_name(const std::string& name) {
  // Compared in place: building "/" + prefix tripped a false -Wrestrict in GCC 12.
  const std::string prefix = segment_prefix();
  const bool ok = name.size() > prefix.size() && name[0] == '/' &&
                  name.compare(1, prefix.size(), prefix) == 0 &&
                  name.find('/', 1) == std::string::npos;
  LOCKSTEP_CHECK(ok, "shm segment name '{}' must look like '/{}<rest>' with no further '/'", name,
                 prefix);
}

void* map(int fd, size_t total, const std::string& name) {
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  LOCKSTEP_CHECK(p != MAP_FAILED, "could not map shm segment {} ({} bytes): {}", name, total,
                 errno_text());
  return p;
}

}  // namespace

std::string segment_prefix() { return fmt::format("lockstep-{}-", ::getuid()); }

size_t remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string prefix = segment_prefix();
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.rfind(prefix, 0) == 0 && is_stale(file)) stale.push_back(file);
  }
  ::closedir(dir);
  size_t removed = 0;
  for (const auto& file : stale) removed += ::shm_unlink(("/" + file).c_str()) == 0 ? 1 : 0;
  return removed;
}

Segment Segment::create(const std::string& name, size_t bytes) {
  check_name(name);
  remove_stale_segments();
  const size_t total = kStampBytes + bytes;
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST && is_stale(name.substr(1))) {
    ::shm_unlink(name.c_str());  // a crashed job's segment under the same name
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    const std::string why = errno_text();
    throw Error(fmt::format("could not create shm segment {}: {}{}", name, why,
                            errno == EEXIST ? std::string(" (a live process holds it)")
                                            : "; " + dev_shm_state()));
  }
  // Reserve the pages now: a full /dev/shm fails here with a message instead
  // of a SIGBUS on first touch later.
  const int reserve = ::posix_fallocate(fd, 0, static_cast<off_t>(total));
  if (reserve != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw Error(fmt::format(
        "could not reserve {:.1f} MiB in /dev/shm for shm segment {}: {}; {}: free space "
        "there (in a container: raise --shm-size, e.g. docker run --shm-size=1g)",
        static_cast<double>(total) / (1 << 20), name, std::strerror(reserve), dev_shm_state()));
  }
  void* p = nullptr;
  try {
    p = map(fd, total, name);
  } catch (...) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw;
  }
  ::close(fd);
  Stamp stamp{};
  std::memcpy(stamp.magic, kMagic, 8);
  stamp.creator_pid = ::getpid();
  stamp.creator_start = this_process().start_time;
  std::memcpy(p, &stamp, sizeof stamp);
  Segment s;
  s.name_ = name;
  s.data_ = static_cast<char*>(p) + kStampBytes;
  s.size_ = bytes;
  s.linked_ = true;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  check_name(name);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  LOCKSTEP_CHECK(fd >= 0,
                 "could not open shm segment {}: {}; the shm backend needs every rank of the group "
                 "on one node sharing /dev/shm (across nodes use the default backend, which "
                 "combines shm with gloo)",
                 name, errno_text());
  struct stat info {};
  const bool sized = ::fstat(fd, &info) == 0 && static_cast<size_t>(info.st_size) >= kStampBytes + bytes;
  if (!sized) {
    ::close(fd);
    throw Error(fmt::format("shm segment {} holds {} bytes, fewer than the {} expected", name,
                            static_cast<long long>(info.st_size), kStampBytes + bytes));
  }
  void* p = nullptr;
  try {
    p = map(fd, kStampBytes + bytes, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const bool stamped = std::memcmp(p, kMagic, 8) == 0;
  Segment s;
  s.name_ = name;
  s.data_ = static_cast<char*>(p) + kStampBytes;
  s.size_ = bytes;
  LOCKSTEP_CHECK(stamped, "shm segment {} is not a lockstep segment (no stamp)", name);
  return s;
}

Segment::Segment(Segment&& other) noexcept { *this = std::move(other); }

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

Segment::~Segment() { reset(); }

void Segment::reset() {
  if (linked_) ::shm_unlink(name_.c_str());
  if (data_ != nullptr) ::munmap(static_cast<char*>(data_) - kStampBytes, kStampBytes + size_);
  data_ = nullptr;
  linked_ = false;
}

void Segment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

}  // namespace lockstep::collectives::shm
