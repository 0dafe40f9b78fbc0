// The gloo backend's call check: before each collective, every rank sends
// its call's signature (call.h, 32 bytes) to every other rank and waits for
// theirs, on a slot of its own, before it enters gloo's algorithm. A rank
// must never enter a gloo collective that its peers entered as another one:
// gloo would mismatch message sizes and abort the process. All ranks see
// all signatures, so on a difference every rank throws the same
// CollectiveMismatch. For two ranks this costs one small message each way,
// sent at the same time.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/collectives/call.h"

namespace gloo {
class Context;
}

namespace lockstep::collectives::gloo_backend {

class GlooCallCheck {
 public:
  GlooCallCheck(std::shared_ptr<::gloo::Context> context, int rank, int size);
  ~GlooCallCheck();

  // Blocks until every rank's signature of `call` is in, then compares.
  // Throws CollectiveMismatch on a difference, DeadlineExceeded at
  // call.deadline naming the ranks whose signature did not come (gloo then
  // closes this rank's connections, so those waiting on it fail too).
  void check(const Call& call);
  // Thread-safe, for stall reports: the rank whose signature of the call
  // being checked is awaited now, with the last call it was seen in; "" when
  // none is being waited for.
  std::string waiting_on() const;
  // Thread-safe: the group was aborted on this rank. The check under way
  // stops waiting and throws at once, as does every later one.
  void abort();

 private:
  struct Exchange;
  // The ranks (only `only`, when >= 0) that have not sent, with the last
  // call each was seen in; mutex_ held.
  std::string missing_text(const Call& call, int only) const;

  // Declared first, destroyed last: failed checks' buffers (guarded by mutex_).
  std::vector<std::unique_ptr<Exchange>> graveyard_;
  std::shared_ptr<::gloo::Context> context_;
  int rank_;
  int size_;
  mutable std::mutex mutex_;
  bool checking_ = false;                 // guarded by mutex_
  bool aborted_ = false;                  // guarded by mutex_
  Exchange* waiting_ = nullptr;           // the check whose waits abort() ends; guarded by mutex_
  const Call* call_ = nullptr;            // the call being checked; guarded by mutex_
  int waiting_for_ = -1;                  // the peer awaited now; guarded by mutex_
  std::vector<bool> arrived_;             // this call's, by rank; guarded by mutex_
  std::vector<CallSignature> last_seen_;  // by rank; seq 0: none yet; guarded by mutex_
};

}  // namespace lockstep::collectives::gloo_backend
