#include "lockstep/runtime/process_id.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace lockstep::runtime {
namespace {

std::atomic<pid_t> cached{0};

void refresh() { cached.store(::getpid(), std::memory_order_relaxed); }

}  // namespace

pid_t this_process_id() {
  // The handler is registered with the first call, before which no cached
  // value exists to go stale.
  static const bool registered = [] {
    refresh();
    return ::pthread_atfork(nullptr, nullptr, refresh) == 0;
  }();
  if (!registered) return ::getpid();
  return cached.load(std::memory_order_relaxed);
}

}  // namespace lockstep::runtime
