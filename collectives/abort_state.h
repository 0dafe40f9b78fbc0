// Why a group can no longer be used, once something failed or timed out.
// Shared (by shared_ptr) with the Works' timeout callbacks, which may outlive
// the group; the first reason set wins.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace lockstep::collectives {

class AbortState {
 public:
  // True when this call set the reason (it was the first).
  bool set(std::string reason) {
    std::lock_guard lock(mutex_);
    if (!reason_.empty() || reason.empty()) return false;
    reason_ = std::move(reason);
    is_set_.store(true, std::memory_order_release);
    return true;
  }
  // Cheap, for every call's check: reason() is non-empty once this is true.
  bool is_set() const { return is_set_.load(std::memory_order_acquire); }
  std::string reason() {
    std::lock_guard lock(mutex_);
    return reason_;
  }

 private:
  std::mutex mutex_;
  std::string reason_;
  std::atomic<bool> is_set_{false};
};

}  // namespace lockstep::collectives
