// Why a group can no longer be used, once something failed or timed out.
// Shared (by shared_ptr) with the Works' timeout callbacks, which may outlive
// the group; the first reason set wins.
#pragma once

#include <mutex>
#include <string>

namespace lockstep::collectives {

class AbortState {
 public:
  void set(std::string reason) {
    std::lock_guard lock(mutex_);
    if (reason_.empty()) reason_ = std::move(reason);
  }
  std::string reason() {
    std::lock_guard lock(mutex_);
    return reason_;
  }

 private:
  std::mutex mutex_;
  std::string reason_;
};

}  // namespace lockstep::collectives
