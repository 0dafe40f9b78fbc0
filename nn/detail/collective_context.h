// Says which layer's collective failed, and why it was issued: a timeout or
// mismatch inside a module's forward otherwise names only the collective
// ("broadcast #11 timed out"), not the DDP or SyncBatchNorm call behind it.
#pragma once

#include <string>
#include <utility>

#include "lockstep/collectives/work.h"

namespace lockstep::nn::detail {

// Runs `issue` (which starts and waits for a collective). A CollectiveError
// it throws is thrown again as the same type (a CollectiveMismatch stays
// one), its message after `context()` and before `advice()`: both are
// called only then, so building them costs nothing on the normal path.
template <class Issue, class Context, class Advice>
void with_collective_context(Issue&& issue, Context&& context, Advice&& advice) {
  try {
    std::forward<Issue>(issue)();
  } catch (const collectives::CollectiveMismatch& e) {
    throw collectives::CollectiveMismatch(context() + ": " + e.what() + ". " + advice());
  } catch (const collectives::CollectiveError& e) {
    throw collectives::CollectiveError(context() + ": " + e.what() + ". " + advice());
  }
}

}  // namespace lockstep::nn::detail
