#include "lockstep/runtime/liveness.h"

#include <sys/socket.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "lockstep/runtime/env.h"

namespace lockstep::runtime {
namespace {

std::atomic<int> busy_scopes{0};
// Held while a beat is sent, so that no beat follows the last one, 'L'.
std::mutex send_mutex;
bool left = false;
int beat_fd = -1;
std::atomic<uint64_t> busy_entries{0};  // so a scope shorter than a beat still counts

int64_t process_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

void beat_forever(int fd, std::chrono::milliseconds interval) {
  // 1% of the interval: the beat's own work is a few microseconds.
  const int64_t busy_cpu_ns = std::chrono::nanoseconds(interval).count() / 100;
  int64_t cpu = process_cpu_ns();
  uint64_t entries = busy_entries.load();
  // The first beat at once: from here on the launcher watches this rank.
  for (bool first = true;; first = false) {
    if (!first) std::this_thread::sleep_for(interval);
    const int64_t now_cpu = process_cpu_ns();
    const uint64_t now_entries = busy_entries.load();
    const bool progress = first || busy_scopes.load() > 0 || now_entries != entries ||
                          now_cpu - cpu >= busy_cpu_ns;
    cpu = now_cpu;
    entries = now_entries;
    const char beat = progress ? 'P' : 'I';
    const std::lock_guard lock(send_mutex);
    if (left) return;
    // Never SIGPIPE, never block: a launcher that is gone or slow to read
    // loses beats, not the rank.
    if (::send(fd, &beat, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        errno != EINTR)
      return;
  }
}

// At exit: the last beat says this process is leaving, so that the launcher
// stops expecting beats while the rank's process (a wrapper script running
// more after this program) goes on.
void send_leaving() {
  const std::lock_guard lock(send_mutex);
  if (left) return;
  left = true;
  const char beat = 'L';
  // Lost only when the launcher has left a whole queue of beats unread.
  (void)::send(beat_fd, &beat, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace

BusyScope::BusyScope() {
  busy_scopes.fetch_add(1);
  busy_entries.fetch_add(1);
}

BusyScope::~BusyScope() { busy_scopes.fetch_sub(1); }

void start_heartbeats() {
  static std::once_flag once;
  std::call_once(once, [] {
    const auto [fd, interval] = read_heartbeat_env();
    if (fd < 0) return;
    // A program this rank starts (a shell, a helper) must not beat for it.
    ::unsetenv("LOCKSTEP_HEARTBEAT_FD");
    beat_fd = fd;
    std::atexit(send_leaving);
    std::thread(beat_forever, fd, interval).detach();
  });
}

}  // namespace lockstep::runtime
