// Runs a call in a child forked now, as a program's own data worker would,
// and returns what it threw.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "support/test_util.h"

namespace lockstep::testing {

// The message of what `call` threw in the child, through a pipe
// ("<no exception>" if it ran, "<hung>" if the child had not ended within
// 10 s, when it is killed).
template <class Call>
std::string error_in_forked_child(Call&& call) {
  using Clock = std::chrono::steady_clock;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    const std::string error = error_of(call);
    (void)!::write(fds[1], error.data(), error.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  int status = 0;
  const auto start = Clock::now();
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (Clock::now() - start > std::chrono::seconds(10)) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      ::close(fds[0]);
      return "<hung>";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string error;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) error.append(buffer, n);
  ::close(fds[0]);
  return error;
}

}  // namespace lockstep::testing
