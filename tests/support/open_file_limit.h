// Lowers this process's open-file limits (RLIMIT_NOFILE) for a test of what
// runs out of descriptors: call it in a forked child (forked_child.h), since
// the limits are the process's and a hard limit cannot be raised again.
#pragma once

#include <sys/resource.h>

#include <stdexcept>

#include "lockstep/runtime/open_files.h"

namespace lockstep::testing {

// The soft limit leaves room for `room` more descriptors than are open now,
// the hard one for `hard_room` more (-1: the hard limit as it is).
inline void limit_open_files(long room, long hard_room = -1) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) throw std::runtime_error("getrlimit failed");
  const long open = runtime::open_descriptors();
  if (open < 0) throw std::runtime_error("/proc/self/fd cannot be read");
  limit.rlim_cur = static_cast<rlim_t>(open + room);
  if (hard_room >= 0) limit.rlim_max = static_cast<rlim_t>(open + hard_room);
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) throw std::runtime_error("setrlimit failed");
}

}  // namespace lockstep::testing
