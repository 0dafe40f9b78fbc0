// Grad mode: whether ops record history. Thread-local, on by default.
#pragma once

namespace lockstep::runtime {

bool grad_enabled();
void set_grad_enabled(bool on);

// Scope in which ops record no history (like torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace lockstep::runtime
