// The ranks of a job that exited while others still ran, as the process that
// started them (lockstep-run, collectives::spawn) writes them down in the
// job's store. A rank that returns before joining its group leaves the others
// waiting for it; reading this, they fail at once naming it instead of
// waiting out the timeout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/distributed/store/store.h"
#include "lockstep/distributed/store/tcp_store.h"

namespace lockstep::distributed {

// The prefix of the keys the ranks of attempt `restart_count` use in the
// launcher's store (LOCKSTEP_RESTART_COUNT; see launch_env.h): "" for the
// first, else "restart-N", clear of the keys earlier attempts left there.
std::string attempt_prefix(int restart_count);
// Whether `key` of the launcher's store is one the ranks of attempt
// `restart_count` wrote: under its prefix, or for the first attempt under
// none (neither a later attempt's nor the launchers' own "lockstep-run/...").
bool is_attempt_key(const std::string& key, int restart_count);

struct ExitedRank {
  int rank = 0;
  std::string how;  // "exited with code 0"
};

// Records that `rank` ended. `store` is the one the ranks see (the attempt's
// prefix applied).
void record_exited_rank(Store& store, const ExitedRank& exited);

// Every rank recorded so far, in the order they ended: one store round trip.
std::vector<ExitedRank> exited_ranks(Store& store);

// What a launcher records with: a client of the job's store, connected at the
// first record (2 s to connect and to answer). Never throws: with no store to
// tell, nobody waits on it.
class ExitRecorder {
 public:
  explicit ExitRecorder(TcpStoreOptions client);
  // Under the prefix of attempt `restart_count` (attempt_prefix).
  void record(int restart_count, const ExitedRank& exited) noexcept;

 private:
  TcpStoreOptions client_;
  std::shared_ptr<Store> store_;
};

}  // namespace lockstep::distributed
