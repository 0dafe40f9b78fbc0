// A function run when its guard is destroyed, for work that must happen
// however a backward pass ends: its callbacks run, or the engine drops them
// (an error, a pass abandoned), and the guard they hold is destroyed either way.
#pragma once

#include <functional>
#include <utility>

namespace lockstep::nn::detail {

// Runs its function when destroyed, unless disarmed first; never throws.
class DropGuard {
 public:
  explicit DropGuard(std::function<void()> fn) : fn_(std::move(fn)) {}
  ~DropGuard() {
    if (fn_) fn_();
  }
  DropGuard(const DropGuard&) = delete;
  DropGuard& operator=(const DropGuard&) = delete;
  void disarm() { fn_ = nullptr; }

 private:
  std::function<void()> fn_;
};

}  // namespace lockstep::nn::detail
