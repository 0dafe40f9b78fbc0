// --tag-output: prefixes every complete line of a stream with "[rank N] ".
// Partial lines wait for their newline, so lines from different ranks never
// interleave mid-line.
#pragma once

#include <string>
#include <string_view>

namespace lockstep::launcher {

class LineTagger {
 public:
  explicit LineTagger(std::string prefix) : prefix_(std::move(prefix)) {}

  // The complete lines in `data` (and the pending partial line before it),
  // each prefixed; keeps any trailing partial line for later.
  std::string feed(std::string_view data);
  // The pending partial line, prefixed and ended with a newline; empty if none.
  std::string finish();

 private:
  std::string prefix_;
  std::string pending_;
};

}  // namespace lockstep::launcher
