#include "lockstep/runtime/open_files.h"

#include <dirent.h>
#include <sys/resource.h>

#include <mutex>

#include <fmt/format.h>

namespace lockstep::runtime {
namespace {

long limit_value(rlim_t value) { return value == RLIM_INFINITY ? -1 : static_cast<long>(value); }

}  // namespace

long open_descriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  long open = 0;
  for (const dirent* e = ::readdir(dir); e != nullptr; e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++open;
  }
  ::closedir(dir);
  return open - 1;  // the listing's own
}

OpenFileRoom make_room_for_descriptors(long more) {
  // One at a time: two groups made at once on two threads must not undo each
  // other's raise.
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  OpenFileRoom room;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return room;
  room.soft = limit_value(limit.rlim_cur);
  room.hard = limit_value(limit.rlim_max);
  room.open = open_descriptors();
  if (room.open < 0) return room;
  const auto needed = static_cast<rlim_t>(room.open + more);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= needed) return room;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed) {
    room.enough = false;
    return room;
  }
  // As far as the hard limit allows, as lockstep-run raises its own: what
  // is counted now leaves out what other threads are about to open.
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? needed : limit.rlim_max;
  room.enough = ::setrlimit(RLIMIT_NOFILE, &limit) == 0;
  if (room.enough) room.soft = limit_value(limit.rlim_cur);
  return room;
}

std::string room_shortfall(const OpenFileRoom& room) {
  return fmt::format(
      "this process has {} open and may open at most {} (its hard limit, ulimit -Hn): raise the "
      "limit (ulimit -Hn, or nofile in /etc/security/limits.conf)",
      room.open, room.hard);
}

}  // namespace lockstep::runtime
