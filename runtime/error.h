// lockstep::Error and the checking macros every library error goes through.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace lockstep {

// Base of every exception lockstep throws. The message says what failed and,
// where it can, what to do about it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace lockstep

// Throws lockstep::Error with a fmt-formatted message when `cond` is false.
// For conditions caused by the caller's input: the message must say what was
// wrong and what to do.
#define LOCKSTEP_CHECK(cond, ...)                                  \
  do {                                                             \
    if (!(cond)) throw ::lockstep::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

// For broken internal invariants: adds file:line.
#define LOCKSTEP_ASSERT(cond)                                                   \
  do {                                                                          \
    if (!(cond))                                                                \
      throw ::lockstep::Error(fmt::format("internal error at {}:{}: {} failed", \
                                          __FILE__, __LINE__, #cond));          \
  } while (0)
