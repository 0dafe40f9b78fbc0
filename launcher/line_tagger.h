// --tag-output: prefixes every complete line of a stream with "[rank N] ".
// Partial lines wait for their end, so lines from different ranks never
// interleave mid-line. A line ends at '\n', or at a '\r' not followed by
// one: a progress bar that redraws its line gets the prefix on every redraw,
// which a terminal shows in place ("\r\n" is one end). A partial line that
// reaches kMaxPending bytes is passed on as it is, ended with a newline, so
// output that never ends its line is neither held back nor held in memory.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep::launcher {

class LineTagger {
 public:
  static constexpr size_t kMaxPending = 64 * 1024;

  explicit LineTagger(std::string prefix) : prefix_(std::move(prefix)) {}

  // The complete lines in `data` (and the pending partial line before it),
  // each prefixed; keeps any trailing partial line for later.
  std::string feed(std::string_view data);
  // The pending partial line, prefixed and ended with a newline; empty if none.
  std::string finish();

 private:
  std::string prefix_;
  std::string pending_;
  bool after_cr_ = false;  // the last line ended at a '\r' that ended the data fed
};

}  // namespace lockstep::launcher
