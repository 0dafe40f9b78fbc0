// IDX reader under an address-space limit: a file whose header claims far
// more data than it holds is reported as short, not as out of memory.
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "data_test_util.h"
#include "lockstep/runtime/data/idx.h"
#include "support/skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

namespace {

// A sanitizer's shadow memory does not fit under a tight address-space limit.
std::string sanitizer_skip_reason() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "an address-space limit and a sanitizer do not mix";
#else
  return {};
#endif
}

// The error read_idx(path) throws in a child process whose address space may
// grow by 64 MiB only.
std::string error_with_little_memory(const std::string& path) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const auto used = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    const rlimit limit{used + (rlim_t{64} << 20), used + (rlim_t{64} << 20)};
    std::string message = "no error";
    if (pages <= 0 || ::setrlimit(RLIMIT_AS, &limit) != 0) message = "cannot set the limit";
    else message = error_of([&] { read_idx(path); });
    const ssize_t wrote = ::write(fds[1], message.data(), message.size());
    ::_exit(wrote == static_cast<ssize_t>(message.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string message;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    message.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  return message;
}

}  // namespace

TEST_CASE("read_idx: a header claiming a GiB over a few bytes is short data, not out of memory",
          "[data][idx]") {
  LOCKSTEP_SKIP_IF(sanitizer_skip_reason());
  const bool gz = GENERATE(false, true);
  INFO((gz ? "gzip" : "plain"));
  TempDir dir;
  const std::string path = dir.file("f.idx");
  // 1 GiB claimed (under the default limit of 4 GiB), 10 bytes held.
  const Bytes bytes = idx_file(0x08, {1024, 1024, 1024}, Bytes(10, 7));
  write_file(path, gz ? gzip(bytes) : bytes);
  const std::string message = error_with_little_memory(path);
  CHECK_THAT(message, Contains("short data") && Contains("need 1073741824 bytes") &&
                          Contains("got 10") && !Contains("out of memory"));
}
