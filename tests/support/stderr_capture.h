// Redirects this process's standard error (where the library logs and warns)
// to a file while alive, for tests of what it says there.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>

namespace lockstep::testing {

class StderrCapture {
 public:
  StderrCapture() {
    char path[] = "/tmp/lockstep-stderr-XXXXXX";
    const int fd = ::mkstemp(path);
    REQUIRE(fd >= 0);
    path_ = path;
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() {
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    ::unlink(path_.c_str());
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  // What was written so far.
  std::string text() const {
    std::fflush(stderr);
    std::ifstream in(path_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

 private:
  std::string path_;
  int saved_ = -1;
};

}  // namespace lockstep::testing
