// The process's umask set for a scope (a test of the modes files get), and
// restored when it ends, however the test leaves it.
#pragma once

#include <sys/stat.h>

namespace lockstep::testing {

class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }
  ScopedUmask(const ScopedUmask&) = delete;
  ScopedUmask& operator=(const ScopedUmask&) = delete;

 private:
  mode_t old_;
};

}  // namespace lockstep::testing
